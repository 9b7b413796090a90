"""Storage access: stored procedure calls, sent to the instance that may write.

One :class:`Storage` per worker event loop: what handlers call. It keeps a pipelined asynctnt
connection to every instance of one replica set and sends every call to the *leader*, in three
roles beside the call itself:

* :mod:`.membership`: which instances (``SMARTCACHE_TARANTOOL``'s, or the members etcd lists);
* :mod:`.leadership`: which of them leads, from what each says (``sc.role()``), and where a call
  goes while none does (a read to the last leader, else a wait while one may come);
* :mod:`.outcomes`: what a call's answer or failure means for the message (not executed, maybe
  executed, a bug), decided once, because the client's retry depends on it.

Each instance is watched by its own keeper (:mod:`.instances`: connection, pings, state, clock
offset). Only procedures are called (``sc.<name>``), never spaces, and every call sends ``meta``
first (lua/smartcache/api.lua): the message's deadline on the instance's clock, so storage refuses
work that arrives after the service has given up on it, and an optional idempotency key. This
module sends the call, and sends it again where the outcome allows: to the new leader after a
refusal by an ex-leader, to the same leader after a moment it held writes, and after the
instance's clock offset was measured again when it refused a deadline our clock says has not
passed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from smartcache.server.config import Settings
from smartcache.server.deadlines import STORAGE_ANSWER_MARGIN_S
from smartcache.server.job import Job
from smartcache.server.metrics import Metrics
from smartcache.server.storage.instances import Instance
from smartcache.server.storage.leadership import Leadership, wait_until
from smartcache.server.storage.membership import Membership
from smartcache.server.storage.outcomes import HELD_WAIT_MAX_S, Outcomes
from smartcache.wire.errors import DeadlineExceeded, NotLeader, StorageUnavailable, WritesHeld

#: a call refused by an ex-leader is sent again at most this many times
REROUTES = 3
#: a call without a message (the service's own) held by the leader (WRITES_HELD) is sent again at most this
#: many times
HELD_RETRIES = 10
#: a call refused as past its deadline while our clock says time is left is sent again at most this
#: many times, each after the instance's clock offset was measured again
CLOCK_RETRIES = 2


class Storage:
    """What handlers call: ``await storage.call(procedure, args, job=req.job)``.

    The call goes to the leader, carries the job's deadline
    (:mod:`smartcache.server.job`) and records on the job whether it reached storage.
    """

    def __init__(self, *, settings: Settings, metrics: Metrics) -> None:
        self._leadership = Leadership(metrics=metrics)
        self._membership = Membership(settings=settings, metrics=metrics, leadership=self._leadership)
        self._outcomes = Outcomes(metrics=metrics, lost=self._leadership.lost)

    @property
    def instances(self) -> list[Instance]:
        """The replica set's instances as this connection knows them now."""
        return self._leadership.instances

    @property
    def leader(self) -> Instance | None:
        """The instance that may write now, or None while none is known."""
        return self._leadership.leader

    @property
    def connected(self) -> bool:
        """A leader is known (calls can be sent)."""
        return self._leadership.leader is not None

    async def start(self) -> None:
        """Start connecting to every instance in the background; returns at once, whatever storage does."""
        self._membership.start()

    async def close(self) -> None:
        await self._membership.close()

    def describe(self) -> list[dict[str, Any]]:
        """Each instance as this connection sees it (for INFO)."""
        leader = self._leadership.leader
        return [
            {
                "address": i.address,
                "state": i.state,
                "leader": i is leader,
                "role": i.role.get("role"),
                "writable": i.writable,
                "term": i.term,
                "clock_offset_ms": round(i.offset_ms, 1),
            }
            for i in self.instances
        ]

    #: one replica set: no shards (a :class:`~smartcache.server.storage.shards.ShardRouter` names its own)
    shard_names: tuple[str, ...] | None = None
    #: one replica set: no buckets (new session ids are version 4)
    bucket_count: int | None = None

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
            instance = self._leadership.leader
            if instance is None:
                instance = await self._leadership.target(procedure, job)
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
                    self._outcomes.failed(instance, procedure, e, started)
                if job is not None:
                    job.returned += 1
                return self._outcomes.result(instance, procedure, resp.body[0], started)
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
                self._leadership.lost(instance)
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
            await wait_until(instance.measure_clock(), job, end)
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
            self._outcomes.observe(procedure, "unavailable", 0.0)
            raise NotLeader(f"{procedure}: storage {instance.address} is {instance.state}")
        meta: int | dict[str, Any] | None = None
        if job is not None:
            meta = instance.remote_ms(job.deadline)
            job.sent += 1
        if key is not None:
            meta = {"deadline_ms": meta, "idempotency_key": key}
        return meta
