"""Failover on the storage side: real etcd, three real Tarantool instances (lua/init.lua, HA mode).

The service is not involved: procedures are called directly, as the service would.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import tarantool

from smartcache.devstack.stack import Tarantool, http_get_json
from tests.conftest import call, connect
from tests.integration.conftest_ha import TTL_S, HACluster, WritableSampler, eventually, ha_cluster, wait_for

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
    # A new replica set's first term is 1: terms count leader changes (an etcd revision is no term: a fresh
    # shard of an etcd that held another shard's keys started at term 770)
    assert r["term"] == 1
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
        eventually(partial(ha.answers, name, "OK", "session_get", sid))
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
        first = wait_for(
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
        refused = wait_for(lambda: ha.create_session(old)[1])
        assert refused["status"] == "NOT_LEADER"
        follower = ha.wait_role(old, "follower")
        assert follower["leader_uuid"] == ha.role(new)["instance_uuid"]  # type: ignore[index]
    assert sampler.violations == []


def test_planned_switchover_hands_over_within_a_second_and_loses_nothing(ha: HACluster) -> None:
    old = ha.leader()
    candidate = next(n for n in ha.nodes if n != old)
    candidate_uuid = ha.role(candidate)["instance_uuid"]  # type: ignore[index]
    with WritableSampler(ha) as sampler, Writer(ha) as writer:
        eventually(lambda: len(writer.acked) > 200, what="writes flowing")
        result = ha.operator_call(old, "switchover", candidate_uuid, 5000)
        assert result is not None
        assert result["status"] == "OK", result
        assert result["candidate_uuid"] == candidate_uuid
        switched_at = time.monotonic()
        eventually(lambda: len([1 for t, _ in writer.acked if t > switched_at]) > 100, what="writes on the new leader")
    assert result["pause_ms"] <= 1000, result
    assert ha.leader() == candidate
    assert ha.wait_role(old, "follower")["leader_uuid"] == candidate_uuid
    assert sampler.violations == []
    acked = [sid for _, sid in writer.acked]
    missing = [sid for sid in acked if (g := ha.call(candidate, "session_get", sid)) is None or g["status"] != "OK"]
    assert missing == []


def test_switchover_is_refused_by_a_follower_and_for_an_unknown_member(ha: HACluster) -> None:
    leader = ha.leader()
    follower = next(n for n in ha.nodes if n != leader)
    assert ha.operator_call(follower, "switchover", None, 1000)["status"] == "NOT_LEADER"  # type: ignore[index]
    assert ha.operator_call(leader, "switchover", "no-such-uuid", 1000)["status"] == "NOT_FOUND"  # type: ignore[index]
    assert ha.operator_call(leader, "switchover", None, 0)["status"] == "BAD_REQUEST"  # type: ignore[index]
    assert ha.leader() == leader


def test_sessions_are_synchronous_a_leader_without_followers_acknowledges_nothing(ha: HACluster) -> None:
    leader = ha.leader()
    followers = [n for n in ha.nodes if n != leader]
    for n in followers:
        ha.nodes[n].send_signal(signal.SIGSTOP)
    try:
        sid, r = ha.create_session(leader)
        assert r is None or r["status"] != "OK"  # the quorum timeout raises: the connector gives None
        # Tarantool 2.6 shows a write that waits for its quorum to readers on the leader (no MVCC);
        # at SC_SYNC_TIMEOUT_S it is rolled back.
        eventually(lambda: ha.status_of(leader, "session_get", sid) == "NOT_FOUND")
    finally:
        for n in followers:
            ha.nodes[n].send_signal(signal.SIGCONT)
    for n in ha.nodes:
        eventually(partial(ha.answers, n, "NOT_FOUND", "session_get", sid))


def test_an_old_leader_with_rows_nobody_has_is_diverged_until_rebuilt_by_rejoin(tmp_path: Path) -> None:
    """SC_AUTO_REJOIN=false: the manual path (test_failover_dcs.py has the instance rebuilding itself)."""
    with ha_cluster(tmp_path, SC_AUTO_REJOIN="false") as ha:
        _diverged_until_rebuilt_by_rejoin(ha)


def _diverged_until_rebuilt_by_rejoin(ha: HACluster) -> None:
    old = ha.leader()
    old_uuid = ha.role(old)["instance_uuid"]  # type: ignore[index]
    followers = [n for n in ha.nodes if n != old]
    sid, created = ha.create_session(old, "kept")
    assert created is not None
    assert created["status"] == "OK"
    # A write that only the leader gets, then the leader dies. Every write of the leader is synchronous
    # (smartcache.quorum, GUARDED): without followers it fails for want of a quorum, but its rows and the
    # ROLLBACK stay in the leader's WAL and count in its vclock. The followers are frozen until the leader
    # has dropped them (else the rows would wait in their socket buffers).
    for n in followers:
        ha.nodes[n].send_signal(signal.SIGSTOP)
    try:
        eventually(
            lambda: all(p.get("downstream_status") != "follow" for p in ha.role(old)["replication"]),  # type: ignore[index]
            what="the leader's relays to the frozen followers time out",
        )
        put = ha.call(old, "cache_put", "", "diverging-key", None, 600, "only on the old leader")
        assert put is None  # Quorum collection for a synchronous transaction is timed out
        ha.nodes[old].send_signal(signal.SIGKILL)
    finally:
        for n in followers:
            ha.nodes[n].send_signal(signal.SIGCONT)
    new = ha.leader(exclude=(old,))
    assert ha.call(new, "cache_get", "", "diverging-key")["status"] == "NOT_FOUND"  # type: ignore[index]

    ha.restart(old)
    diverged = ha.wait_role(old, "diverged")
    assert diverged["auto_rejoin"] is False
    assert diverged["writable"] is False
    assert diverged["read_only"] is True
    assert diverged["diverged"]
    status, health = http_get_json(ha.nodes[old].http_url + "/health")
    assert status == 503
    assert any("DIVERGED" in p for p in health["problems"])
    metrics = urllib.request.urlopen(ha.nodes[old].http_url + "/metrics", timeout=5).read().decode()
    assert "smartcache_tarantool_failover_diverged 1" in metrics
    _, refused = ha.create_session(old)
    assert refused is not None
    assert refused["status"] == "NOT_LEADER"
    # Not rejoined silently: the leader's followers are the two others only.
    assert ha.role(new)["replication"]  # type: ignore[index]
    assert ha.operator_call(old, "rejoin", "not-this-one")["status"] == "BAD_REQUEST"  # type: ignore[index]

    # Rebuild: the instance leaves a marker, exits 75; its supervisor (here: us) starts it again.
    answer = ha.operator_call(old, "rejoin", old_uuid)
    assert answer is not None
    assert (answer["status"], answer["exit_code"]) == ("OK", 75)
    node = ha.nodes[old]
    eventually(lambda: not node.alive(), what="exit after rejoin")
    assert node.proc is not None
    assert node.proc.returncode == 75
    ha.restart(old)
    rebuilt = ha.wait_role(old, "follower", timeout_s=60)
    assert rebuilt["leader_uuid"] == ha.role(new)["instance_uuid"]  # type: ignore[index]
    aside = list(node.data_dir.glob("aside-*"))
    assert len(aside) == 1
    assert list(aside[0].glob("*.xlog"))
    eventually(lambda: ha.status_of(old, "session_get", sid) == "OK")
    assert ha.call(old, "cache_get", "", "diverging-key")["status"] == "NOT_FOUND"  # type: ignore[index]
    status, health = http_get_json(node.http_url + "/health")
    assert status == 200, health


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 32 MiB tmpfs, unmounted afterwards (needs root, as `make test` runs here)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill_more(directory: Path) -> Path:
    """A second filler that takes every byte left."""
    filler = directory / "filler-rest"
    with filler.open("wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 65536)
    return filler


def fill(directory: Path, leave_bytes: int) -> Path:
    """Write zeros into directory until its filesystem has only leave_bytes free; returns the filler file."""
    filler = directory / "filler"
    chunk = b"\0" * (1 << 20)
    with filler.open("wb", buffering=0) as f:
        while (free := shutil.disk_usage(directory).free) > leave_bytes:
            f.write(chunk[: min(len(chunk), free - leave_bytes)])
    return filler


def test_a_leader_whose_disk_fills_up_steps_down_and_a_healthy_follower_takes_over(
    tmp_path: Path, small_disk: Path
) -> None:
    """SC_WAL_MIN_FREE_MB=8 on a 32 MiB disk: the leader steps down before its writes can fail."""
    with ha_cluster(tmp_path, data_dirs={"ha1": small_disk / "ha1"}, SC_WAL_MIN_FREE_MB="8") as ha:
        leader = ha.leader()
        if leader != "ha1":
            target = ha.role("ha1")["instance_uuid"]  # type: ignore[index]
            assert ha.operator_call(leader, "switchover", target, 5000)["status"] == "OK"  # type: ignore[index]
        assert ha.leader() == "ha1"
        with WritableSampler(ha) as sampler, Writer(ha) as writer:
            eventually(lambda: len(writer.acked) > 100, what="writes flowing")
            filler = fill(small_disk, leave_bytes=2 << 20)
            filled_at = time.monotonic()
            new = ha.leader(exclude=("ha1",))
            eventually(lambda: len([1 for t, _ in writer.acked if t > filled_at]) > 100, what="writes go on")
            broken = ha.role("ha1")
            assert broken is not None
            assert broken["role"] != "leader"
            assert broken["writable"] is False
            assert broken["wal_broken"]
            assert broken["eligible"] is False
            status, health = http_get_json(ha.nodes["ha1"].http_url + "/health")
            assert status == 503
            assert any("WAL" in p for p in health["problems"]), health["problems"]
            # Now a follower, its disk fills up completely: its applier fails to write and stops.
            rest = fill_more(small_disk)
            eventually(
                lambda: any(p.get("upstream_status") == "stopped" for p in ha.role("ha1")["replication"]),  # type: ignore[index]
                what=lambda: f"ha1's applier stops: {ha.role('ha1')}",
            )
            # The disk gets room again: the instance replicates again and may be elected again.
            rest.unlink()
            filler.unlink()
            eventually(lambda: (r := ha.role("ha1")) is not None and r["wal_broken"] is None, timeout_s=30)
        assert sampler.violations == []
        acked = [sid for _, sid in writer.acked]
        missing = [sid for sid in acked if (g := ha.call(new, "session_get", sid)) is None or g["status"] != "OK"]
        assert missing == []
        # And it follows again with everything (a stopped applier is reconnected), healthy.
        eventually(
            lambda: all(ha.status_of("ha1", "session_get", sid) == "OK" for sid in acked),
            timeout_s=30,
            what=lambda: f"ha1 replicates again: {ha.role('ha1')}",
        )
        eventually(lambda: http_get_json(ha.nodes["ha1"].http_url + "/health")[0] == 200, timeout_s=30)


def test_a_restart_writes_nothing_so_an_instance_starts_on_a_full_disk(tmp_path: Path, small_disk: Path) -> None:
    """Start-up writes only what changed: with its data dir's disk full, a standalone instance still starts."""
    solo = Tarantool.create(
        "solo", tmp_path, extra_env={"SC_DATA_DIR": str(small_disk / "solo"), "SC_WAL_MIN_FREE_MB": "8"}
    )
    solo.start()
    try:
        solo.wait_ready()
        with connect(solo) as conn:
            sid = str(uuid.uuid4())  # a stored id, as the service would give it (storage is asked directly)
            assert call(conn, "session_create", sid, "client-full", None, 600, "x")["status"] == "OK"
            before = call(conn, "role")
        assert before["role"] == "standalone"
        solo.stop()
        fill(small_disk, leave_bytes=0)
        solo.start()

        def answers() -> dict[str, Any] | None:
            try:
                with connect(solo) as conn:
                    return call(conn, "role")
            except (tarantool.error.Error, OSError):
                return None

        after = wait_for(answers, what=solo.log_tail)
        assert after["vclock"] == before["vclock"]
        with connect(solo) as conn:
            got = call(conn, "session_get", sid)
        assert got["status"] == "OK"
        status, health = http_get_json(solo.http_url + "/health")
        assert status == 503
        assert any("WAL disk almost full" in p for p in health["problems"])
    finally:
        solo.stop()
