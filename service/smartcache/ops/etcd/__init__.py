"""The one etcd v3 client in Python: the JSON gateway (``/v3/*``) of etcd 3.4, two faces on one core.

* :mod:`.core`: the calls as data (range, create, compare-and-swap, status, health, member
  list), base64 of keys and values, reading the answers, the walk over the endpoints (the one
  that answered last first, each once per call) and :class:`EtcdUnavailable`;
* :mod:`.sync`: the blocking face, the standard library only (urllib): the CLI, the move
  engine, the console, make run's stack;
* :mod:`.aio`: the asyncio face, on aiohttp (the server extra): the service's discovery. Not
  imported here, so that this package runs where only the client is installed;
* :mod:`.members`: the members' health as ``cluster status`` shows it.

Lua keeps its own (``lua/smartcache/etcd.lua``): the instances elect and hold their lease
from inside Tarantool.

Our own rather than a library: etcd3gw (PyPI, OpenStack) serves the v3 gateway well but is
blocking only (requests), asks one host per client (no walk over the members) and would add
requests to what the client library pulls in; async-etcd3gw was last released in 2023;
aetcd and etcd3 speak gRPC, not the gateway. The whole of ours is the four modules here.
"""

from smartcache.ops.etcd.core import ASK_TIMEOUT_S, Call, EtcdUnavailable, KeyValue, endpoints_of
from smartcache.ops.etcd.members import ask_member, member_list, status
from smartcache.ops.etcd.sync import Etcd, ask_one, create, put_if, read, read_revision, request

__all__ = [
    "ASK_TIMEOUT_S",
    "Call",
    "Etcd",
    "EtcdUnavailable",
    "KeyValue",
    "ask_member",
    "ask_one",
    "create",
    "endpoints_of",
    "member_list",
    "put_if",
    "read",
    "read_revision",
    "request",
    "status",
]
