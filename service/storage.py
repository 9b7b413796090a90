"""Storage access: stored procedure calls, sent to the instance that may write.

One :class:`Storage` per worker event loop. It keeps a pipelined asynctnt
connection to every instance in ``SMARTCACHE_TARANTOOL`` (:class:`Instance`)
and sends every call to the *leader*: the instance whose ``sc.role()`` says it
may write now (with failover, a leader whose etcd lease is proven; without, the
one that is not read-only). The service never decides who leads and never
changes any instance's role: it only asks, every ``PING_INTERVAL_S`` and at once
after a NOT_LEADER, a read-only refusal or a lost connection. With no leader
known, writes fail at once (STORAGE_UNAVAILABLE) and reads go to any instance
that answers.

Only procedures are called (``sc.<name>``), never spaces, and every call sends
``meta`` first (lua/smartcache/api.lua): the message's deadline on the
instance's clock, so storage refuses work that arrives after the service has
given up on it, and an optional idempotency key.

What a failed call means is decided here, once, because the client's retry
depends on it:

* not sent (no leader, no connection, instance stalled) or refused without
  effect (NOT_LEADER, read-only, disk or memory full: the procedure's
  transaction rolled back) -> :class:`StorageUnavailable`: not executed. A
  refusal by an instance that stopped leading is retried on the new leader
  while the message has time left;
* refused at the deadline -> :class:`DeadlineExceeded`: not executed;
* sent and then the connection broke -> :class:`OutcomeUnknown`;
* the procedure raised for another reason -> :class:`ProcedureError` (a bug).

Each instance's keeper pings it (``sc.role``): a ping unanswered within
``PING_TIMEOUT_S`` marks it stalled (a SIGSTOPped or overloaded Tarantool keeps
its socket open), and calls then avoid it. Each state and leader change is
logged and counted. The ping also measures the offset between the instance's
clock and ours, which turns a local deadline into the instance's wall-clock
milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, NoReturn

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
from service.job import Job, current_job
from service.metrics import Metrics, label

log = structlog.get_logger("storage")

RECONNECT_DELAY_S = 0.5
PING_INTERVAL_S = 0.5
#: while no leader is known (an election or a hand-over), roles are asked this often
SEARCH_INTERVAL_S = 0.05
#: a ping unanswered this long marks the instance stalled
PING_TIMEOUT_S = 1.0
#: offset samples from pings slower than this are too imprecise to keep
OFFSET_MAX_RTT_S = 0.05
#: how long a call without a message deadline (cleanup) waits for a leader to be found
NO_DEADLINE_WAIT_S = 2.0
#: a call refused by an ex-leader is sent again at most this many times
REROUTES = 3
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

    def __init__(
        self, *, address: str, settings: Settings, metrics: Metrics, on_role: Any, searching: Any = bool
    ) -> None:
        """on_role: called after each answer (or failure); searching(): True while no leader is known."""
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
        #: the instance's last answer to sc.role() (empty until one came)
        self.role: dict[str, Any] = {}
        #: the instance's wall clock minus ours, in milliseconds
        self.offset_ms = 0.0
        self._offset_rtt_s = float("inf")
        self._on_role = on_role
        self._searching = searching
        self._wake = asyncio.Event()
        self._connected_gauge = metrics.storage_connected.labels(address)
        self._state_changes = {s: metrics.storage_state_changes.labels(address, s) for s in STATES}
        self._offset_gauge = metrics.storage_clock_offset.labels(address)
        self._keeper: asyncio.Task[None] | None = None

    @property
    def up(self) -> bool:
        """Calls may be sent: connected and answering pings."""
        return self.state == UP and bool(self.conn.is_connected)

    @property
    def writable(self) -> bool:
        """Up, and its last role answer said it may write."""
        return self.up and bool(self.role.get("writable"))

    @property
    def term(self) -> int:
        return int(self.role.get("term") or 0)

    def start(self) -> None:
        """Start the keeper; it connects in the background (never blocks the caller)."""
        self._keeper = asyncio.get_running_loop().create_task(self._keep())

    def check_now(self) -> None:
        """Ask the instance its role at once (after a refusal or a lost connection)."""
        self._wake.set()

    async def close(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
        with contextlib.suppress(TarantoolError, OSError):
            await self.conn.disconnect()
        self._connected_gauge.set(0)

    def remote_ms(self, deadline_ms: float) -> int:
        """A wall-clock deadline (ms) as the instance's wall-clock milliseconds."""
        return int(deadline_ms + self.offset_ms)

    async def _keep(self) -> None:
        while True:
            self._wake.clear()
            if not self.conn.is_connected:
                try:
                    await self.conn.connect()
                except (TimeoutError, TarantoolError, OSError) as e:
                    self._set(DOWN, error=f"{type(e).__name__}: {e}")
                    await self._pause(RECONNECT_DELAY_S)
                    continue
            await self._ping()
            await self._pause(SEARCH_INTERVAL_S if self._searching() else PING_INTERVAL_S)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    async def _ping(self) -> None:
        sent = time.time()
        try:
            resp = await self.conn.call("sc.role", [None], timeout=PING_TIMEOUT_S)
        except TimeoutError:
            self._set(STALLED, error=f"no answer to a ping within {PING_TIMEOUT_S} s")
            return
        except (TarantoolError, OSError) as e:
            self._set(DOWN, error=f"{type(e).__name__}: {e}")
            return
        returned = time.time()
        role: dict[str, Any] = resp.body[0]
        # Keep the sample from the quickest recent ping: its midpoint is the best estimate.
        self._offset_rtt_s = min(self._offset_rtt_s * 1.1, OFFSET_MAX_RTT_S)
        if "time_ms" in role and returned - sent <= self._offset_rtt_s:
            self._offset_rtt_s = returned - sent
            self.offset_ms = role["time_ms"] - (sent + returned) * 500
            self._offset_gauge.set(self.offset_ms / 1000)
        self.role = role
        self._set(UP)

    def _set(self, state: str, error: str = "") -> None:
        self._connected_gauge.set(1 if self.conn.is_connected else 0)
        if state != UP:
            self.role = {}
        if state != self.state:
            was, self.state = self.state, state
            self._state_changes[state].inc()
            if state == UP:
                log.info("storage_up", address=self.address, was=was)
            else:
                log.warning(f"storage_{state}", address=self.address, was=was, error=error)
        self._on_role()


