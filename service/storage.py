"""Storage access: stored procedure calls, sent to the instance that may write.

One :class:`Storage` per worker event loop. It keeps a pipelined asynctnt
connection to every instance in ``SMARTCACHE_TARANTOOL`` (:class:`Instance`)
and sends every call to the *leader*: the instance whose ``sc.role()`` says it
may write now (with failover, a leader whose etcd lease is proven; without, the
one that is not read-only). The service never decides who leads and never
changes any instance's role: it only asks, every ``PING_INTERVAL_S`` and at once
after a NOT_LEADER, a read-only refusal or a lost connection.

With no leader reachable, reads go to any instance that answers, and writes
wait for a leader only while one may be coming (an election or a hand-over
under way), and never past their lifetime: they fail at once
(STORAGE_UNAVAILABLE, not executed, so the client may try another service
instance) when every instance is down or standalone, or when the followers
still follow a leader this service cannot reach (:func:`unreachable_leader`:
a service cut off from the leader alone; the leader keeps its lease, so no
election is coming). The fault suite's partition-service-leader found that
waiting the whole lifetime there answered late, or EXPIRED when the worker's
deadline sweep came first.

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
* refused at the deadline -> :class:`DeadlineExceeded`: not executed. Only
  when our own clock agrees that the lifetime is over: otherwise the offset
  the deadline was sent with is wrong (the instance's wall clock jumped), and
  the call is sent again once the offset is measured again, or answered
  :class:`StorageUnavailable` if the clocks still disagree;
* a synchronous write rolled back (quorum timeout, ROLLBACK) ->
  :class:`OutcomeUnknown`: on Tarantool 2.6.0 the next leader may still
  confirm it;
* sent and then the connection broke -> :class:`OutcomeUnknown`;
* the procedure raised for another reason -> :class:`ProcedureError` (a bug).

Each instance's keeper pings it (``sc.role``): a ping unanswered within
``PING_TIMEOUT_S`` marks it stalled (a SIGSTOPped or overloaded Tarantool keeps
its socket open), and calls then avoid it. Each state and leader change is
logged and counted. The ping also measures the offset between the instance's
clock and ours (service/clock.py), which turns a local deadline into the
instance's wall-clock milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Iterable
from typing import Any, NoReturn

import asynctnt
import structlog
from asynctnt.exceptions import ErrorCode, TarantoolDatabaseError, TarantoolError

from service import clock
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
#: how long a call without a message deadline (cleanup) waits for a leader to be found
NO_DEADLINE_WAIT_S = 2.0
#: a wait for a leader ends this long before the message's deadline, so that its STORAGE_UNAVAILABLE
#: comes before the worker's deadline sweep (every 20 ms) answers EXPIRED
ANSWER_MARGIN_S = 0.05
#: a follower whose leader's replication stream (rows or heartbeats, every replication_timeout = 1 s)
#: was heard this recently still follows a live leader...
LEADER_HEARD_S = 1.5
#: ...if it heard the leader this much later than we last did (a frozen leader fell silent for both at
#: once, give or take our ping interval): then it is our link that is cut, and no election is coming
HEARD_AFTER_US_S = PING_INTERVAL_S + 0.25
#: a call refused by an ex-leader is sent again at most this many times
REROUTES = 3
#: a call refused as past its deadline while our clock says time is left is sent again at most this
#: many times, each after the instance's clock offset was measured again
CLOCK_RETRIES = 2
#: pings of one measurement after such a refusal (a step is adopted at the second agreeing one)
RESAMPLE_PINGS = 3
#: Tarantool error code of a failed WAL write (box.error.WAL_IO)
ER_WAL_IO = 40
#: error codes that mean "rolled back, nothing done, the instance cannot write now"
_CANNOT_WRITE = {
    int(ErrorCode.ER_READONLY): "read_only",
    int(ErrorCode.ER_MEMORY_ISSUE): "out_of_memory",
    ER_WAL_IO: "disk",
}
#: error codes of a synchronous write rolled back (box.error.SYNC_QUORUM_TIMEOUT = 216, SYNC_ROLLBACK =
#: 217 on 2.6.0). Not definitive there: a leader that timed out and died before its ROLLBACK reached a
#: follower may have the write confirmed by the next leader. So: OUTCOME_UNKNOWN.
_MAYBE_APPLIED = {
    int(ErrorCode.ER_SYNC_QUORUM_TIMEOUT): "sync_quorum_timeout",
    int(ErrorCode.ER_SYNC_ROLLBACK): "sync_rollback",
}


def maybe_applied(code: int, role: str | None) -> str | None:
    """The reason a failed write may still have been applied (answer OUTCOME_UNKNOWN), or None.

    A synchronous rollback is never definitive on 2.6.0 (above). Nor is ER_WAL_IO from a leader of a
    synchronous cluster: 2.6.0 fails the writes queued behind a synchronous write that was rolled back
    with ER_WAL_IO too, and those rows may be on the followers already. Standalone, ER_WAL_IO means the
    write never reached the disk: not applied."""
    reason = _MAYBE_APPLIED.get(code)
    if reason is None and code == ER_WAL_IO and role not in (None, "standalone"):
        return "disk"
    return reason


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
        #: the instance's last answer to sc.role() (empty until one came, and while it is not up)
        self.role: dict[str, Any] = {}
        #: its instance_uuid, kept while it is stalled or down (followers name their leader by it)
        self.uuid: str | None = None
        #: when it last answered a ping (monotonic s)
        self.answered_at = -math.inf
        #: the instance's wall clock minus ours (service/clock.py)
        self.clock = clock.ClockOffset()
        self._measuring: asyncio.Task[None] | None = None
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
        for task in (self._keeper, self._measuring):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        with contextlib.suppress(TarantoolError, OSError):
            await self.conn.disconnect()
        self._connected_gauge.set(0)

    @property
    def offset_ms(self) -> float:
        """The instance's wall clock minus ours, in milliseconds."""
        return self.clock.offset_ms

    def remote_ms(self, deadline: float) -> int:
        """A deadline on our monotonic clock as the instance's wall-clock milliseconds: the lifetime left,
        from the instance's time now as the best estimate of the offset has it (a jump of our own wall
        clock since the message arrived does not move it)."""
        return int((time.time() + deadline - time.monotonic()) * 1000 + self.clock.offset_ms)

    async def measure_clock(self) -> None:
        """Measure the offset again now, a few pings in a row (a step is adopted at the second agreeing
        one). One measurement at a time: every call that asks meanwhile waits for the same one."""
        if self._measuring is None or self._measuring.done():
            self._measuring = asyncio.get_running_loop().create_task(self._measure())
        await asyncio.shield(self._measuring)

    async def _measure(self) -> None:
        steps = self.clock.steps
        for _ in range(RESAMPLE_PINGS):
            sent = time.time()
            try:
                resp = await self.conn.call("sc.ping", [None], timeout=PING_TIMEOUT_S)
            except (TimeoutError, TarantoolError, OSError):
                return  # the keeper's pings will say what is wrong
            self._clock_sample(sent, time.time(), resp.body[0])
            if self.clock.steps != steps:
                return

    def _clock_sample(self, sent: float, returned: float, answer: dict[str, Any]) -> None:
        time_ms = answer.get("time_ms")
        if time_ms is None:
            return
        was, steps = self.clock.offset_ms, self.clock.steps
        if not self.clock.add(clock.sample(sent, returned, time_ms)):
            return
        self._offset_gauge.set(self.clock.offset_ms / 1000)
        if self.clock.steps != steps:
            log.warning(
                "storage_clock_step",
                address=self.address,
                offset_ms=round(self.clock.offset_ms, 1),
                was_ms=round(was, 1),
            )

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
        role: dict[str, Any] = resp.body[0]
        self._clock_sample(sent, time.time(), role)
        self.answered_at = time.monotonic()
        self.role = role
        self.uuid = role.get("instance_uuid") or self.uuid
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


