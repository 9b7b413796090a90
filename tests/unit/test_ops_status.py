"""`cluster status`'s topology: a member that does not answer is shown with the role its etcd record last said,
marked unconfirmed, never as plainly "leader" (issue 36: a killed leader's record outlives it by up to a lease, and
status listed it as `leader` while none was elected). A shard's instances (`<cluster>.<shard>`) stand for their sharded
cluster, in status and in the CLI's choice of cluster alike (sharded_cluster_of)."""

from __future__ import annotations

from typing import Any

import pytest

from smartcache.ops import status
from smartcache.ops.access import Access
from smartcache.ops.instances import Registry
from smartcache.ops.status import role_shown, topology_status
from smartcache.wire import topology

DEAD, ALIVE, WAITING = "127.0.0.1:3301", "127.0.0.1:3302", "127.0.0.1:3304"


def _registry() -> Registry:
    members = (topology.Member(DEAD), topology.Member(ALIVE))
    records = (
        {"uri": DEAD, "role": "leader", "uuid": "u1"},  # on the dead leader's lease, until it runs out
        {"uri": ALIVE, "role": "follower", "uuid": "u2"},
        {"uri": WAITING, "role": "unregistered", "uuid": "u4"},
    )
    return Registry("bank", topology.Topology(1, members), records)


def _instances() -> list[dict[str, Any]]:
    return [
        {"address": DEAD, "reachable": False, "error": "NetworkError: (111, 'Connection refused')"},
        {"address": ALIVE, "uri": ALIVE, "reachable": True, "role": "follower"},
        {"address": WAITING, "reachable": False, "error": "timed out"},
    ]


def test_a_member_that_does_not_answer_is_never_shown_as_leader() -> None:
    doc = topology_status(_registry(), _instances())
    roles = {m["address"]: (m["role"], m["reachable"]) for m in doc["members"]}
    assert roles == {DEAD: ("leader? (no answer)", False), ALIVE: ("follower", True)}
    (waiting,) = doc["unregistered"]
    assert (waiting["address"], waiting["role"]) == (WAITING, "unregistered? (no answer)")


def test_the_role_an_instance_answers_wins_and_without_any_it_is_down() -> None:
    assert role_shown({"role": "leader", "reachable": True}, {"role": "follower"}) == "leader"
    assert role_shown({"reachable": False}, {"role": "follower"}) == "follower? (no answer)"
    assert role_shown({"reachable": False}, {}) is None
    doc = topology_status(Registry("bank", topology.Topology(1, (topology.Member(DEAD),))), _instances()[:1])
    assert doc["members"][0]["role"] == "down"


def _access() -> Access:
    """make run's default instances, no --cluster."""
    return Access(addresses=[ALIVE], user="operator", password="operator", etcd=("http://e1",))


@pytest.mark.parametrize(
    ("replica_set", "maps", "whole"),
    [
        ("make-run.s1", {"make-run"}, "make-run"),  # a shard's replica set, its cluster sharded
        ("make-run.s1", set(), None),  # a dotted name with no bucket map: a cluster of its own
        ("bank", {"bank"}, None),  # no dot: no shard of anything
    ],
)
def test_a_replica_set_named_cluster_dot_shard_is_a_shard_of_the_cluster_with_a_bucket_map(
    replica_set: str, maps: set[str], whole: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(status, "bucket_map", lambda a: {"shards": ["s1"]} if a.cluster in maps else None)
    assert status.sharded_cluster_of(_access(), replica_set) == whole


def test_status_of_one_shards_instances_is_the_whole_sharded_clusters(monkeypatch: pytest.MonkeyPatch) -> None:
    """`cluster status` with make run's default instances (shard s1's) and no --cluster shows every shard."""
    shard = [{"address": ALIVE, "reachable": True, "role": "leader", "cluster": "make-run.s1"}]
    monkeypatch.setattr(status, "known", lambda _a, discover: (shard, Registry("make-run.s1")))
    monkeypatch.setattr(status, "bucket_map", lambda a: {"shards": []} if a.cluster == "make-run" else None)
    answer = status.status(_access())
    assert answer["cluster"] == "make-run"
