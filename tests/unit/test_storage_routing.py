"""Storage routing without I/O: when no election is coming (service/smartcache/server/storage/leadership.py
unreachable_leader), a write waiting for storage that the deadline sweep cancels is answered as not
executed, not left to EXPIRED, where a read goes while no one leads, and a write the leader holds."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from smartcache.server.config import Settings
from smartcache.server.job import Job
from smartcache.server.metrics import Metrics
from smartcache.server.storage.instances import ER_WAL_IO, maybe_applied
from smartcache.server.storage.leadership import HEARD_AFTER_US_S, LEADER_HEARD_S, unreachable_leader, wait_until
from smartcache.server.storage.routing import Storage
from smartcache.wire.errors import StorageUnavailable, WritesHeld

LEADER, F1, F2 = "uuid-leader", "uuid-f1", "uuid-f2"


#: when we last heard from the leader (monotonic s); the followers answered us 2 s later
LOST_AT = 100.0
NOW = LOST_AT + 2.0


def instance(
    uuid: str, *, up: bool = True, role: dict[str, Any] | None = None, answered_at: float = NOW
) -> SimpleNamespace:
    return SimpleNamespace(address=f"addr-{uuid}", uuid=uuid, up=up, role=role or {}, term=7, answered_at=answered_at)


def lost_leader() -> SimpleNamespace:
    return instance(LEADER, up=False, answered_at=LOST_AT)


def follower(
    leader: str | None = LEADER, *, status: str | None = "follow", idle_s: float | None = 0.2
) -> dict[str, Any]:
    upstream = {"uuid": leader, "upstream_status": status, "upstream_idle_s": idle_s}
    return {"role": "follower", "leader_uuid": leader, "replication": [upstream, {"uuid": F2}]}


def test_followers_that_still_hear_a_leader_this_service_cannot_reach_mean_no_election_is_coming() -> None:
    why = unreachable_leader([lost_leader(), instance(F1, role=follower()), instance(F2)])
    assert why is not None
    assert LEADER in why


def test_a_leader_that_is_not_among_our_instances_is_out_of_reach_too() -> None:
    assert unreachable_leader([instance(F1, role=follower()), instance(F2, role=follower())]) is not None


@pytest.mark.parametrize(
    "role",
    [
        follower(idle_s=LEADER_HEARD_S + 0.5),  # silent: frozen or dead, the followers will elect another
        follower(status="disconnected"),  # its replication broke: killed
        follower(status=None, idle_s=None),
        follower(leader=None),  # no leader: an election is under way
        {"role": "candidate", "leader_uuid": None, "replication": []},
        {},  # never answered
    ],
    ids=["silent", "disconnected", "no-upstream", "no-leader", "candidate", "unknown"],
)
def test_an_election_may_be_coming_unless_a_follower_still_hears_its_leader(role: dict[str, Any]) -> None:
    assert unreachable_leader([lost_leader(), instance(F1, role=role)]) is None


@pytest.mark.parametrize("heard_after_us_s", [0.0, 0.5, HEARD_AFTER_US_S - 0.01])
def test_a_leader_the_followers_stopped_hearing_when_we_did_is_frozen_and_an_election_is_coming(
    heard_after_us_s: float,
) -> None:
    """SIGSTOP: it fell silent for everyone at once (our last ping may have been up to an interval before)."""
    answered_at = LOST_AT + 1.2  # we found it stalled (a ping unanswered for 1 s); asked the follower
    idle_s = answered_at - LOST_AT - heard_after_us_s
    assert idle_s <= LEADER_HEARD_S
    follower_says = instance(F1, role=follower(idle_s=idle_s), answered_at=answered_at)
    assert unreachable_leader([lost_leader(), follower_says]) is None


def test_a_leader_this_service_reaches_is_worth_waiting_for_whatever_the_followers_say() -> None:
    """Reachable but not writable: fenced, or its role not asked again yet; an answer is due soon."""
    assert unreachable_leader([instance(LEADER, role={"role": "fenced"}), instance(F1, role=follower())]) is None


def test_what_a_stalled_follower_said_last_does_not_count() -> None:
    assert unreachable_leader([lost_leader(), instance(F1, up=False, role=follower())]) is None


def _job(deadline: float) -> Job:
    return Job(ticket=b"", header=b"", body=b"", deadline=deadline)


def test_a_wait_cancelled_by_the_deadline_sweep_returns_so_the_caller_answers_storage_unavailable() -> None:
    async def scenario() -> tuple[bool, int]:
        job = _job(time.monotonic() + 3600)
        never = asyncio.Event()
        task = asyncio.get_running_loop().create_task(wait_until(never.wait(), job, job.deadline))
        await asyncio.sleep(0)  # waiting now
        job.deadline = time.monotonic()  # the lifetime ended: the sweep cancels the task
        task.cancel()
        await asyncio.wait([task])
        return task.cancelled(), task.cancelling()

    assert asyncio.run(scenario()) == (False, 0)


def test_a_wait_cancelled_for_another_reason_stays_cancelled() -> None:
    async def scenario() -> bool:
        job = _job(time.monotonic() + 3600)  # time left: the worker is stopping, not the sweep
        task = asyncio.get_running_loop().create_task(wait_until(asyncio.Event().wait(), job, job.deadline))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.wait([task])
        return task.cancelled()

    assert asyncio.run(scenario())


def test_a_wait_returns_when_what_it_waits_for_happens_or_its_end_comes() -> None:
    async def scenario() -> None:
        job = _job(time.monotonic() + 3600)
        ready = asyncio.Event()
        ready.set()
        await wait_until(ready.wait(), job, job.deadline)
        await wait_until(asyncio.Event().wait(), job, time.monotonic())  # the end is now: returns

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("code", "role", "reason"),
    [
        (216, "leader", "sync_quorum_timeout"),
        (217, "leader", "sync_rollback"),
        (ER_WAL_IO, "leader", "disk"),  # maybe queued behind a rolled-back synchronous write
        (ER_WAL_IO, "standalone", None),  # never reached the disk: not applied
        (ER_WAL_IO, None, None),
        (2, "leader", None),  # ER_MEMORY_ISSUE: refused before the WAL
    ],
)
def test_which_failed_writes_may_still_have_been_applied(code: int, role: str | None, reason: str | None) -> None:
    assert maybe_applied(code, role) == reason


# -- where a call goes while no one leads, and a write the leader holds for a moment ------------------


def _storage(instances: list[Any], last: Any = None, leader: Any = None) -> Storage:
    s = Storage(settings=Settings(), metrics=Metrics())
    s._leadership.replace(instances)
    s._leadership.leader, s._leadership.last_leader = leader, last
    return s


def test_a_read_falls_back_to_the_last_leader_while_no_instance_has_a_later_term() -> None:
    """etcd down: the leader fenced itself; it holds every acknowledged write and nobody else can write."""
    last = instance(LEADER, role={"role": "fenced"})
    s = _storage([last, instance(F1, role=follower()), instance(F2, role=follower())], last=last)
    assert s._leadership.read_fallback() is last


def test_a_read_never_falls_back_to_a_follower_that_may_lag() -> None:
    down = instance(LEADER, up=False, role={"role": "leader"})
    assert _storage([down, instance(F1, role=follower())], last=down)._leadership.read_fallback() is None
    assert _storage([instance(F1, role=follower())], last=None)._leadership.read_fallback() is None


def test_a_read_does_not_fall_back_once_an_instance_has_a_later_term() -> None:
    """A follower of a newer leader: writes may be acknowledged there that the last leader lacks."""
    last = instance(LEADER, role={"role": "fenced"})
    newer = instance(F1, role={**follower(F2), "term": 8})
    newer.term = 8
    assert _storage([last, newer], last=last)._leadership.read_fallback() is None


class _Conn:
    """Answers each call with the next of ``answers`` (a result map, or an exception to raise)."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers, self.calls = answers, 0
        self.is_connected = True

    async def call(self, name: str, args: list[Any]) -> SimpleNamespace:
        self.calls += 1
        a = self.answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return SimpleNamespace(body=[a])


