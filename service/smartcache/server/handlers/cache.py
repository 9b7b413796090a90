"""The per-session cache: data between requests under any key (CACHE_*).

A key lives in one session (or none, for shared data), with a data type and a
TTL; deleting the session deletes its keys (lua/smartcache/sessions/cache.lua).
"""

from __future__ import annotations

from typing import Any

from smartcache.server.handlers import Context, Handler, Request


async def cache_put(req: Request, ctx: Context) -> dict[str, Any]:
    b = req.body
    return await ctx.storage.call(
        "cache_put",
        [req.session, b["key"], b.get("data_type"), b.get("ttl_s"), b["data"]],
        job=req.job,
        idempotency_key=req.idempotency_key,
    )


async def cache_get(req: Request, ctx: Context) -> dict[str, Any]:
    return await ctx.storage.call("cache_get", [req.session, req.body["key"]], job=req.job)


async def cache_delete(req: Request, ctx: Context) -> dict[str, Any]:
    return await ctx.storage.call(
        "cache_delete", [req.session, req.body["key"]], job=req.job, idempotency_key=req.idempotency_key
    )


HANDLERS: dict[str, Handler] = {
    "CACHE_PUT": cache_put,
    "CACHE_GET": cache_get,
    "CACHE_DELETE": cache_delete,
}
