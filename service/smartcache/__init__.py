"""smartcache: a session and cache service for the front servers of a mobile bank.

This package is the client library (``from smartcache import Client``; the
names are those of :mod:`smartcache.client`). The rest of the house:

* :mod:`smartcache.wire`: the protocol both ends share (registry, codec, errors, keys, ports);
* :mod:`smartcache.client`: the library front servers use;
* :mod:`smartcache.cli`: ``smartcache-cli``, for operators;
* :mod:`smartcache.server`: the service itself (``smartcache``; needs ``pip install 'smartcache-bank[server]'``).
"""

from smartcache import client
from smartcache.client import *  # noqa: F403 - the public surface is the client's, listed in its __all__

__version__ = "0.1.0"
__all__ = ["__version__"]
__all__ += client.__all__
