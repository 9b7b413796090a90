"""Who leads, and where a call goes while no one does.

The leader is the instance whose ``sc.role()`` says it may write now (with failover, a leader
whose etcd lease is proven; without, the one that is not read-only). The service never decides
who leads and never changes any instance's role: it only asks, every ``PING_INTERVAL_S`` and at
once after a NOT_LEADER, a read-only refusal or a lost connection (each instance's keeper,
:mod:`.instances`, asks; :class:`Leadership` decides from what they report, and logs and counts
each leader change).

With no leader reachable, reads go to the last leader while it answers and no instance has a
later term (an etcd outage fences it, and reads go on: it holds every acknowledged write), never
to a follower that may lag; otherwise reads, like writes, wait for a leader only while one may be
coming (an election or a hand-over under way), and never past their lifetime: they fail at once
(STORAGE_UNAVAILABLE, not executed, so the client may try another service instance) when every
instance is down or standalone, or when the followers still follow a leader this service cannot
reach (:func:`unreachable_leader`: a service cut off from the leader alone; the leader keeps its
lease, so no election is coming). The fault suite's partition-service-leader found that waiting
the whole lifetime there answered late, or EXPIRED when the worker's deadline sweep came first.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Iterable
from typing import Any

import structlog
from prometheus_client import Gauge

from smartcache.server.deadlines import NO_DEADLINE_WAIT_S, STORAGE_ANSWER_MARGIN_S
from smartcache.server.job import Job
from smartcache.server.metrics import Metrics
from smartcache.server.storage.instances import PING_INTERVAL_S, SEARCH_INTERVAL_S, Instance
from smartcache.server.storage.procedures import is_read
from smartcache.wire.errors import StorageUnavailable

log = structlog.get_logger("storage")

#: a follower whose leader's replication stream (rows or heartbeats, every replication_timeout = 1 s)
#: was heard this recently still follows a live leader...
LEADER_HEARD_S = 1.5
#: ...if it heard the leader this much later than we last did (a frozen leader fell silent for both at
#: once, give or take our ping interval): then it is our link that is cut, and no election is coming
HEARD_AFTER_US_S = PING_INTERVAL_S + 0.25


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


async def wait_until(waiting: Awaitable[Any], job: Job | None, end: float) -> None:
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


class Leadership:
    """Which of a replica set's instances leads, from what each last said (``elect``), and where a call
    goes (``target``): the leader, else the last leader for a read, else a wait while one may come."""

    def __init__(self, *, metrics: Metrics) -> None:
        self._metrics = metrics
        #: replaced whole (never changed in place; :meth:`replace`): iterations stay valid
        self.instances: list[Instance] = []
        self.leader: Instance | None = None
        #: the instance that led last (it stays while no one leads): what reads fall back to
        self.last_leader: Instance | None = None
        #: set when a wait for a leader has its outcome: a leader is known, or none is coming (see target)
        self._settled = asyncio.Event()
        self._gauges: dict[str, Gauge] = {}

    def replace(self, instances: list[Instance]) -> None:
        """The instances from now on (discovery added or removed some): each one's leader gauge made, those
        of the instances gone set to 0 and dropped."""
        addresses = {i.address for i in instances}
        for address in [a for a in self._gauges if a not in addresses]:
            self._gauges.pop(address).set(0)
        for instance in instances:
            if instance.address not in self._gauges:
                self._gauges[instance.address] = self._metrics.storage_leader.labels(instance.address)
        self.instances = instances

    def elect(self) -> None:
        """Follow what the instances say: the writable one leads (highest term if, wrongly, several)."""
        writable = [i for i in self.instances if i.writable]
        if len(writable) > 1:
            log.error("storage_two_writable", addresses=[i.address for i in writable], terms=[i.term for i in writable])
        leader = max(writable, key=lambda i: i.term, default=None)
        coming = None if leader is not None else self.why_no_leader_is_coming()
        if leader is not None or coming is not None:
            self._settled.set()  # wake the writes waiting for a leader: one is here, or none is coming
        if leader is self.leader:
            return
        was, self.leader = self.leader, leader
        if leader is not None:
            self.last_leader = leader
        for instance in self.instances:
            self._gauges[instance.address].set(1 if instance is leader else 0)
        if leader is None:
            log.warning("storage_leader_lost", was=was.address if was else None, no_leader_coming=coming)
            return
        self._metrics.storage_leader_changes.inc()
        self._metrics.storage_leader_term.set(leader.term)
        log.info("storage_leader", address=leader.address, term=leader.term, was=was.address if was else None)

    def lost(self, instance: Instance) -> None:
        """It refused or went away: stop sending to it until its role says otherwise, and ask everyone."""
        instance.role = {}
        self.elect()
        for i in self.instances:
            i.check_now()

    def searching(self) -> bool:
        """No leader is known (the keepers then ask the roles more often)."""
        return self.leader is None

    async def target(self, procedure: str, job: Job | None) -> Instance:
        """The leader. Reads fall back to the last leader while it answers and no instance has a later term
        (:meth:`read_fallback`). Writes, and reads that cannot fall back, wait for a leader while one may be
        coming (an election, a hand-over) and the message has time, and fail at once when none is: with
        every instance down or standalone, or with the followers still following a leader that this
        service cannot reach (cut off from it alone: the fault suite's partition-service-leader)."""
        if self.leader is not None:
            return self.leader
        read = is_read(procedure)
        # Give up a little before the deadline, so that STORAGE_UNAVAILABLE, not the sweep's EXPIRED, answers.
        end = time.monotonic() + NO_DEADLINE_WAIT_S if job is None else job.deadline - STORAGE_ANSWER_MARGIN_S
        while (leader := self._current_leader()) is None:
            if read and (fallback := self.read_fallback()) is not None:
                return fallback
            why = self.why_no_leader_is_coming()
            if why is not None or time.monotonic() >= end:
                states = ", ".join(f"{i.address} {i.state}" for i in self.instances)
                raise StorageUnavailable(f"{procedure}: {why or 'no storage instance may write now'} ({states})")
            self._settled.clear()  # nothing is settled now: whatever set it has changed since
            # A read looks again at each search round: the last leader's role may come back meanwhile.
            until = min(end, time.monotonic() + SEARCH_INTERVAL_S) if read else end
            await wait_until(self._settled.wait(), job, until)
        return leader

    def read_fallback(self) -> Instance | None:
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

    def _current_leader(self) -> Instance | None:
        """self.leader, read anew (mypy would keep it narrowed to None across the awaits above)."""
        return self.leader

    def why_no_leader_is_coming(self) -> str | None:
        """With no leader reachable: why waiting for one is pointless, or None while one may come."""
        if not any(i.up and i.role.get("role", "standalone") != "standalone" for i in self.instances):
            return "no storage instance may write now, and none takes part in an election"
        return unreachable_leader(self.instances)
