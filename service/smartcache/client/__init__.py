"""The client library for front servers: ``from smartcache import Client``.

Installs alone (distribution ``smartcache-bank``: pyzmq and msgpack, nothing of the
server). Two clients, one ZeroMQ DEALER socket each, many requests in flight:
:class:`Client` (blocking) and :class:`AsyncClient` (asyncio), with the same
typed calls (``session_create``, ``cache_get``...), coordination objects
(``lock``, ``counter``, ``ids``...), the event stream (``subscribe``) and a near cache
(``Client(..., near_cache=NearCache(...))``: session reads from memory, dropped by the stream).
Everything public is listed in ``__all__``; modules of this package are not an
interface of their own.
"""

from smartcache.client.base import DEFAULT_TIMEOUT_S, Reply, SessionId, session_bytes
from smartcache.client.clients import AsyncClient, Client
from smartcache.client.locks import AsyncLock, Lock
from smartcache.client.nearcache import NearCache
from smartcache.client.objects import AsyncIdGenerator, Counter, IdGenerator, Latch, Register, Task, TaskQueue
from smartcache.client.subscriber import Event, Subscription
from smartcache.wire.errors import (
    CoordinationError,
    CursorTooOld,
    LeaseLost,
    NotAcquired,
    RequestError,
    RequestTimeout,
    SmartcacheError,
)
from smartcache.wire.keys import CurveKeys
from smartcache.wire.status import Status, TransportError

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "AsyncClient",
    "AsyncIdGenerator",
    "AsyncLock",
    "Client",
    "CoordinationError",
    "Counter",
    "CursorTooOld",
    "CurveKeys",
    "Event",
    "IdGenerator",
    "Latch",
    "LeaseLost",
    "Lock",
    "NearCache",
    "NotAcquired",
    "Register",
    "Reply",
    "RequestError",
    "RequestTimeout",
    "SessionId",
    "SmartcacheError",
    "Status",
    "Subscription",
    "Task",
    "TaskQueue",
    "TransportError",
    "session_bytes",
]