class Storage:
    """What handlers call: ``await storage.call(procedure, args)``.

    The call goes to the leader, carries the current job's deadline
    (:mod:`service.job`) and records on the job whether it reached storage.
    """

    def __init__(self, *, settings: Settings, metrics: Metrics) -> None:
        self.instances = [
            Instance(address=a, settings=settings, metrics=metrics, on_role=self._elect, searching=self._searching)
            for a in settings.tarantool
        ]
        self.leader: Instance | None = None
        self._leader_known = asyncio.Event()
        self._metrics = metrics
        self._leader_gauges = {i.address: metrics.storage_leader.labels(i.address) for i in self.instances}
        self._calls: dict[tuple[str, str], Any] = {}
        self._latency: dict[str, Any] = {}
        #: why writes fail right now (None: they don't), and how many failed since
        self._write_failure: str | None = None
        self._write_failures = 0

    @property
    def connected(self) -> bool:
        """A leader is known (calls can be sent)."""
        return self.leader is not None

    @property
    def ready(self) -> bool:
        return self.leader is not None

    async def start(self) -> None:
        """Start connecting to every instance in the background; returns at once, whatever storage does."""
        for instance in self.instances:
            instance.start()

    async def close(self) -> None:
        for instance in self.instances:
            await instance.close()

    def describe(self) -> list[dict[str, Any]]:
        """Each instance as this connection sees it (for INFO)."""
        return [
            {
                "address": i.address,
                "state": i.state,
                "leader": i is self.leader,
                "role": i.role.get("role"),
                "writable": i.writable,
                "term": i.term,
                "clock_offset_ms": round(i.offset_ms, 1),
            }
            for i in self.instances
        ]

    # -- who leads ----------------------------------------------------------------

    def _elect(self) -> None:
        """Follow what the instances say: the writable one leads (highest term if, wrongly, several)."""
        writable = [i for i in self.instances if i.writable]
        if len(writable) > 1:
            log.error("storage_two_writable", addresses=[i.address for i in writable], terms=[i.term for i in writable])
        leader = max(writable, key=lambda i: i.term, default=None)
        if leader is self.leader:
            return
        was, self.leader = self.leader, leader
        for instance in self.instances:
            self._leader_gauges[instance.address].set(1 if instance is leader else 0)
        if leader is None:
            self._leader_known.clear()
            log.warning("storage_leader_lost", was=was.address if was else None)
            return
        self._leader_known.set()
        self._metrics.storage_leader_changes.inc()
        self._metrics.storage_leader_term.set(leader.term)
        log.info("storage_leader", address=leader.address, term=leader.term, was=was.address if was else None)

    def _lost(self, instance: Instance) -> None:
        """It refused or went away: stop sending to it until its role says otherwise, and ask everyone."""
        instance.role = {}
        self._elect()
        for i in self.instances:
            i.check_now()

    async def _target(self, procedure: str, job: Job | None) -> Instance:
        """The leader; waits for one while the message has time. Reads fall back to any instance that is up."""
        if self.leader is not None:
            return self.leader
        if procedure not in WRITES and procedure not in WAITING_WRITES:
            for instance in self.instances:
                if instance.up:
                    return instance
        wait_s = NO_DEADLINE_WAIT_S if job is None else job.deadline - time.monotonic()
        if wait_s > 0 and self._election_possible():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._leader_known.wait(), wait_s)
        leader = self._current_leader()
        if leader is None:
            states = ", ".join(f"{i.address} {i.state}" for i in self.instances)
            raise StorageUnavailable(f"{procedure}: no storage instance may write now ({states})")
        return leader

    def _searching(self) -> bool:
        return self.leader is None

    def _current_leader(self) -> Instance | None:
        return self.leader

    def _election_possible(self) -> bool:
        """Worth waiting for a leader: an instance answers that takes part in failover (an election or
        hand-over may be under way). With every instance down, or only standalone ones, fail at once."""
        return any(i.up and i.role.get("role", "standalone") != "standalone" for i in self.instances)

    # -- calls --------------------------------------------------------------------

    async def call(self, procedure: str, args: list[Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Call sc.<procedure>(meta, *args) on the leader; returns its result map (status still a name).

        No timeout here: the worker cancels the message's task when its
        lifetime ends (one sweep timer per loop is cheaper than one per call),
        and storage itself refuses a call that arrives after the deadline.
        """
        job = current_job.get()
        attempt = 0
        while True:
            instance = self.leader
            if instance is None:
                instance = await self._target(procedure, job)
            try:
                # One await on the connector and no coroutine of our own in between: this is the hot path.
                meta = self._meta(instance, procedure, job, idempotency_key)
                started = time.perf_counter()
                try:
                    resp = await instance.conn.call("sc." + procedure, [meta, *args])
                except BaseException as e:
                    if job is not None:
                        job.returned += 1
                    self._failed(instance, procedure, e, started)
                if job is not None:
                    job.returned += 1
                return self._result(instance, procedure, resp.body[0], started)
            except NotLeader:
                # Not executed, and it no longer leads: send it again, to the leader found next.
                self._lost(instance)
                attempt += 1
                if attempt > REROUTES or (job is not None and job.deadline <= time.monotonic()):
                    raise

    def _meta(
        self, instance: Instance, procedure: str, job: Job | None, key: str | None
    ) -> int | dict[str, Any] | None:
        """What goes first in the call: the deadline alone as a bare number (the common case, cheapest to
        send), else a map; None without a message (cleanup calls). Counts the call as sent on the job."""
        if not instance.up:  # went away since it was chosen: not sent, try the next leader
            self._observe(procedure, "unavailable", 0.0)
            raise NotLeader(f"{procedure}: storage {instance.address} is {instance.state}")
        meta: int | dict[str, Any] | None = None
        if job is not None:
            meta = instance.remote_ms(job.deadline_ms)
            job.sent += 1
        if key is not None:
            meta = {"deadline_ms": meta, "idempotency_key": key}
        return meta

    def _failed(self, instance: Instance, procedure: str, e: BaseException, started: float) -> NoReturn:
        """The call raised: say what that means for the message (see the module docstring)."""
        seconds = time.perf_counter() - started
        if isinstance(e, TarantoolDatabaseError):
            reason = _CANNOT_WRITE.get(e.code)
            if reason is None:
                self._observe(procedure, "error", seconds)
                raise ProcedureError(f"{procedure}: {e}") from e
            self._observe(procedure, "unavailable", seconds)
            self._write_failed(reason)
            if reason == "read_only":
                raise NotLeader(f"{procedure}: {instance.address} is read-only") from e
            raise StorageUnavailable(f"{procedure}: storage cannot write ({reason.replace('_', ' ')})") from e
        if isinstance(e, TimeoutError | TarantoolError | OSError):
            self._observe(procedure, "unknown", seconds)
            self._lost(instance)
            raise OutcomeUnknown(f"{procedure}: connection to {instance.address} lost: {type(e).__name__}") from e
        self._observe(procedure, "cancelled" if isinstance(e, asyncio.CancelledError) else "error", seconds)
        raise e

    def _result(self, instance: Instance, procedure: str, result: dict[str, Any], started: float) -> dict[str, Any]:
        outcome = result.get("status", "error")
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
            log.warning("storage_writes_failing", reason=reason)
        self._metrics.storage_write_failures.labels(reason).inc()

    def _observe(self, procedure: str, outcome: str, seconds: float) -> None:
        key = (procedure, outcome)
        counter = self._calls.get(key)
        if counter is None:
            counter = self._calls[key] = self._metrics.storage_calls.labels(procedure, label(outcome))
        counter.inc()
        hist = self._latency.get(procedure)
        if hist is None:
            hist = self._latency[procedure] = self._metrics.storage_latency.labels(procedure)
        hist.observe(seconds)


#: procedures that change data (lua/smartcache/api.lua `writes`): only the leader takes them
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
        "counter_add",
        "counter_cas",
        "register_cas",
        "sequence_reserve",
        "semaphore_release",
        "semaphore_renew",
        "latch_create",
        "latch_count_down",
        "queue_put",
        "queue_ack",
        "queue_release",
        "event_publish",
    }
)
#: procedures that wait, then write (api.lua `waits`, but for latch_await, a read): only the leader takes them
WAITING_WRITES = frozenset({"semaphore_acquire", "queue_take"})
