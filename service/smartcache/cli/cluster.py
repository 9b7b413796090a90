"""Moved: the cluster's operations are :mod:`smartcache.ops.cluster` (issue 36). This name stays only while code
outside the CLI still imports it (make run's stack in smartcache.devstack, console/settings.py, loadtest/, the fault
suite in tests/faults); import smartcache.ops.cluster instead.
"""

from smartcache.ops.cluster import *  # noqa: F403 - the same names, listed in ops.cluster's __all__
from smartcache.ops.cluster import __all__  # noqa: F401 - the shim's names are the library's