def unreachable_leader(instances: Iterable[Instance]) -> str | None:
    """Why no election is coming although this service reaches no leader, or None.

    A reachable follower names a leader this service cannot reach (stalled, down, or not among its
    instances), still hears its replication stream (``upstream_status`` follow, idle at most
    ``LEADER_HEARD_S``), and heard it well after this service last did (``HEARD_AFTER_US_S``): that
    leader lives and renews its lease, so the followers will not elect another; it is this service's
    link that is cut. A dead or frozen leader falls silent for the followers too, and they elect
    another within its TTL: worth waiting for.
    """
    instances = list(instances)
    reachable = {i.uuid for i in instances if i.up and i.uuid}
    last_answered = {i.uuid: i.answered_at for i in instances if i.uuid}
    for i in instances:
        role = i.role if i.up else {}
        leader = role.get("leader_uuid")
        if role.get("role") != "follower" or not leader or leader in reachable:
            continue
        for peer in role.get("replication") or ():
            idle = peer.get("upstream_idle_s")
            if peer.get("uuid") != leader or peer.get("upstream_status") != "follow" or idle is None:
                continue
            heard_after_us = i.answered_at - idle - last_answered.get(leader, -math.inf)
            if idle <= LEADER_HEARD_S and heard_after_us >= HEARD_AFTER_US_S:
                return (
                    f"{i.address} follows leader {leader} (term {i.term}, heard {idle:.1f} s ago), "
                    "which this service cannot reach"
                )
    return None


