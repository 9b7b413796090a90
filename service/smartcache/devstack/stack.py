"""Local processes for `make run`, the tests and the load tests: the stack's public surface.

The tests and the load tests start parts of the stack (Tarantool instances, children of their own,
free ports) and read make run's default ports from here; `make run` itself is makerun.py. Each name
lives in the module of its concept, and imports run one way, down to child.py and sockets.py:

    makerun ─► supervise, logtail, etcd, shards ─► plan, tarantool ─► child ─► sockets

and child.py and supervise.py stand on smartcache.supervision, the one supervisor.
"""

from smartcache.devstack.child import LUA_INIT, POLL_S, READY_TIMEOUT_S, ROOT, Child, NotReady, Stop, http_get_json
from smartcache.devstack.plan import DEFAULT_EVENTS_PORT, DEFAULT_LISTEN_PORT, DEFAULT_PORTS
from smartcache.devstack.sockets import ephemeral_range, free_port, listens, port_holders, port_is_free, tcp_states
from smartcache.devstack.tarantool import Tarantool, wait_cluster_formed
from smartcache.wire.ports import MAX_PORT_OFFSET

__all__ = [
    "DEFAULT_EVENTS_PORT",
    "DEFAULT_LISTEN_PORT",
    "DEFAULT_PORTS",
    "LUA_INIT",
    "MAX_PORT_OFFSET",
    "POLL_S",
    "READY_TIMEOUT_S",
    "ROOT",
    "Child",
    "NotReady",
    "Stop",
    "Tarantool",
    "ephemeral_range",
    "free_port",
    "http_get_json",
    "listens",
    "port_holders",
    "port_is_free",
    "tcp_states",
    "wait_cluster_formed",
]