def _leader_with(answers: list[Any]) -> SimpleNamespace:
    inst = instance(LEADER, role={"role": "leader", "writable": True})
    inst.conn = _Conn(answers)
    inst.clock = SimpleNamespace(generation=1)
    inst.writable = True
    inst.remote_ms = lambda deadline: 0
    inst.check_now = lambda: None
    return inst


def test_a_write_the_leader_holds_is_sent_again_to_the_same_leader() -> None:
    leader = _leader_with([{"status": "WRITES_HELD", "retry_after_ms": 5}, {"status": "OK"}])
    s = _storage([leader], last=leader, leader=leader)
    got = asyncio.run(s.call("session_update", [], job=_job(time.monotonic() + 5)))
    assert got == {"status": "OK"}
    assert leader.conn.calls == 2
    assert s.leader is leader  # it still leads: not dropped as a NOT_LEADER would be


def test_a_write_held_past_its_lifetime_is_not_executed() -> None:
    leader = _leader_with([{"status": "WRITES_HELD", "retry_after_ms": 400}])
    s = _storage([leader], last=leader, leader=leader)
    with pytest.raises(WritesHeld) as e:
        asyncio.run(s.call("session_update", [], job=_job(time.monotonic() + 0.1)))
    assert isinstance(e.value, StorageUnavailable)  # answered STORAGE_UNAVAILABLE: not executed


def test_without_failover_a_read_falls_back_to_a_replica_while_the_master_is_down() -> None:
    """Every instance standalone (asynchronous replication, no election): a replica answers what it has."""
    master = instance(LEADER, up=False, role={"role": "standalone"})
    replica = instance(F1, role={"role": "standalone"})
    assert _storage([master, replica], last=master)._leadership.read_fallback() is replica
