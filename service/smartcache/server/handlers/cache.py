"""The per-session cache: data between requests under any key (CACHE_*).

A key lives in one session (or none, for shared data), with a data type and a
TTL; deleting the session deletes its keys (lua/smartcache/sessions/cache.lua).
A session's entries are keyed by its stored id (``req.session``) and checked
against its binding; a rotated session's old id reads them for its grace window.
"""

from __future__ import annotations

from typing import Any

from smartcache.server.handlers import Context, Handler, Request
from smartcache.server.handlers.sessioncalls import binding, session_call


async def _call(req: Request, ctx: Context, procedure: str, args: list[Any]) -> dict[str, Any]:
    """A session's entries through :func:`session_call` (the lazy rekey); the global namespace's directly."""
    if req.session:
        return await session_call(req, ctx, procedure, args)
    return await ctx.storage.call(procedure, args, job=req.job, idempotency_key=req.idempotency_key)


async def cache_put(req: Request, ctx: Context) -> dict[str, Any]:
    b = req.body
    return await _call(
        req, ctx, "cache_put", [req.session, b["key"], b.get("data_type"), b.get("ttl_s"), b["data"], binding(req)]
    )


async def cache_get(req: Request, ctx: Context) -> dict[str, Any]:
    return await _call(req, ctx, "cache_get", [req.session, req.body["key"], binding(req)])


async def cache_delete(req: Request, ctx: Context) -> dict[str, Any]:
    return await _call(req, ctx, "cache_delete", [req.session, req.body["key"], binding(req)])


HANDLERS: dict[str, Handler] = {
    "CACHE_PUT": cache_put,
    "CACHE_GET": cache_get,
    "CACHE_DELETE": cache_delete,
}
