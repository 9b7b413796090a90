"""Business logic per message type: a body in, a stored procedure call, a result out.

Each handler gets a validated :class:`Request` (body fields checked against the
registry) and returns the procedure's result map, whose ``status`` is a status
name (and ``error`` when the body is an error object). Workers turn it into
the reply. Prewarm types live in service/prewarm.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from service.backend import Backend
from service.config import Settings
from service.errors import StorageError
from service.metrics import Metrics
from service.protocol import NO_SESSION, Header
from service.storage import Storage


def session_text(sid: bytes) -> str:
    """16 raw bytes as canonical UUID text ('' for no session)."""
    if sid == NO_SESSION:
        return ""
    h = sid.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@dataclass(slots=True)
class Request:
    header: Header
    body: dict[str, Any]
    #: loop time (monotonic seconds) at which the message's lifetime ends
    deadline: float
    #: set by a handler to answer with another session id (SESSION_CREATE)
    reply_session: bytes | None = field(default=None)

    @property
    def session(self) -> str:
        return session_text(self.header.session_id)

    @property
    def idempotency_key(self) -> str | None:
        key: str | None = self.body.get("idempotency_key")
        return key


@dataclass(slots=True)
class Context:
    """What a handler may use: its worker's storage connection and backend client, settings, metrics,
    and ``enqueue`` to put an internal message into the broker's queue."""

    storage: Storage
    backend: Backend
    settings: Settings
    metrics: Metrics
    enqueue: Callable[[str, dict[str, Any], bytes], None]
    #: unique per worker slot use: prewarm lease owner ids are built from it
    owner_prefix: str
    #: the service's own state for INFO (version, settings, queue, workers, counts)
    introspect: Callable[[], dict[str, Any]] = field(default=dict)


Handler = Callable[[Request, Context], Awaitable[dict[str, Any]]]


async def session_create(req: Request, ctx: Context) -> dict[str, Any]:
    """A zero header session id lets storage choose the UUID (so a repeat under an idempotency key
    has the same arguments and gets the same session)."""
    sid = req.session or None
    b = req.body
    result = await ctx.storage.call(
        "session_create",
        [sid, b["client_id"], b.get("version"), b.get("ttl_s"), b.get("data")],
        idempotency_key=req.idempotency_key,
    )
    created = result.pop("session_id", None)
    if created is not None:
        req.reply_session = bytes.fromhex(created.replace("-", ""))  # UUID text -> 16 bytes, without uuid.UUID
    return result


async def session_get(req: Request, ctx: Context) -> dict[str, Any]:
    return await ctx.storage.call("session_get", [req.session])


async def session_touch(req: Request, ctx: Context) -> dict[str, Any]:
    return await ctx.storage.call("session_touch", [req.session], idempotency_key=req.idempotency_key)


async def session_update(req: Request, ctx: Context) -> dict[str, Any]:
    b = req.body
    return await ctx.storage.call(
        "session_update",
        [req.session, b["data"], b.get("expected_rev"), b.get("version")],
        idempotency_key=req.idempotency_key,
    )


async def session_delete(req: Request, ctx: Context) -> dict[str, Any]:
    return await ctx.storage.call("session_delete", [req.session], idempotency_key=req.idempotency_key)


async def session_list(req: Request, ctx: Context) -> dict[str, Any]:
    result = await ctx.storage.call("session_list", [req.body["client_id"]])
    for s in result.get("sessions", ()):
        s["session_id"] = uuid.UUID(s["session_id"]).bytes  # wire form: 16 raw bytes
    return result


async def cache_put(req: Request, ctx: Context) -> dict[str, Any]:
    b = req.body
    return await ctx.storage.call(
        "cache_put",
        [req.session, b["key"], b.get("data_type"), b.get("ttl_s"), b["data"]],
        idempotency_key=req.idempotency_key,
    )


async def cache_get(req: Request, ctx: Context) -> dict[str, Any]:
    return await ctx.storage.call("cache_get", [req.session, req.body["key"]])


async def cache_delete(req: Request, ctx: Context) -> dict[str, Any]:
    return await ctx.storage.call("cache_delete", [req.session, req.body["key"]], idempotency_key=req.idempotency_key)


async def device_bind(req: Request, ctx: Context) -> dict[str, Any]:
    b = req.body
    return await ctx.storage.call("device_bind", [b["device_id"], b["client_id"]], idempotency_key=req.idempotency_key)


async def device_lookup(req: Request, ctx: Context) -> dict[str, Any]:
    return await ctx.storage.call("device_lookup", [req.body["device_id"]])


async def info(req: Request, ctx: Context) -> dict[str, Any]:
    """The service's state, its storage instances as this worker sees them, and the leader's statistics."""
    try:
        stats = await ctx.storage.call("stats", [])
        stats.pop("status", None)
    except StorageError as e:
        stats = {"error": str(e)}
    return {"status": "OK", **ctx.introspect(), "storage": ctx.storage.describe(), "storage_stats": plain(stats)}


def plain(value: Any) -> Any:
    """A value the wire can carry in a body: map keys as strings, tuples as lists."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


HANDLERS: dict[str, Handler] = {
    "INFO": info,
    "SESSION_CREATE": session_create,
    "SESSION_GET": session_get,
    "SESSION_TOUCH": session_touch,
    "SESSION_UPDATE": session_update,
    "SESSION_DELETE": session_delete,
    "SESSION_LIST": session_list,
    "CACHE_PUT": cache_put,
    "CACHE_GET": cache_get,
    "CACHE_DELETE": cache_delete,
    "DEVICE_BIND": device_bind,
    "DEVICE_LOOKUP": device_lookup,
}