async def _wait_until(waiting: Awaitable[Any], job: Job | None, end: float) -> None:
    """Await something a call needs before it is sent (a leader, a clock measurement) until ``end``
    (monotonic s); returns when it is done or time ran out, the caller looks again.

    Also when the worker's deadline sweep cancels the message meanwhile: that message waited for
    storage and was never sent, so its caller answers STORAGE_UNAVAILABLE (not executed, and why)
    instead of leaving the answer to the sweep, whose EXPIRED hides the reason (or, with an earlier
    call refused, whose OUTCOME_UNKNOWN is wrong).
    """
    try:
        async with asyncio.timeout(end - time.monotonic()):
            await waiting
    except TimeoutError:
        return
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if job is None or task is None or job.deadline > time.monotonic():
            raise  # not the sweep: the worker is stopping
        task.uncancel()


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
        #: set when a wait for a leader has its outcome: a leader is known, or none is coming (see _target)
        self._settled = asyncio.Event()
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
        coming = None if leader is not None else self._why_no_leader_is_coming()
        if leader is not None or coming is not None:
            self._settled.set()  # wake the writes waiting for a leader: one is here, or none is coming
        if leader is self.leader:
            return
        was, self.leader = self.leader, leader
        for instance in self.instances:
            self._leader_gauges[instance.address].set(1 if instance is leader else 0)
        if leader is None:
            log.warning("storage_leader_lost", was=was.address if was else None, no_leader_coming=coming)
            return
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
        """The leader. Reads fall back to any instance that is up. Writes wait for a leader while one may be
        coming (an election, a hand-over) and the message has time, and fail at once when none is: with
        every instance down or standalone, or with the followers still following a leader that this
        service cannot reach (cut off from it alone: the fault suite's partition-service-leader)."""
        if self.leader is not None:
            return self.leader
        if procedure not in WRITES and procedure not in WAITING_WRITES:
            for instance in self.instances:
                if instance.up:
                    return instance
        # Give up a little before the deadline, so that STORAGE_UNAVAILABLE, not the sweep's EXPIRED, answers.
        end = time.monotonic() + NO_DEADLINE_WAIT_S if job is None else job.deadline - ANSWER_MARGIN_S
        while (leader := self._current_leader()) is None:
            why = self._why_no_leader_is_coming()
            if why is not None or time.monotonic() >= end:
                states = ", ".join(f"{i.address} {i.state}" for i in self.instances)
                raise StorageUnavailable(f"{procedure}: {why or 'no storage instance may write now'} ({states})")
            self._settled.clear()  # nothing is settled now: whatever set it has changed since
            await _wait_until(self._settled.wait(), job, end)
        return leader

    def _searching(self) -> bool:
        return self.leader is None

    def _current_leader(self) -> Instance | None:
        """self.leader, read anew (mypy would keep it narrowed to None across the awaits above)."""
        return self.leader

    def _why_no_leader_is_coming(self) -> str | None:
        """With no leader reachable: why waiting for one is pointless, or None while one may come."""
        if not any(i.up and i.role.get("role", "standalone") != "standalone" for i in self.instances):
            return "no storage instance may write now, and none takes part in an election"
        return unreachable_leader(self.instances)

    # -- calls --------------------------------------------------------------------

    async def call(self, procedure: str, args: list[Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Call sc.<procedure>(meta, *args) on the leader; returns its result map (status still a name).

        No timeout here: the worker cancels the message's task when its
        lifetime ends (one sweep timer per loop is cheaper than one per call),
        and storage itself refuses a call that arrives after the deadline.
        """
        job = current_job.get()
        attempt = clock_retries = 0
        while True:
            instance = self.leader
            if instance is None:
                instance = await self._target(procedure, job)
            generation = instance.clock.generation
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
            except DeadlineExceeded:
                if job is None:
                    raise
                clock_retries += 1
                await self._recheck_clock(instance, procedure, job, generation, clock_retries)

    async def _recheck_clock(self, instance: Instance, procedure: str, job: Job, generation: int, tries: int) -> None:
        """Storage refused the call as past its deadline (nothing done). If our own clock says the lifetime
        is over, it is: DeadlineExceeded (EXPIRED). If not, the offset the deadline was sent with is wrong
        (the instance's wall clock jumped): return once it is measured again, to send the call again; if
        the clocks still disagree, StorageUnavailable (not executed), never EXPIRED while time is left."""
        left_s = job.deadline - time.monotonic()
        if left_s * 1000 <= instance.clock.uncertainty_ms:
            raise DeadlineExceeded(f"{procedure}: storage got the call after the message's deadline")
        end = job.deadline - ANSWER_MARGIN_S
        if instance.clock.generation == generation:  # not measured again since it was sent
            await _wait_until(instance.measure_clock(), job, end)
        if instance.clock.generation == generation or tries > CLOCK_RETRIES or time.monotonic() >= end:
            raise StorageUnavailable(
                f"{procedure}: {instance.address} refused the call as past its deadline with {left_s:.3f} s of "
                f"its lifetime left here: its wall clock and ours disagree (offset {instance.offset_ms:.0f} ms)"
            )

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
            meta = instance.remote_ms(job.deadline)
            job.sent += 1
        if key is not None:
            meta = {"deadline_ms": meta, "idempotency_key": key}
        return meta

    def _failed(self, instance: Instance, procedure: str, e: BaseException, started: float) -> NoReturn:
        """The call raised: say what that means for the message (see the module docstring)."""
        seconds = time.perf_counter() - started
        if isinstance(e, TarantoolDatabaseError):
            reason = _CANNOT_WRITE.get(e.code)
            maybe = maybe_applied(e.code, instance.role.get("role"))
            if maybe is not None:
                self._observe(procedure, "unknown", seconds)
                self._write_failed(maybe)
                raise OutcomeUnknown(
                    f"{procedure}: the synchronous write failed on {instance.address} ({e.message}); "
                    "it may be on the followers, and a later leader may still confirm it"
                ) from e
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
        if outcome == "WRITE_PENDING":
            raise StorageUnavailable(
                f"{procedure}: a write of this key still waited for its quorum at the deadline (no dirty read)"
            )
        if self._write_failure is not None and procedure in WRITES:
            log.info("storage_writes_recovered", address=instance.address, failed=self._write_failures)
            self._write_failure, self._write_failures = None, 0
        return result

    def _write_failed(self, reason: str) -> None:
        """Count a failed write (refused, or rolled back); log once per change of reason, never with the
        call's data."""
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
