"""Coordination primitives (issue 17): counters, registers, sequences, semaphores, latches, queues.

What a cluster of front servers needs beside its sessions — Apache Ignite's
distributed data structures — built as Tarantool stored procedures, each
change one transaction (lua/smartcache/coordination.lua and its families),
replicated and failover-safe like sessions. Each message type is one
procedure call; this module only maps body fields to arguments, caps waits by
the message's lifetime, and counts.

Waiting types (SEMAPHORE_ACQUIRE, LATCH_AWAIT, QUEUE_TAKE) wait *inside*
Tarantool on a fiber.cond, so a release, a count-down or a put wakes them
(push: a lock hand-over between two service instances measured p50 0.46 ms,
p99 1.97 ms; polling from here would cost a round trip per look). Such a call holds its worker slot while it
waits: the registry gives each a bulkhead, and ``wait_ms`` is cut to the
lifetime left minus :data:`~smartcache.server.deadlines.HANDLER_WAIT_MARGIN_S`, so the handler answers its own
TIMEOUT instead of being cancelled at the deadline; storage also stops
waiting before the deadline it is given, so nothing is granted to a message
the service gave up on. A ``wait_ms`` outside 0 .. ``max_wait_ms`` (the
registry's ``[limits.wait_ms]``) is BAD_REQUEST before anything is cut: a
client asking for 60,001 ms or -1 learns it, instead of waiting what the
lifetime happens to allow.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from smartcache.server.deadlines import HANDLER_WAIT_MARGIN_S
from smartcache.server.handlers import Context, Handler, Request
from smartcache.server.metrics import label
from smartcache.wire import REGISTRY

PRIMITIVES = ("counter", "register", "sequence", "semaphore", "latch", "queue")
#: answers that tell a holder it lost what it held (a lease, a task's time-to-run), by type
LOST = {"SEMAPHORE_RENEW": "NOT_FOUND", "QUEUE_ACK": "CONFLICT", "QUEUE_RELEASE": "CONFLICT"}


_MAX_WAIT_MS = REGISTRY.max_wait_ms


def wait_problem(wait_ms: int | None) -> str | None:
    """Why ``wait_ms`` (an int or absent: the registry checked the type) is out of range, or None."""
    if wait_ms is not None and not 0 <= wait_ms <= _MAX_WAIT_MS:
        return f"wait_ms must be an integer in 0..{_MAX_WAIT_MS}"
    return None


def wait_budget_ms(req: Request, wait_ms: int | None) -> int:
    """The wait asked for (default 0), cut to the message's lifetime left minus the answer margin."""
    left_ms = int((req.deadline - asyncio.get_running_loop().time() - HANDLER_WAIT_MARGIN_S) * 1000)
    return max(0, min(wait_ms or 0, left_ms))


def _handler(type_name: str, procedure: str, fields: Sequence[str]) -> Handler:
    """A handler calling ``procedure`` with the body's ``fields`` in order (absent ones as nil)."""
    primitive = type_name.split("_", 1)[0].lower()
    keyed = any(f.name == "idempotency_key" for f in REGISTRY.types[type_name].request)
    waits = "wait_ms" in fields
    lost_status = LOST.get(type_name)
    outcomes: dict[str, Any] = {}

    async def handle(req: Request, ctx: Context) -> dict[str, Any]:
        b = req.body
        args = [b.get(f) for f in fields]
        key = req.idempotency_key if keyed else None
        m = ctx.metrics
        problem = wait_problem(b.get("wait_ms")) if waits else None
        if problem is not None:
            result: dict[str, Any] = {"status": "BAD_REQUEST", "message": problem}
        elif waits:
            args[fields.index("wait_ms")] = wait_budget_ms(req, b.get("wait_ms"))
            gauge = m.coordination_waiters.labels(primitive)
            gauge.inc()
            try:
                result = await ctx.storage.call(procedure, args, job=req.job, idempotency_key=key)
            finally:
                gauge.dec()
        else:
            result = await ctx.storage.call(procedure, args, job=req.job, idempotency_key=key)
        status = result["status"]
        counter = outcomes.get(status)
        if counter is None:
            counter = outcomes[status] = m.coordination_operations.labels(primitive, label(status))
        counter.inc()
        if status == lost_status:
            m.coordination_lost.labels(primitive).inc()
        return result

    handle.__name__ = procedure
    return handle


#: message type -> (procedure, body fields in the procedure's argument order)
ROUTES: dict[str, tuple[str, tuple[str, ...]]] = {
    "COUNTER_GET": ("counter_get", ("name",)),
    "COUNTER_ADD": ("counter_add", ("name", "delta", "min", "max", "ttl_ms")),
    "COUNTER_CAS": ("counter_cas", ("name", "expected", "value", "ttl_ms")),
    "REGISTER_GET": ("register_get", ("name",)),
    "REGISTER_CAS": ("register_cas", ("name", "value", "expected_rev", "expected_value", "ttl_ms")),
    "SEQUENCE_RESERVE": ("sequence_reserve", ("name", "count", "start")),
    "SEQUENCE_GET": ("sequence_get", ("name",)),
    "SEMAPHORE_ACQUIRE": ("semaphore_acquire", ("name", "permits", "holder", "lease_ms", "wait_ms")),
    "SEMAPHORE_RELEASE": ("semaphore_release", ("name", "holder")),
    "SEMAPHORE_RENEW": ("semaphore_renew", ("name", "holder", "lease_ms")),
    "SEMAPHORE_GET": ("semaphore_get", ("name",)),
    "LATCH_CREATE": ("latch_create", ("name", "count", "ttl_ms")),
    "LATCH_COUNT_DOWN": ("latch_count_down", ("name", "n")),
    "LATCH_AWAIT": ("latch_await", ("name", "wait_ms")),
    "LATCH_GET": ("latch_get", ("name",)),
    "QUEUE_PUT": ("queue_put", ("name", "payload", "priority", "delay_ms", "ttl_ms")),
    "QUEUE_TAKE": ("queue_take", ("name", "wait_ms", "ttr_ms")),
    "QUEUE_ACK": ("queue_ack", ("name", "task_id", "attempt")),
    "QUEUE_RELEASE": ("queue_release", ("name", "task_id", "attempt", "delay_ms")),
    "QUEUE_STATS": ("queue_stats", ("name",)),
}

HANDLERS: dict[str, Handler] = {
    type_name: _handler(type_name, procedure, fields) for type_name, (procedure, fields) in ROUTES.items()
}
