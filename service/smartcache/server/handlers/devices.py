"""Device bindings: which client a mobile device belongs to (DEVICE_*).

A login binds the device to its client; every later APP_START from that
device prewarms the client's products (:mod:`.prewarm`).
"""

from __future__ import annotations

from typing import Any

from smartcache.server.handlers import Context, Handler, Request


async def device_bind(req: Request, ctx: Context) -> dict[str, Any]:
    b = req.body
    return await ctx.storage.call(
        "device_bind", [b["device_id"], b["client_id"]], job=req.job, idempotency_key=req.idempotency_key
    )


async def device_lookup(req: Request, ctx: Context) -> dict[str, Any]:
    return await ctx.storage.call("device_lookup", [req.body["device_id"]], job=req.job)


HANDLERS: dict[str, Handler] = {
    "DEVICE_BIND": device_bind,
    "DEVICE_LOOKUP": device_lookup,
}
