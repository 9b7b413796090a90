"""INFO: the service's own state, its storage instances as one worker sees them, and the leader's statistics."""

from __future__ import annotations

from typing import Any

from smartcache.server.handlers import Context, Handler, Request, plain
from smartcache.wire.errors import StorageError


async def _stats(ctx: Context, req: Request, shard: str | None) -> dict[str, Any]:
    """One leader's sc.stats (shard None: the one replica set's), or why it could not be read."""
    try:
        if shard is None:
            stats = await ctx.storage.call("stats", [], job=req.job)
        else:
            stats = await ctx.storage.call_on(shard, "stats", [], job=req.job)
        stats.pop("status", None)
    except StorageError as e:
        stats = {"error": str(e)}
    return stats


async def info(req: Request, ctx: Context) -> dict[str, Any]:
    names = ctx.storage.shard_names
    if names is None:
        stats = await _stats(ctx, req, None)
    else:  # a sharded cluster: each shard's leader's (PROTOCOL.md 6, INFO)
        stats = {"shards": {name: await _stats(ctx, req, name) for name in names}}
    return {"status": "OK", **ctx.introspect(), "storage": ctx.storage.describe(), "storage_stats": plain(stats)}


HANDLERS: dict[str, Handler] = {"INFO": info}
