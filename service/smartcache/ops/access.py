"""How the Tarantool instances of a cluster are reached: held by the CLI, the console and the service's settler.

No connector here (the console's settings hold one before anything connects); the
connections are :mod:`smartcache.ops.instances`'.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: how long a connection, and by default one call, may take
CONNECT_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Access:
    """How to reach the instances: addresses and the service user's credentials."""

    addresses: Sequence[str]
    user: str
    password: str
    timeout_s: float = CONNECT_TIMEOUT_S
    #: etcd's client endpoints (empty: do not ask etcd)
    etcd: Sequence[str] = ()
    #: the cluster's name (SC_CLUSTER); None: the one the instances report
    cluster: str | None = None
