"""smartcache: a session and cache service for the front servers of a mobile bank.

This package is the client library (``from smartcache import Client``; the
names are those of :mod:`smartcache.client`). The rest of the house:

* :mod:`smartcache.wire`: the protocol both ends share (registry, codec, errors, keys, ports, topology);
* :mod:`smartcache.client`: the library front servers use;
* :mod:`smartcache.ops`: the storage cluster's operations (etcd, status, switchover, moves), shared by
  the CLI, the console and the service;
* :mod:`smartcache.cli`: ``smartcache-cli``, for operators: argument parsing and output over ops;
* :mod:`smartcache.console`: ``smartcache-console``, the operator's page;
* :mod:`smartcache.server`: the service itself (``smartcache``; needs ``pip install 'smartcache-bank[server]'``);
* :mod:`smartcache.settings` and :mod:`smartcache.supervision`: the one settings reader and the one
  process supervisor; :mod:`smartcache.extras`: what a command needs beyond the client library;
* :mod:`smartcache.devstack`: ``make run``'s stack, in a checkout only (not in the wheel).

docs/architecture.md says what each may import.
"""

from smartcache import client
from smartcache.client import *  # noqa: F403 - the public surface is the client's, listed in its __all__

__version__ = "0.1.0"
__all__ = ["__version__"]
__all__ += client.__all__
