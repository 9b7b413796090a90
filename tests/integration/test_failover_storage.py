"""Failover on the storage side: real etcd, three real Tarantool instances (lua/init.lua, HA mode).

The service is not involved: procedures are called directly, as the service would.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest_ha import TTL_S, HACluster, WritableSampler, eventually, ha_cluster

pytestmark = pytest.mark.slow


@pytest.fixture
def ha(tmp_path: Path) -> Iterator[HACluster]:
    """A fresh cluster per test: the tests kill, freeze and rebuild its members."""
    with ha_cluster(tmp_path) as c:
        yield c


class Writer(threading.Thread):
    """Creates sessions on whichever instance leads, as fast as it can; remembers every acknowledged one."""

    def __init__(self, cluster: HACluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.stopping = threading.Event()
        self.acked: list[tuple[float, str]] = []
        self.target: str | None = None
        self.last: object = None

    def run(self) -> None:
        while not self.stopping.is_set():
            if self.target is None:
                for name in self.cluster.nodes:
                    r = self.cluster.role(name)
                    if r is not None and r["writable"]:
                        self.target = name
                        break
                else:
                    time.sleep(0.02)
                    continue
            sid, r = self.cluster.create_session(self.target, {"n": len(self.acked)})
            self.last = (self.target, r)
            if r is not None and r["status"] == "OK":
                self.acked.append((time.monotonic(), sid))
            else:
                self.target = None
        self.cluster.close_conns()

    def __enter__(self) -> Writer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.join(10)


def test_three_empty_instances_elect_one_leader_that_followers_replicate(ha: HACluster) -> None:
    leader = ha.leader()
    roles = ha.roles()
    r = roles[leader]
    assert r is not None
    assert r["role"] == "leader"
    assert r["term"] > 0
    assert 0 < r["lease_left_ms"] <= TTL_S * 1000
    assert r["leader_uuid"] == r["instance_uuid"]
    assert {"vclock", "uri", "leader_uri", "sync_queue_len", "replication"} <= r.keys()
    followers = [n for n in ha.nodes if n != leader]
    for name in followers:
        f = roles[name]
        assert f is not None
        assert (f["role"], f["writable"], f["leader_uuid"], f["term"]) == (
            "follower",
            False,
            r["instance_uuid"],
            r["term"],
        )
    sid, created = ha.create_session(leader, {"x": 1})
    assert created is not None
    assert created["status"] == "OK"
    for name in followers:
        eventually(lambda n=name: (g := ha.call(n, "session_get", sid)) is not None and g["status"] == "OK")
        _, refused = ha.create_session(name)
        assert refused is not None
        assert refused["status"] == "NOT_LEADER"


def test_kill_9_of_the_leader_under_load_loses_no_acknowledged_write(ha: HACluster) -> None:
    """A new leader writes within TTL + 2 s, has every acknowledged session, and no two are ever writable."""
    old = ha.leader()
    with WritableSampler(ha) as sampler, Writer(ha) as writer:
        eventually(lambda: len(writer.acked) > 200, what=lambda: f"writes flowing: {writer.last}, {ha.roles()}")
        killed_at = time.monotonic()
        ha.nodes[old].send_signal(signal.SIGKILL)
        new = ha.leader(exclude=(old,))
        first = eventually(
            lambda: next((t for t, _ in writer.acked if t > killed_at), None), what="a write after the kill"
        )
        eventually(lambda: len([1 for t, _ in writer.acked if t > killed_at]) > 50)
    pause = first - killed_at
    assert pause < TTL_S + 2, f"first write {pause:.2f} s after kill -9"
    assert sampler.violations == []
    assert sampler.rounds > 20
    acked = [sid for _, sid in writer.acked]
    missing = [sid for sid in acked if (g := ha.call(new, "session_get", sid)) is None or g["status"] != "OK"]
    assert missing == [], f"{len(missing)} of {len(acked)} acknowledged sessions lost"


def test_a_leader_frozen_for_two_ttls_refuses_writes_when_it_resumes(ha: HACluster) -> None:
    old = ha.leader()
    with WritableSampler(ha) as sampler:
        ha.nodes[old].send_signal(signal.SIGSTOP)
        try:
            new = ha.leader(exclude=(old,))
            frozen_until = time.monotonic() + 2 * TTL_S
            eventually(lambda: time.monotonic() >= frozen_until, timeout_s=3 * TTL_S, interval_s=0.1)
        finally:
            ha.nodes[old].send_signal(signal.SIGCONT)
        # The first thing it answers after SIGCONT: no write.
        ha.drop_conn(old)
        _, refused = eventually(lambda: (r := ha.create_session(old))[1] is not None and r)
        assert refused is not None
        assert refused["status"] == "NOT_LEADER"
        follower = ha.wait_role(old, "follower")
        assert follower["leader_uuid"] == ha.role(new)["instance_uuid"]  # type: ignore[index]
    assert sampler.violations == []
