"""EVENT_PUBLISH and EVENTS_READ (issue 16): the event log as message types.

EVENT_PUBLISH appends an application event (topic ``app.<name>``) in one
transaction, once per idempotency key. EVENTS_READ reads the log from a cursor:
a subscriber catching up (service/smartcache/client/subscriber.py), an operator tailing it
(``smartcache-cli events tail``), or a long-poller. With nothing to read it
waits *inside* Tarantool on a fiber.cond woken by the next commit, so it holds
its worker slot while it waits: its bulkhead (``max_busy_percent`` 10, the
registry) keeps waiting readers to a tenth of the slots, and ``wait_ms`` is cut
to the message's lifetime left (as coordination waits are), so a fuzzed or
careless wait cannot outlive its message (one outside 0 .. ``max_wait_ms`` is
BAD_REQUEST first, as coordination waits are). Front servers are meant to follow
the stream on the PUB socket (service/smartcache/server/publisher.py) and read only to catch up,
which never waits.
"""

from __future__ import annotations

from typing import Any

from smartcache.server.handlers import Context, Handler, Request
from smartcache.server.handlers.coordination import wait_budget_ms, wait_problem


async def event_publish(req: Request, ctx: Context) -> dict[str, Any]:
    b = req.body
    return await ctx.storage.call(
        "event_publish", [b["topic"], b.get("key"), b.get("payload")], job=req.job, idempotency_key=req.idempotency_key
    )


def shard_problem(shard: str | None, names: tuple[str, ...] | None) -> str | None:
    """Why EVENTS_READ's shard cannot be read here, or None."""
    if names is None:
        return "shard: this cluster is one replica set, not sharded (leave shard out)" if shard else None
    if shard and shard not in names:
        return f"shard must be one of the cluster's shards: {', '.join(names)}; not {shard!r}"
    return None


async def events_read(req: Request, ctx: Context) -> dict[str, Any]:
    b = req.body
    problem = wait_problem(b.get("wait_ms"))
    names = ctx.storage.shard_names
    problem = problem or shard_problem(b.get("shard"), names)
    if problem is not None:
        return {"status": "BAD_REQUEST", "message": problem}
    wait_ms = wait_budget_ms(req, b.get("wait_ms"))
    args = [b.get("after_seq"), b.get("topics"), b.get("limit"), wait_ms]
    # A sharded cluster has a log per shard (PROTOCOL.md 11): shard absent reads the first one.
    shard = (b.get("shard") or names[0]) if names is not None else ""
    gauge = ctx.metrics.events_readers_waiting
    if wait_ms:
        gauge.inc()
    try:
        r = await ctx.storage.call_on(shard, "events_read", args, job=req.job)
    finally:
        if wait_ms:
            gauge.dec()
    return r if names is None else {**r, "shard": shard, "shards": list(names)}


HANDLERS: dict[str, Handler] = {
    "EVENT_PUBLISH": event_publish,
    "EVENTS_READ": events_read,
}
