"""The smart part: prewarm client products before login, answer them from Tarantool after.

* APP_START(device_id): an unknown device does nothing (and is never
  answered); a bound one puts one internal PREWARM_FETCH per configured data
  type into the broker's queue, at the lowest priority.
* PREWARM_FETCH(client_id, data_type): ``prewarm_acquire`` in Tarantool —
  FRESH or BUSY (another instance is on it): skip; ACQUIRED: call the
  backend, then ``prewarm_complete`` (or ``prewarm_fail`` so the next asker
  can try).
* PRODUCTS_GET(client_id, data_type): FRESH: answer from Tarantool
  (source ``cache``); BUSY: ``prewarm_wait`` inside Tarantool until the record
  turns idle (source ``waited``); ACQUIRED (absent or stale): fetch now
  (source ``fetched``). Whatever the instance, concurrent askers cause one
  backend call.

Lease = the backend timeout with its retries plus a margin, so a crashed
instance never leaves a record stuck: its lease runs out and is taken over.

A lease this instance may hold is given back whatever ends the message: the
calls that settle it (``prewarm_complete``, ``prewarm_fail``) run in tasks of
their own, which the worker's deadline sweep cannot cancel (it stops only the
message's wait for them), and a message whose lifetime ends after its
``prewarm_acquire`` was sent releases the lease it may have been granted.
Issue 35: under load, short-lived PRODUCTS_GET were answered OUTCOME_UNKNOWN
with the lease granted in storage and never released; for the lease's 17 s
(the defaults) every asker of that key held a worker slot for its whole
lifetime, waiting in ``prewarm_wait``, and was answered TIMEOUT (9 of 150 keys
asked right after a 20,000-message run with 2-5 ms lifetimes).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import structlog

from smartcache.server.deadlines import HANDLER_WAIT_MARGIN_S
from smartcache.server.handlers import Context, Handler, Request
from smartcache.wire.errors import BackendError, OutcomeUnknown, StorageError

log = structlog.get_logger("prewarm")

_owner_ids = itertools.count(1)
ATTEMPTS = 2  # acquire, and once more if the holder we waited on failed


def _owner(ctx: Context) -> str:
    """Unique per fetch attempt, so two slots of one instance never share a lease."""
    return f"{ctx.owner_prefix}/{next(_owner_ids)}"


async def app_start(req: Request, ctx: Context) -> dict[str, Any]:
    found = await ctx.storage.call("device_lookup", [req.body["device_id"]], job=req.job)
    if found["status"] != "OK":
        return {"status": "NOT_FOUND"}  # unknown device: a cold start, nothing to do
    for data_type in ctx.settings.prewarm_types:
        body = {"client_id": found["client_id"], "data_type": data_type, "version": req.body.get("version")}
        ctx.enqueue("PREWARM_FETCH", body, req.header.session_id)
    ctx.metrics.prewarm.labels("started").inc(len(ctx.settings.prewarm_types))
    return {"status": "OK"}


async def _acquire(ctx: Context, req: Request, owner: str) -> dict[str, Any]:
    """Take the lease; the record notes which session (of which front version) asked for it.

    Storage may grant it although its answer never reaches us: the message's lifetime ended while the
    call was out (the deadline sweep), or the connection broke. The lease is then released in the
    background (``prewarm_fail`` of an owner that holds nothing changes nothing)."""
    client_id, data_type = req.body["client_id"], req.body["data_type"]
    lease, max_age = ctx.settings.lease_ms, ctx.settings.max_age_ms(data_type)
    sent = req.job.sent
    try:
        return await ctx.storage.call(
            "prewarm_acquire",
            [client_id, data_type, owner, lease, max_age, req.session, req.body.get("version")],
            job=req.job,
        )
    except (asyncio.CancelledError, OutcomeUnknown):
        if req.job.sent > sent:  # it reached storage: we may own the lease
            _settle_apart(ctx, "prewarm_fail", [client_id, data_type, owner])
        raise


async def _settle(ctx: Context, procedure: str, args: list[Any]) -> dict[str, Any] | None:
    """Complete or release a lease. Not bound to the message's deadline: fetched data is worth
    storing, and a lease left behind would make the next asker wait for it to run out."""
    try:
        return await ctx.storage.call(procedure, args, job=None)
    except StorageError as e:
        log.warning("prewarm_settle_failed", procedure=procedure, client_id=args[0], data_type=args[1], error=str(e))
        return None


_background: set[asyncio.Task[Any]] = set()


def _settle_apart(ctx: Context, procedure: str, args: list[Any]) -> asyncio.Task[dict[str, Any] | None]:
    """:func:`_settle` in a task of its own: a message may wait for it (``asyncio.shield``), but the deadline
    sweep that cancels the message never cancels the call, sent or still waiting for a leader."""
    task = asyncio.get_running_loop().create_task(_settle(ctx, procedure, args))
    _background.add(task)
    task.add_done_callback(_background.discard)
    return task


async def _fetch_and_store(ctx: Context, client_id: str, data_type: int, owner: str, deadline: float) -> Any:
    """Call the backend as the lease owner; complete on success, fail (release) on any failure."""
    try:
        data = await ctx.backend.fetch(client_id, data_type, deadline)
    except BackendError:
        await asyncio.shield(_settle_apart(ctx, "prewarm_fail", [client_id, data_type, owner]))
        raise
    except asyncio.CancelledError:  # our message's lifetime ended: release in the background
        _settle_apart(ctx, "prewarm_fail", [client_id, data_type, owner])
        raise
    done = await asyncio.shield(_settle_apart(ctx, "prewarm_complete", [client_id, data_type, owner, data]))
    if done is not None and done["status"] != "OK":  # our lease ran out and was taken over; the data is good
        log.warning("prewarm_lease_lost", client_id=client_id, data_type=data_type, status=done["status"])
    return data


async def prewarm_fetch(req: Request, ctx: Context) -> dict[str, Any]:
    client_id, data_type = req.body["client_id"], req.body["data_type"]
    owner = _owner(ctx)
    got = await _acquire(ctx, req, owner)
    if got["status"] == "FRESH":
        ctx.metrics.prewarm.labels("skipped_fresh").inc()
    elif got["status"] == "BUSY":
        ctx.metrics.prewarm.labels("skipped_busy").inc()
    elif got["status"] == "ACQUIRED":
        deadline = req.deadline - HANDLER_WAIT_MARGIN_S
        try:
            await _fetch_and_store(ctx, client_id, data_type, owner, deadline)
        except BackendError as e:
            ctx.metrics.prewarm.labels("failed").inc()
            log.warning("prewarm_failed", client_id=client_id, data_type=data_type, error=str(e))
            return {"status": e.status}
        ctx.metrics.prewarm.labels("completed").inc()
    return {"status": "OK"}


def _answer(ctx: Context, source: str, data: Any, updated_at_ms: int) -> dict[str, Any]:
    ctx.metrics.products.labels(source).inc()
    return {"status": "OK", "data": data, "source": source, "updated_at_ms": updated_at_ms}


def _error(ctx: Context, status: str, message: str) -> dict[str, Any]:
    ctx.metrics.products.labels("error").inc()
    return {"status": status, "error": status, "message": message}


async def products_get(req: Request, ctx: Context) -> dict[str, Any]:
    client_id, data_type = req.body["client_id"], req.body["data_type"]
    loop = asyncio.get_running_loop()
    deadline = req.deadline - HANDLER_WAIT_MARGIN_S
    max_age_ms = ctx.settings.max_age_ms(data_type)
    for _ in range(ATTEMPTS):
        owner = _owner(ctx)
        got = await _acquire(ctx, req, owner)
        if got["status"] == "FRESH":
            return _answer(ctx, "cache", got["data"], got["updated_at_ms"])
        if got["status"] == "ACQUIRED":
            try:
                data = await _fetch_and_store(ctx, client_id, data_type, owner, deadline)
            except BackendError as e:
                return _error(ctx, e.status, str(e))
            return _answer(ctx, "fetched", data, int(time.time() * 1000))
        if got["status"] != "BUSY":
            return _error(ctx, got["status"], got.get("message", "prewarm_acquire failed"))
        wait_ms = int(min(deadline - loop.time(), ctx.settings.lease_ms / 1000) * 1000)
        if wait_ms <= 0:
            break
        waited = await ctx.storage.call("prewarm_wait", [client_id, data_type, wait_ms], job=req.job)
        if waited["status"] == "TIMEOUT":
            break
        fresh = waited.get("updated_at_ms", 0) > 0 and waited.get("age_ms", max_age_ms + 1) <= max_age_ms
        if waited["status"] == "OK" and fresh:
            return _answer(ctx, "waited", waited["data"], waited["updated_at_ms"])
        # the holder failed or its lease ran out: try to take it ourselves
    return _error(ctx, "TIMEOUT", f"products {data_type} of {client_id} not ready within the lifetime")


HANDLERS: dict[str, Handler] = {
    "APP_START": app_start,
    "PREWARM_FETCH": prewarm_fetch,
    "PRODUCTS_GET": products_get,
}
