"""Storage access: stored procedure calls, sent to the instance that may write.

One :class:`Storage` per worker event loop. It keeps a pipelined asynctnt
connection to every instance (:class:`Instance`) and sends every call to the
*leader*. The instances are ``SMARTCACHE_TARANTOOL``'s or, with
``SMARTCACHE_ETCD`` and ``SMARTCACHE_CLUSTER``, the cluster's members as etcd
lists them (:mod:`.discovery`), read every second: a new address gets an
``Instance``, one gone from the topology is closed, each logged
(``storage_instance_added``/``_removed``) and counted. Given both, the static
list is what the service starts with, until etcd first answers; etcd
unreachable keeps the instances it has. The leader is the instance whose ``sc.role()`` says it
may write now (with failover, a leader whose etcd lease is proven; without, the
one that is not read-only). The service never decides who leads and never
changes any instance's role: it only asks, every ``PING_INTERVAL_S`` and at once
after a NOT_LEADER, a read-only refusal or a lost connection.

With no leader reachable, reads go to the last leader while it answers and no
instance has a later term (an etcd outage fences it, and reads go on: it holds
every acknowledged write), never to a follower that may lag; otherwise reads,
like writes, wait for a leader only while one may be coming (an election or a hand-over
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

Each instance is watched by its own keeper (:mod:`.instances`: connection,
pings, state, clock offset); this module decides, from what they report, which
one leads, and logs and counts each leader change.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Iterable
from typing import Any, NoReturn

import structlog
from asynctnt.exceptions import TarantoolDatabaseError, TarantoolError

from smartcache.server.config import Settings
from smartcache.server.deadlines import NO_DEADLINE_WAIT_S, STORAGE_ANSWER_MARGIN_S
from smartcache.server.job import Job
from smartcache.server.metrics import Metrics, label
from smartcache.server.storage.discovery import DISCOVERY_INTERVAL_S, TOPOLOGY, Discovery, DiscoveryError
from smartcache.server.storage.instances import (
    CANNOT_WRITE,
    PING_INTERVAL_S,
    SEARCH_INTERVAL_S,
    Instance,
    maybe_applied,
)
from smartcache.wire.errors import (
    DeadlineExceeded,
    NotLeader,
    OutcomeUnknown,
    ProcedureError,
    StorageUnavailable,
    WritesHeld,
)

log = structlog.get_logger("storage")

#: a follower whose leader's replication stream (rows or heartbeats, every replication_timeout = 1 s)
#: was heard this recently still follows a live leader...
LEADER_HEARD_S = 1.5
#: ...if it heard the leader this much later than we last did (a frozen leader fell silent for both at
#: once, give or take our ping interval): then it is our link that is cut, and no election is coming
HEARD_AFTER_US_S = PING_INTERVAL_S + 0.25
#: a call refused by an ex-leader is sent again at most this many times
REROUTES = 3
#: a write the leader held (WRITES_HELD) waits at most this long before it is sent again (the leader's
#: retry_after_ms is at most the synchronous timeout's margin, 0.25 s, plus a little)
HELD_WAIT_MAX_S = 0.5
#: ...and a call without a message (the service's own) is sent again at most this many times
HELD_RETRIES = 10
#: how a statement refused inside a transaction for that reason begins (lua/smartcache/quorum.lua HELD_PREFIX)
HELD_PREFIX = "writes held:"
#: a call refused as past its deadline while our clock says time is left is sent again at most this
#: many times, each after the instance's clock offset was measured again
CLOCK_RETRIES = 2


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
    """What handlers call: ``await storage.call(procedure, args, job=req.job)``.

    The call goes to the leader, carries the job's deadline
    (:mod:`smartcache.server.job`) and records on the job whether it reached storage.
    """

    def __init__(self, *, settings: Settings, metrics: Metrics) -> None:
        self._settings = settings
        self._metrics = metrics
        #: replaced whole (never changed in place) when discovery adds or removes one: iterations stay valid
        self.instances = [self._new_instance(a) for a in settings.tarantool]
        self.leader: Instance | None = None
        #: the instance that led last (it stays while no one leads): what reads fall back to
        self.last_leader: Instance | None = None
        #: set when a wait for a leader has its outcome: a leader is known, or none is coming (see _target)
        self._settled = asyncio.Event()
        self._leader_gauges = {i.address: metrics.storage_leader.labels(i.address) for i in self.instances}
        self._discovery = Discovery(endpoints=settings.etcd, cluster=settings.cluster) if settings.discovery else None
        self._discovering: asyncio.Task[None] | None = None
        self._calls: dict[tuple[str, str], Any] = {}
        self._latency: dict[str, Any] = {}
        #: why writes fail right now (None: they don't), and how many failed since
        self._write_failure: str | None = None
        self._write_failures = 0

    @property
    def connected(self) -> bool:
        """A leader is known (calls can be sent)."""
        return self.leader is not None

    def _new_instance(self, address: str) -> Instance:
        return Instance(
            address=address,
            settings=self._settings,
            metrics=self._metrics,
            on_role=self._elect,
            searching=self._searching,
        )

    async def start(self) -> None:
        """Start connecting to every instance in the background; returns at once, whatever storage does."""
        for instance in self.instances:
            instance.start()
        self._metrics.storage_instances.set(len(self.instances))
        if self._discovery is not None:
            self._discovering = asyncio.get_running_loop().create_task(self._discover())

    async def close(self) -> None:
        if self._discovering is not None:
            self._discovering.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._discovering
        if self._discovery is not None:
            await self._discovery.close()
        for instance in self.instances:
            await instance.close()

    # -- which instances (discovery) -------------------------------------------------

    async def _discover(self) -> None:
        """Every DISCOVERY_INTERVAL_S: the members etcd lists become our instances (:mod:`.discovery`)."""
        assert self._discovery is not None
        failing: str | None = None
        while True:
            try:
                addresses, source = await self._discovery.addresses()
            except DiscoveryError as e:
                self._metrics.storage_discovery_errors.inc()
                if failing is None:
                    log.warning("storage_discovery_failed", error=str(e), keeping=[i.address for i in self.instances])
                failing = str(e)
            except Exception:
                log.exception("storage_discovery_error")
            else:
                if failing is not None:
                    log.info("storage_discovery_recovered", was=failing)
                    failing = None
                await self._apply(addresses, source)
            await asyncio.sleep(DISCOVERY_INTERVAL_S)

    async def _apply(self, addresses: tuple[str, ...], source: str) -> None:
        """New addresses get an Instance; with a topology, those it no longer lists are closed. The live member
        records of a cluster without one only add (a record goes with its lease, an instance down for a while
        must still be asked when it is back)."""
        current = {i.address for i in self.instances}
        added = [self._new_instance(a) for a in addresses if a not in current]
        removed = [i for i in self.instances if i.address not in addresses] if source == TOPOLOGY else []
        if not addresses or (not added and not removed):
            return  # nothing listed at all (a cluster not started yet): keep what we have
        self.instances = [i for i in self.instances if i not in removed] + added
        for instance in added:
            self._leader_gauges[instance.address] = self._metrics.storage_leader.labels(instance.address)
            instance.start()
            self._metrics.storage_discovery_changes.labels("added").inc()
            log.info("storage_instance_added", address=instance.address, source=source)
        for instance in removed:
            self._leader_gauges.pop(instance.address).set(0)
            self._metrics.storage_discovery_changes.labels("removed").inc()
            role = instance.role.get("role")
            log.info("storage_instance_removed", address=instance.address, source=source, role=role)
            await instance.close()
        self._metrics.storage_instances.set(len(self.instances))
        if self.leader in removed:
            self._elect()

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
        if leader is not None:
            self.last_leader = leader
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
        """The leader. Reads fall back to the last leader while it answers and no instance has a later term
        (:meth:`_read_fallback`). Writes, and reads that cannot fall back, wait for a leader while one may be
        coming (an election, a hand-over) and the message has time, and fail at once when none is: with
        every instance down or standalone, or with the followers still following a leader that this
        service cannot reach (cut off from it alone: the fault suite's partition-service-leader)."""
        if self.leader is not None:
            return self.leader
        read = procedure not in WRITES and procedure not in WAITING_WRITES
        # Give up a little before the deadline, so that STORAGE_UNAVAILABLE, not the sweep's EXPIRED, answers.
        end = time.monotonic() + NO_DEADLINE_WAIT_S if job is None else job.deadline - STORAGE_ANSWER_MARGIN_S
        while (leader := self._current_leader()) is None:
            if read and (fallback := self._read_fallback()) is not None:
                return fallback
            why = self._why_no_leader_is_coming()
            if why is not None or time.monotonic() >= end:
                states = ", ".join(f"{i.address} {i.state}" for i in self.instances)
                raise StorageUnavailable(f"{procedure}: {why or 'no storage instance may write now'} ({states})")
            self._settled.clear()  # nothing is settled now: whatever set it has changed since
            # A read looks again at each search round: the last leader's role may come back meanwhile.
            until = min(end, time.monotonic() + SEARCH_INTERVAL_S) if read else end
            await _wait_until(self._settled.wait(), job, until)
        return leader

    def _read_fallback(self) -> Instance | None:
        """With no leader known, where a read may go: the last leader, while it answers and no instance has
        a later term (no one has led since: it holds every acknowledged write, it acknowledged them, and no
        write can be acknowledged elsewhere before a follower takes a later term). An etcd outage fences it
        and reads go on. Never another instance: a follower may lag, and its stale answer (a NOT_FOUND for
        a session created a moment ago ends the customer's session) breaks linearizability (the fault
        suite checks it since issue 35); those reads wait for the leader as writes do. Without failover (every
        instance standalone) any instance that answers: asynchronous replication promises no more."""
        last = self.last_leader
        if last is not None and last.up and last.role and last in self.instances:
            if any(i.term > last.term for i in self.instances if i.role):
                return None
            return last
        # Without failover (every instance standalone: a master and read-only replicas, replication
        # asynchronous) no read is linearizable once the master is gone; a replica answers what it has.
        up = [i for i in self.instances if i.up and i.role]
        if up and all(i.role.get("role") == "standalone" for i in up):
            return up[0]
        return None

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

    #: one replica set: no shards (a :class:`~smartcache.server.storage.shards.ShardRouter` names its own)
    shard_names: tuple[str, ...] | None = None

    async def call_on(self, shard: str, procedure: str, args: list[Any], *, job: Job | None) -> dict[str, Any]:
        """A call that is about a shard's whole log (EVENTS_READ); with one replica set, the shard is ""."""
        return await self.call(procedure, args, job=job)

    async def call(
        self, procedure: str, args: list[Any], *, job: Job | None, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """Call sc.<procedure>(meta, *args) on the leader; returns its result map (status still a name).

        ``job``: the message the call is made for. The call carries its
        deadline, and is counted on it as sent and as returned (which decides
        whether an unfinished message may have been executed). None: a call
        of the service's own (a cleanup, the events reader), with no deadline.
        No timeout here: the worker cancels the message's task when its
        lifetime ends (one sweep timer per loop is cheaper than one per call),
        and storage itself refuses a call that arrives after the deadline.
        """
        attempt = clock_retries = held = 0
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
            except WritesHeld as e:
                # Not executed, and it still leads: send it again to it once the moment has passed.
                held += 1
                wait = min(e.retry_after_s, HELD_WAIT_MAX_S)
                if job is None and held > HELD_RETRIES:
                    raise
                if job is not None and time.monotonic() + wait >= job.deadline - STORAGE_ANSWER_MARGIN_S:
                    raise
                await asyncio.sleep(wait)
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
        end = job.deadline - STORAGE_ANSWER_MARGIN_S
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
            reason = CANNOT_WRITE.get(e.code)
            maybe = maybe_applied(e.code, instance.role.get("role"))
            if maybe is not None:
                self._observe(procedure, "unknown", seconds)
                self._write_failed(maybe)
                raise OutcomeUnknown(
                    f"{procedure}: the synchronous write failed on {instance.address} ({e.message}); "
                    "it may be on the followers, and a later leader may still confirm it"
                ) from e
            if reason == "read_only" and str(e.message).startswith(HELD_PREFIX):
                self._observe(procedure, "held", seconds)
                self._write_failed("writes_held")
                raise WritesHeld(f"{procedure}: {instance.address}: {e.message}", HELD_WAIT_MAX_S / 5) from e
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
        if outcome == "WRITES_HELD":
            self._write_failed("writes_held")
            raise WritesHeld(
                f"{procedure}: {instance.address} holds writes for a moment (a synchronous rollback may be near)",
                result.get("retry_after_ms", 0) / 1000,
            )
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
        "session_rotate",
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
#: procedures that wait, then write, or write in several transactions (api.lua `waits`, but for latch_await, a
#: read, and events_read): only the leader takes them
WAITING_WRITES = frozenset({"semaphore_acquire", "queue_take", "session_delete_client"})
