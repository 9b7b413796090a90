"""EVENT_PUBLISH and EVENTS_READ (issue 16): the event log as message types.

EVENT_PUBLISH appends an application event (topic ``app.<name>``) in one
transaction, once per idempotency key. EVENTS_READ reads the log from a cursor:
a subscriber catching up (service/subscriber.py), an operator tailing it
(``smartcache-cli events tail``), or a long-poller. With nothing to read it
waits *inside* Tarantool on a fiber.cond woken by the next commit, so it holds
its worker slot while it waits: its bulkhead (``max_busy_percent`` 10, the
registry) keeps waiting readers to a tenth of the slots, and ``wait_ms`` is cut
to the message's lifetime left (as coordination waits are), so a fuzzed or
careless wait cannot outlive its message. Front servers are meant to follow
the stream on the PUB socket (service/events.py) and read only to catch up,
which never waits.
"""

from __future__ import annotations

from typing import Any

from service.coordination import wait_budget_ms
from service.handlers import Context, Handler, Request


async def event_publish(req: Request, ctx: Context) -> dict[str, Any]:
    b = req.body
    return await ctx.storage.call(
        "event_publish", [b["topic"], b.get("key"), b.get("payload")], idempotency_key=req.idempotency_key
    )


async def events_read(req: Request, ctx: Context) -> dict[str, Any]:
    b = req.body
    wait_ms = wait_budget_ms(req, b.get("wait_ms"))
    args = [b.get("after_seq"), b.get("topics"), b.get("limit"), wait_ms]
    if not wait_ms:
        return await ctx.storage.call("events_read", args)
    gauge = ctx.metrics.events_readers_waiting
    gauge.inc()
    try:
        return await ctx.storage.call("events_read", args)
    finally:
        gauge.dec()


HANDLERS: dict[str, Handler] = {
    "EVENT_PUBLISH": event_publish,
    "EVENTS_READ": events_read,
}
