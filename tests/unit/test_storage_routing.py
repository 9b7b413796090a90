"""Storage routing without I/O: when no election is coming (smartcache/server/storage/routing.py
unreachable_leader), and a write waiting for storage that the deadline sweep cancels is answered as not
executed, not left to EXPIRED."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from smartcache.server.job import Job
from smartcache.server.storage.instances import ER_WAL_IO, maybe_applied
from smartcache.server.storage.routing import HEARD_AFTER_US_S, LEADER_HEARD_S, _wait_until, unreachable_leader

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
        task = asyncio.get_running_loop().create_task(_wait_until(never.wait(), job, job.deadline))
        await asyncio.sleep(0)  # waiting now
        job.deadline = time.monotonic()  # the lifetime ended: the sweep cancels the task
        task.cancel()
        await asyncio.wait([task])
        return task.cancelled(), task.cancelling()

    assert asyncio.run(scenario()) == (False, 0)


def test_a_wait_cancelled_for_another_reason_stays_cancelled() -> None:
    async def scenario() -> bool:
        job = _job(time.monotonic() + 3600)  # time left: the worker is stopping, not the sweep
        task = asyncio.get_running_loop().create_task(_wait_until(asyncio.Event().wait(), job, job.deadline))
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
        await _wait_until(ready.wait(), job, job.deadline)
        await _wait_until(asyncio.Event().wait(), job, time.monotonic())  # the end is now: returns

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
