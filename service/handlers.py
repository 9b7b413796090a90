"""Business logic per message type: a body in, a stored procedure call, a result out.

Each handler gets a validated :class:`Request` (body fields checked against the
registry) and returns the procedure's result map, whose ``status`` is a status
name (and ``error`` when the body is an error object). Workers turn it into
the reply. Prewarm types live in service/prewarm.py.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from service.backend import Backend
from service.config import Settings
from service.metrics import Metrics
from service.protocol import NO_SESSION, Header
from service.storage import Storage


def session_text(sid: bytes) -> str:
    """16 raw bytes as canonical UUID text ('' for no session)."""
    if sid == NO_SESSION:
        return ""
    h = sid.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def new_session_id() -> bytes:
    """A random (version 4) UUID as 16 bytes; cheaper than uuid.uuid4().bytes."""
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    return bytes(b)


@dataclass(slots=True)
class Request:
    header: Header
    body: dict[str, Any]
    timeout_s: float
    #: set by a handler to answer with another session id (SESSION_CREATE)
    reply_session: bytes | None = field(default=None)

    @property
    def session(self) -> str:
        return session_text(self.header.session_id)


@dataclass(slots=True)
class Context:
    """What a handler may use: its worker's storage connection and backend client, settings, metrics,
    and ``enqueue`` to put an internal message into the broker's queue."""

    storage: Storage
    backend: Backend
    settings: Settings
    metrics: Metrics
    enqueue: Callable[[str, dict[str, Any]], None]
    #: unique per worker slot use: prewarm lease owner ids are built from it
    owner_prefix: str


Handler = Callable[[Request, Context], Awaitable[dict[str, Any]]]


async def session_create(req: Request, ctx: Context) -> dict[str, Any]:
    sid = req.header.session_id if req.header.session_id != NO_SESSION else new_session_id()
    req.reply_session = sid
    b = req.body
    return await ctx.storage.call(
        "session_create", [session_text(sid), b["client_id"], b.get("version"), b.get("ttl_s"), b.get("data")]
    )


async def session_get(req: Request, ctx: Context) -> dict[str, Any]:
    return await ctx.storage.call("session_get", [req.session])


async def session_touch(req: Request, ctx: Context) -> dict[str, Any]:
    return await ctx.storage.call("session_touch", [req.session])


async def session_update(req: Request, ctx: Context) -> dict[str, Any]:
    b = req.body
    return await ctx.storage.call("session_update", [req.session, b["data"], b.get("expected_rev"), b.get("version")])


async def session_delete(req: Request, ctx: Context) -> dict[str, Any]:
    return await ctx.storage.call("session_delete", [req.session])


async def session_list(req: Request, ctx: Context) -> dict[str, Any]:
    result = await ctx.storage.call("session_list", [req.body["client_id"]])
    for s in result.get("sessions", ()):
        s["session_id"] = uuid.UUID(s["session_id"]).bytes  # wire form: 16 raw bytes
    return result


async def cache_put(req: Request, ctx: Context) -> dict[str, Any]:
    b = req.body
    return await ctx.storage.call("cache_put", [req.session, b["key"], b.get("data_type"), b.get("ttl_s"), b["data"]])


async def cache_get(req: Request, ctx: Context) -> dict[str, Any]:
    return await ctx.storage.call("cache_get", [req.session, req.body["key"]])


async def cache_delete(req: Request, ctx: Context) -> dict[str, Any]:
    return await ctx.storage.call("cache_delete", [req.session, req.body["key"]])


async def device_bind(req: Request, ctx: Context) -> dict[str, Any]:
    return await ctx.storage.call("device_bind", [req.body["device_id"], req.body["client_id"]])


async def device_lookup(req: Request, ctx: Context) -> dict[str, Any]:
    return await ctx.storage.call("device_lookup", [req.body["device_id"]])


HANDLERS: dict[str, Handler] = {
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
