"""The Tarantool leader's lease across etcd member faults (three real etcd members, three real instances):
a frozen member the instances talk to costs no fence, the etcd leader's kill -9 at most a short pause and
never two writers, a lost etcd majority fences the leader within its TTL and the return of the majority
lets writes resume by themselves."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from smartcache.devstack.etcd import ask
from tests.integration.conftest_ha import TTL_S, HACluster, WritableSampler, eventually, ha_cluster


@pytest.fixture
def ha(tmp_path: Any) -> Iterator[HACluster]:
    with ha_cluster(tmp_path) as cluster:
        yield cluster


def _move_etcd_leadership_off(ha: HACluster, name: str) -> None:
    """If member name leads etcd, hand etcd's leadership to another member (etcd's own MoveLeader)."""
    leader = ha.etcd.wait_leader()
    if leader.name != name:
        return
    target = next(m for m in ha.etcd.members if m.name != name)
    target_id = (target.status() or {})["header"]["member_id"]
    ask(leader.url, "/v3/maintenance/transfer-leadership", {"targetID": target_id}, timeout_s=5)
    ha.etcd.wait_leader(15, exclude=(name,))


def _writes(ha: HACluster, leader: str, seconds: float) -> tuple[int, int, float]:
    """Write sessions on leader for seconds: (acknowledged, refused, the longest gap between two acks in s)."""
    ok = refused = 0
    last = time.monotonic()
    gap = 0.0
    until = last + seconds
    while time.monotonic() < until:
        _, r = ha.create_session(leader)
        now = time.monotonic()
        if r is not None and r["status"] == "OK":
            ok += 1
            gap, last = max(gap, now - last), now
        else:
            refused += 1
        time.sleep(0.02)
    return ok, refused, max(gap, time.monotonic() - last)


def test_a_frozen_etcd_member_the_instances_ask_first_costs_the_leader_no_fence(ha: HACluster) -> None:
    """SC_ETCD lists etcd-1 first, so every instance asks it first: frozen (SIGSTOP), each call gives it
    three quarters of its budget and then asks the next member, within the same call."""
    first = ha.etcd.members[0]
    _move_etcd_leadership_off(ha, first.name)
    leader = ha.leader()
    ha.etcd.kill(first.name, signal.SIGSTOP)
    try:
        with WritableSampler(ha) as sampler:
            ok, refused, gap = _writes(ha, leader, 3 * TTL_S)
            role = ha.role(leader)
    finally:
        ha.etcd.kill(first.name, signal.SIGCONT)
    assert role is not None
    assert (role["role"], role["writable"]) == ("leader", True), role
    assert refused == 0, f"{refused} writes refused while an etcd follower was frozen (longest gap {gap:.2f} s)"
    assert ok > 0
    assert not sampler.violations


def test_kill_9_of_the_etcd_leader_pauses_writes_at_most_briefly_and_never_makes_two_writers(
    ha: HACluster,
) -> None:
    leader = ha.leader()
    etcd_leader = ha.etcd.wait_leader()
    with WritableSampler(ha) as sampler:
        ha.etcd.kill(etcd_leader.name)
        killed = time.monotonic()
        successor = ha.etcd.wait_leader(15, exclude=(etcd_leader.name,))
        elected_s = time.monotonic() - killed
        ok, refused, gap = _writes(ha, ha.leader(timeout_s=30), 2 * TTL_S)
    print(  # the numbers, with -s
        f"etcd: {successor.name} leads {elected_s:.1f} s after kill -9 of {etcd_leader.name}; "
        f"then {ok} writes acknowledged, {refused} refused, longest gap {gap:.2f} s"
    )
    assert ok > 0
    assert not sampler.violations
    assert ha.leader() == leader  # the Tarantool leader kept (or proved again) its lease and key
    ha.etcd.restart(etcd_leader.name)
    ha.etcd.wait_ready()


def test_an_etcd_majority_down_fences_the_leader_within_its_ttl_and_its_return_resumes_writes(
    ha: HACluster,
) -> None:
    leader = ha.leader()
    survivor, *majority = ha.etcd.members
    for m in majority:
        ha.etcd.kill(m.name)
    down = time.monotonic()
    eventually(lambda: not (ha.role(leader) or {}).get("writable", True), TTL_S + 1, what="the leader fenced")
    fenced_s = time.monotonic() - down
    assert fenced_s <= TTL_S + 0.5, f"fenced {fenced_s:.2f} s after the majority went"
    r = ha.role(leader)
    assert r is not None
    assert r["role"] == "fenced"
    assert ha.create_session(leader)[1]["status"] != "OK"  # type: ignore[index]
    assert survivor.alive()
    for m in majority:
        m.start()
    back = time.monotonic()
    ha.etcd.wait_ready()
    new = ha.leader(timeout_s=30)
    resumed_s = time.monotonic() - back
    print(f"fenced {fenced_s:.2f} s after the etcd majority went; writable again {resumed_s:.1f} s after it returned")
    assert ha.create_session(new)[1]["status"] == "OK"  # type: ignore[index]
