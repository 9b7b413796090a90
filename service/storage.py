"""Storage access: stored procedure calls over one pipelined asynctnt connection per instance.

One :class:`Storage` per worker event loop; many worker slots share its
connection. Only procedures are called (``sc.<name>``), never spaces, and
every call sends ``meta`` first (lua/smartcache/api.lua): the message's
deadline on the instance's clock, so storage refuses work that arrives after
the service has given up on it, and an optional idempotency key.

What a failed call means is decided here, once, because the client's
retry depends on it:

* not sent (no connection, instance stalled) or refused without effect
  (NOT_LEADER, read-only, disk or memory full: the procedure's transaction
  rolled back) -> :class:`StorageUnavailable`: not executed;
* refused at the deadline -> :class:`DeadlineExceeded`: not executed;
* sent and then the connection broke -> :class:`OutcomeUnknown`;
* the procedure raised for another reason -> :class:`ProcedureError` (a bug).

Each :class:`Instance` keeps its connection alive and pings the instance
every ``PING_INTERVAL_S``: a ping that takes longer than ``PING_TIMEOUT_S``
marks it stalled (a SIGSTOPped or overloaded Tarantool keeps its socket
open), and calls then fail at once instead of queueing behind it. Each state
change is logged and counted. The ping also measures the offset between the
instance's clock and ours, which turns a local deadline into the instance's
wall-clock milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import asynctnt
import structlog
from asynctnt.exceptions import ErrorCode, TarantoolDatabaseError, TarantoolError

from service.config import Settings
from service.errors import (
    DeadlineExceeded,
    NotLeader,
    OutcomeUnknown,
    ProcedureError,
    StorageUnavailable,
)
from service.job import current_job
from service.metrics import Metrics

log = structlog.get_logger("storage")

RECONNECT_DELAY_S = 0.5
PING_INTERVAL_S = 0.5
#: a ping unanswered this long marks the instance stalled
PING_TIMEOUT_S = 1.0
#: offset samples from pings slower than this are too imprecise to keep
OFFSET_MAX_RTT_S = 0.05
#: Tarantool error code of a failed WAL write (box.error.WAL_IO)
ER_WAL_IO = 40
#: error codes that mean "rolled back, nothing done, the instance cannot write now"
_CANNOT_WRITE = {
    int(ErrorCode.ER_READONLY): "read_only",
    int(ErrorCode.ER_MEMORY_ISSUE): "out_of_memory",
    ER_WAL_IO: "disk",
}

UP, STALLED, DOWN = "up", "stalled", "down"
STATES = (UP, STALLED, DOWN)


class Instance:
    """One Tarantool instance: its connection, kept alive and watched by a keeper task."""

    def __init__(self, *, address: str, settings: Settings, metrics: Metrics) -> None:
        self.address = address
        host, _, port = address.rpartition(":")
        self.conn = asynctnt.Connection(
            host=host,
            port=int(port),
            username=settings.tarantool_user,
            password=settings.tarantool_password,
            fetch_schema=False,
            auto_refetch_schema=False,
            connect_timeout=settings.storage_connect_timeout_s,
            reconnect_timeout=0,  # the keeper reconnects: connect() must not loop forever
            ping_timeout=0,  # the keeper pings
        )
        self.state = DOWN
        #: the instance's wall clock minus ours, in milliseconds
        self.offset_ms = 0.0
        self._offset_rtt_s = float("inf")
        self._metrics = metrics
        self._connected_gauge = metrics.storage_connected.labels(address)
        self._state_changes = {s: metrics.storage_state_changes.labels(address, s) for s in STATES}
        self._offset_gauge = metrics.storage_clock_offset.labels(address)
        self._keeper: asyncio.Task[None] | None = None

    @property
    def up(self) -> bool:
        """Calls may be sent: connected and answering pings."""
        return self.state == UP and bool(self.conn.is_connected)

    def start(self) -> None:
        """Start the keeper; it connects in the background (never blocks the caller)."""
        self._keeper = asyncio.get_running_loop().create_task(self._keep())

    async def close(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
        with contextlib.suppress(TarantoolError, OSError):
            await self.conn.disconnect()
        self._connected_gauge.set(0)

    def remote_ms(self, deadline: float) -> int:
        """A loop-time (monotonic) deadline as the instance's wall-clock milliseconds."""
        return int((time.time() + deadline - time.monotonic()) * 1000 + self.offset_ms)

    async def _keep(self) -> None:
        while True:
            if not self.conn.is_connected:
                try:
                    await self.conn.connect()
                except (TimeoutError, TarantoolError, OSError) as e:
                    self._set(DOWN, error=f"{type(e).__name__}: {e}")
                    await asyncio.sleep(RECONNECT_DELAY_S)
                    continue
            await self._ping()
            await asyncio.sleep(PING_INTERVAL_S)

    async def _ping(self) -> None:
        sent = time.time()
        try:
            resp = await self.conn.call("sc.ping", [None], timeout=PING_TIMEOUT_S)
        except TimeoutError:
            self._set(STALLED, error=f"no answer to a ping within {PING_TIMEOUT_S} s")
            return
        except (TarantoolError, OSError) as e:
            self._set(DOWN, error=f"{type(e).__name__}: {e}")
            return
        returned = time.time()
        rtt = returned - sent
        # Keep the sample from the quickest recent ping: its midpoint is the best estimate.
        self._offset_rtt_s = min(self._offset_rtt_s * 1.1, OFFSET_MAX_RTT_S)
        if rtt <= self._offset_rtt_s:
            self._offset_rtt_s = rtt
            self.offset_ms = resp.body[0]["time_ms"] - (sent + returned) * 500
            self._offset_gauge.set(self.offset_ms / 1000)
        self._set(UP)

    def _set(self, state: str, error: str = "") -> None:
        self._connected_gauge.set(1 if self.conn.is_connected else 0)
        if state == self.state:
            return
        was, self.state = self.state, state
        self._state_changes[state].inc()
        if state == UP:
            log.info("storage_up", address=self.address, was=was)
        else:
            log.warning(f"storage_{state}", address=self.address, was=was, error=error)


