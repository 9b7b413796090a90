"""`cluster status`'s topology: a member that does not answer is shown with the role its etcd record last said,
marked unconfirmed, never as plainly "leader" (issue 36: a killed leader's record outlives it by up to a lease, and
status listed it as `leader` while none was elected)."""

from __future__ import annotations

from typing import Any

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
