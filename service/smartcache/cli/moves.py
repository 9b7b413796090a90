"""Moved: the move engine is :mod:`smartcache.ops.moves` (issue 36). This name stays only while code outside the CLI
still imports it (loadtest/resharding.py, the fault suite's tests/faults/moving.py); import smartcache.ops.moves
instead.
"""

from smartcache.ops.moves import *  # noqa: F403 - the same names, listed in ops.moves' __all__
from smartcache.ops.moves import __all__  # noqa: F401 - the shim's names are the library's