class Storage:
    """What handlers call: ``await storage.call(procedure, args)``.

    One instance today (the first of SMARTCACHE_TARANTOOL). The call sends
    the current job's deadline (:mod:`service.job`) and records on the job
    whether the call reached storage.
    """

    def __init__(self, *, settings: Settings, metrics: Metrics) -> None:
        self.instance = Instance(address=settings.tarantool[0], settings=settings, metrics=metrics)
        self.address = self.instance.address
        self._metrics = metrics
        self._calls: dict[tuple[str, str], Any] = {}
        self._latency: dict[str, Any] = {}
        #: why writes fail right now (None: they don't), and how many failed since
        self._write_failure: str | None = None
        self._write_failures = 0

    @property
    def connected(self) -> bool:
        return self.instance.up

    @property
    def ready(self) -> bool:
        """Calls can be sent now."""
        return self.instance.up

    async def start(self) -> None:
        """Start connecting in the background; returns at once, whatever storage does."""
        self.instance.start()

    async def close(self) -> None:
        await self.instance.close()

    async def call(self, procedure: str, args: list[Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Call sc.<procedure>(meta, *args); returns its result map (status still a name).

        No timeout here: the worker cancels the message's task when its
        lifetime ends (one sweep timer per loop is cheaper than one per call),
        and storage itself refuses a call that arrives after the deadline.
        """
        instance = self.instance
        if not instance.up:
            self._observe(procedure, "unavailable", 0.0)
            raise StorageUnavailable(f"{procedure}: storage {instance.address} is {instance.state}")
        job = current_job.get()
        meta: dict[str, Any] | None = None
        if job is not None:
            meta = {"deadline_ms": instance.remote_ms(job.deadline)}
            job.sent += 1
        if idempotency_key is not None:
            meta = {**(meta or {}), "idempotency_key": idempotency_key}
        started = time.perf_counter()
        outcome = "error"
        try:
            try:
                resp = await instance.conn.call("sc." + procedure, [meta, *args])
            finally:
                if job is not None:
                    job.returned += 1
            result: dict[str, Any] = resp.body[0]
            outcome = result.get("status", "error")
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except TarantoolDatabaseError as e:
            reason = _CANNOT_WRITE.get(e.code)
            if reason is None:
                raise ProcedureError(f"{procedure}: {e}") from e
            outcome = "unavailable"
            self._write_failed(reason)
            raise StorageUnavailable(f"{procedure}: storage cannot write ({reason.replace('_', ' ')})") from e
        except (TimeoutError, TarantoolError, OSError) as e:
            outcome = "unknown"
            raise OutcomeUnknown(f"{procedure}: connection to {instance.address} lost: {type(e).__name__}") from e
        finally:
            self._observe(procedure, outcome, time.perf_counter() - started)
        if outcome == "NOT_LEADER":
            self._write_failed("not_leader")
            raise NotLeader(f"{procedure}: {instance.address} may not write now (no leader lease)")
        if outcome == "DEADLINE_EXCEEDED":
            raise DeadlineExceeded(f"{procedure}: storage got the call after the message's deadline")
        if self._write_failure is not None and procedure in WRITES:
            log.info("storage_writes_recovered", address=instance.address, failed=self._write_failures)
            self._write_failure, self._write_failures = None, 0
        return result

    def _write_failed(self, reason: str) -> None:
        """Count a refused write; log once per change of reason, never with the call's data."""
        self._write_failures += 1
        if reason != self._write_failure:
            self._write_failure = reason
            log.warning("storage_writes_failing", address=self.address, reason=reason)
        self._metrics.storage_write_failures.labels(reason).inc()

    def _observe(self, procedure: str, outcome: str, seconds: float) -> None:
        key = (procedure, outcome)
        counter = self._calls.get(key)
        if counter is None:
            counter = self._calls[key] = self._metrics.storage_calls.labels(procedure, outcome)
        counter.inc()
        hist = self._latency.get(procedure)
        if hist is None:
            hist = self._latency[procedure] = self._metrics.storage_latency.labels(procedure)
        hist.observe(seconds)


#: procedures that change data (lua/smartcache/api.lua `writes`); a success ends a write-failure streak
WRITES = frozenset(
    {
        "session_create",
        "session_touch",
        "session_update",
        "session_delete",
        "cache_put",
        "cache_delete",
        "device_bind",
        "prewarm_acquire",
        "prewarm_complete",
        "prewarm_fail",
    }
)
