"""`make run` survives what it promises to: kill -9 of the Tarantool leader (a failover; the old leader is
restarted and follows), kill -9 of an etcd member (restarted, the cluster whole again), Ctrl-C at any
moment of start-up or of steady state leaves no child behind, and a make run on the var/ of a two-shard one
starts both shards (or refuses a shard count that is not the one var/ holds, in one sentence)."""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from smartcache.devstack.plan import (
    DEFAULT_EVENTS_PORT,
    DEFAULT_LISTEN_PORT,
    DEFAULT_PORTS,
    MAX_PORT_OFFSET,
    SHARD_PORT_STEP,
)
from smartcache.devstack.sockets import ephemeral_range, listens, port_is_free
from smartcache.wire.buckets import bucket_of
from tests.helpers import eventually

START_TIMEOUT_S = 90.0
#: make run's lease (SC_LEADER_TTL_S default): a failover takes TTL + 2 s at most (docs/operations.md)
TTL_S = 5.0


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _descendants(pid: int) -> set[int]:
    """Every process below pid (children, theirs...), from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat(int(stat.parent.name))
        if fields is not None:
            parents[int(stat.parent.name)] = int(fields[1])
    out, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - out
        out |= frontier
    return out


def _listener(pids: set[int], port: int) -> int | None:
    """Which of pids listens on port (make run's own check: devstack.listens)."""

    return next((p for p in pids if listens(p, port)), None)


#: shards make run may be asked for here (SMARTCACHE_SHARDS): their ports step by SHARD_PORT_STEP
MOVED_SHARDS = 3


def _moved_env(var: Path) -> tuple[dict[str, str], int]:
    """make run's environment on a random port offset whose every port (each shard's too) is free and below
    the kernel's ephemeral range: a port there is never the local port of someone's outgoing connection."""
    clean = {k: v for k, v in os.environ.items() if k not in DEFAULT_PORTS and not k.startswith("SMARTCACHE_")}
    base = [*DEFAULT_PORTS.values(), DEFAULT_LISTEN_PORT, DEFAULT_EVENTS_PORT]
    every = [p + SHARD_PORT_STEP * k for p in base for k in range(MOVED_SHARDS)]
    highest = min(MAX_PORT_OFFSET, ephemeral_range()[0] - 1 - max(every))
    for _ in range(100):
        offset = random.randrange(10000, highest)
        if all(port_is_free(p + offset) for p in every):
            return {**clean, "SMARTCACHE_PORT_OFFSET": str(offset), "SMARTCACHE_VAR": str(var)}, offset
    raise AssertionError("no free offset")


@dataclass
class MakeRun:
    """`python -m smartcache.devstack` on a moved offset, its output in files, every process it ever had."""

    var: Path
    #: more of make run's variables (SMARTCACHE_SHARDS=2: two trios, sharded)
    extra_env: dict[str, str] = field(default_factory=dict)
    #: the environment of an earlier MakeRun to start on again (its offset); None: a new free offset
    base_env: dict[str, str] | None = None
    env: dict[str, str] = field(init=False)
    offset: int = field(init=False)
    proc: subprocess.Popen[bytes] = field(init=False)
    seen: set[int] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.var.mkdir(parents=True, exist_ok=True)
        if self.base_env is None:
            self.env, self.offset = _moved_env(self.var)
        else:
            self.env, self.offset = dict(self.base_env), int(self.base_env["SMARTCACHE_PORT_OFFSET"])
        self.env.update(self.extra_env)
        with (self.var / "out.txt").open("wb") as out, (self.var / "err.txt").open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "smartcache.devstack"], env=self.env, stdout=out, stderr=err
            )
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.05) and self.proc.poll() is None:
            self.seen |= _descendants(self.proc.pid)

    @property
    def out(self) -> str:
        return (self.var / "out.txt").read_text(errors="replace")

    @property
    def err(self) -> str:
        return (self.var / "err.txt").read_text(errors="replace")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "ready; stop with" not in self.out:
            assert self.proc.poll() is None, f"make run exited {self.proc.returncode}:\n{self.out}\n{self.err}"
            assert time.monotonic() < deadline, f"make run not ready in {START_TIMEOUT_S} s:\n{self.err}"
            time.sleep(0.1)

    def port(self, name: str) -> int:
        return DEFAULT_PORTS[name] + self.offset

    def cli(self, *args: str, ok: tuple[int, ...] = (0,), timeout_s: float = 30) -> dict[str, Any]:
        cli = Path(sys.executable).parent / "smartcache-cli"
        done = subprocess.run(
            [str(cli), *args], env=self.env, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        assert done.returncode in ok, f"{args}: exit {done.returncode}\n{done.stdout}{done.stderr}"
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    def status(self) -> dict[str, Any]:
        return self.cli("--timeout", "1", "cluster", "status", ok=(0, 1))

    def write(self) -> str | None:
        """A session through the service; its id, None when the write was not acknowledged."""
        doc = self.cli("--timeout", "2", "session-create", f"restart-{uuid.uuid4()}", ok=(0, 1, 3, 4))
        return doc.get("session_id") if doc.get("status") == "OK" else None

    def ctrl_c(self, timeout_s: float = 60) -> int:
        self.seen |= _descendants(self.proc.pid)
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout_s)
        finally:
            self._stop.set()

    def close(self) -> None:
        self._stop.set()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for pid in self.seen:  # by PID: nothing else
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MakeRun]:
    run = MakeRun(tmp_path_factory.mktemp("makerun"))
    try:
        run.wait_ready()
        yield run
        assert run.ctrl_c() == 0, run.err
        assert not [p for p in run.seen if _alive(p)], "a child outlived make run"
    finally:
        run.close()


def test_kill_9_of_the_leader_fails_over_and_the_old_leader_comes_back_as_a_follower(stack: MakeRun) -> None:
    before = stack.status()
    assert before["healthy"], before
    old = before["leader"]
    written = stack.write()
    assert written is not None
    pid = _listener(_descendants(stack.proc.pid), int(old.rsplit(":", 1)[1]))
    assert pid is not None
    name = f"tarantool-{int(old.rsplit(':', 1)[1]) - stack.port('SC_PORT_1') + 1}"

    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    eventually(stack.write, TTL_S + 15, interval_s=0.1, what="a write acknowledged through the service")
    resumed = time.monotonic() - killed
    print(f"writes resumed {resumed:.1f} s after kill -9 of the leader")  # the number, with -s

    def old_follows() -> bool:
        s = stack.status()
        roles = {i["address"]: i.get("role") for i in s["instances"]}
        return s["healthy"] and s["leader"] != old and roles[old] == "follower"

    eventually(old_follows, 60, interval_s=0.5, what=f"{old} restarted and following the new leader")
    assert stack.proc.poll() is None, stack.err  # make run kept everything else running
    assert f"{name} (pid {pid}) killed by SIGKILL; the others keep running" in stack.err
    assert f"{name} restarted (pid " in stack.err
    eventually(lambda: f"{name} is back (follower)" in stack.err, 30, what="make run saying it is back")
    assert stack.cli("session-get", written)["status"] == "OK"  # acknowledged before the kill, kept


def test_kill_9_of_the_etcd_leader_restarts_it_and_writes_go_on(stack: MakeRun) -> None:
    before = stack.status()["etcd"]
    assert before["healthy"], before
    name, endpoint = before["leader"], before["leader_endpoint"]
    member_pid = _listener(_descendants(stack.proc.pid), int(endpoint.rsplit(":", 1)[1]))
    assert member_pid is not None

    os.kill(member_pid, signal.SIGKILL)
    eventually(lambda: f"{name} restarted (pid " in stack.err, 30, what=f"make run restarting {name}")
    assert stack.proc.poll() is None, stack.err
    eventually(lambda: stack.status()["etcd"]["healthy"], 60, interval_s=0.5, what="all three etcd members healthy")
    members = {m["name"]: m["state"] for m in stack.status()["etcd"]["members"]}
    assert sorted(members) == ["etcd-1", "etcd-2", "etcd-3"]
    eventually(stack.write, 30, interval_s=0.2, what="writes through the service")
    eventually(lambda: stack.status()["healthy"], 30, interval_s=0.5, what="the whole cluster healthy")


def test_make_run_refuses_the_old_single_etcd_port_variable(tmp_path: Path) -> None:
    env, _ = _moved_env(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "smartcache.devstack"],
        env={**env, "ETCD_PORT": "2379"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "ETCD_PORT_1..3" in done.stderr
    assert "ETCD_PEER_PORT_1..3" in done.stderr


@pytest.mark.parametrize("moment_s", [0.5, 2.0, 5.0, "ready"])
def test_ctrl_c_at_any_moment_of_start_up_or_steady_state_leaves_no_child(tmp_path: Path, moment_s: object) -> None:
    run = MakeRun(tmp_path)
    try:
        if moment_s == "ready":
            run.wait_ready()
            time.sleep(random.uniform(0.0, 1.0))
        else:
            assert isinstance(moment_s, float)
            time.sleep(moment_s + random.uniform(0.0, 0.5))
        assert run.ctrl_c() in (0, -signal.SIGINT), run.err  # -SIGINT: it came before python's own start
        left = [p for p in run.seen if _alive(p)]
        assert not left, f"children left after Ctrl-C: {left}\n{run.err}"
    finally:
        run.close()


def _client_of(shard: str, ranges: list[list[Any]]) -> str:
    """A client id whose bucket the map gives to shard."""
    count = ranges[-1][1] + 1
    for n in range(10_000):
        client = f"client-{shard}-{n}"
        b = bucket_of(client, count)
        if any(first <= b <= last and owner == shard for first, last, owner in ranges):
            return client
    raise AssertionError(f"no client of {shard} in {ranges}")


def _exits(run: MakeRun, timeout_s: float = 60) -> int:
    """make run's exit code once it stopped by itself; every process it had gone by then."""
    try:
        code = run.proc.wait(timeout_s)
    finally:
        run._stop.set()
    assert not [p for p in run.seen if _alive(p)], f"a child outlived make run:\n{run.err}"
    return code


def test_make_run_on_the_var_of_a_two_shard_run_starts_both_shards_and_refuses_one(tmp_path: Path) -> None:
    """SMARTCACHE_SHARDS=2 make run, Ctrl-C, then make run on the same var/: both shards start, their sessions
    kept and writable; SMARTCACHE_SHARDS=1 on it is refused in one sentence, before any Tarantool starts."""
    started = time.monotonic()
    first = MakeRun(tmp_path, extra_env={"SMARTCACHE_SHARDS": "2"})
    try:
        first.wait_ready()
        ranges = first.status()["buckets"]["ranges"]
        clients = {shard: _client_of(shard, ranges) for shard in ("s1", "s2")}
        kept = {s: first.cli("session-create", c)["session_id"] for s, c in clients.items()}
        assert first.ctrl_c() == 0, first.err
    finally:
        first.close()
    env = {k: v for k, v in first.env.items() if k != "SMARTCACHE_SHARDS"}

    one = MakeRun(tmp_path, base_env=env, extra_env={"SMARTCACHE_SHARDS": "1"})
    try:
        assert _exits(one) == 1, one.err
        (said,) = one.err.splitlines()
        assert said == (
            f"make run: {tmp_path} holds a topology of 2 shards (etcd's bucket map names s1, s2), not the 1"
            " SMARTCACHE_SHARDS=1 asks for: run `SMARTCACHE_SHARDS=2 make run`, or `make reset-data` to start over"
        )
        assert not any(listens(p, first.port("SC_PORT_1")) for p in one.seen)
    finally:
        one.close()

    again = MakeRun(tmp_path, base_env=env)
    try:
        again.wait_ready()
        assert f"s1, s2, the 2 that {tmp_path} holds (etcd's bucket map)" in again.out  # the banner says why
        for shard, client in clients.items():
            assert again.cli("session-get", kept[shard])["status"] == "OK", shard  # kept on its shard
            assert again.cli("session-create", client)["status"] == "OK", shard  # and writable
        assert again.status()["healthy"]
        assert again.ctrl_c() == 0, again.err
    finally:
        again.close()
    print(f"two runs and a refusal in {time.monotonic() - started:.1f} s")  # the number, with -s


def _owners(ranges: list[list[Any]]) -> set[str]:
    return {owner for _, _, owner in ranges}


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_more_shards_asked_of_one_replica_set_grow_it_the_documented_way_and_keep_its_sessions(
    tmp_path: Path,
) -> None:
    """make run, Ctrl-C, then SMARTCACHE_SHARDS=2 make run on the same var/: the one replica set is shard s1 with
    its sessions, s2 joins the bucket map holding nothing; `cluster rebalance` (docs/sharding.md) moves buckets to
    it, every session readable all along; then make run alone starts both shards."""
    first = MakeRun(tmp_path)
    try:
        first.wait_ready()
        kept = [first.cli("session-create", f"grow-{n}")["session_id"] for n in range(24)]
        assert first.ctrl_c() == 0, first.err
    finally:
        first.close()
    env = dict(first.env)

    grown = MakeRun(tmp_path, base_env=env, extra_env={"SMARTCACHE_SHARDS": "2"})
    try:
        grown.wait_ready()
        assert "it is shard s1 now, its data where it was; s2 joined the bucket map holding no bucket" in grown.out
        assert "tarantool-1 " in grown.out  # s1's instances are the one replica set's, their data where it was
        assert _owners(grown.status()["buckets"]["ranges"]) == {"s1"}
        assert [grown.cli("session-get", s)["status"] for s in kept] == ["OK"] * len(kept)
        cli = Path(sys.executable).parent / "smartcache-cli"
        # the command the banner names, as it names it (its --reason included)
        named = re.search(r"`\.venv/bin/smartcache-cli (cluster --cluster make-run rebalance [^`]*)`", grown.out)
        assert named is not None, grown.out[-2000:]
        moved = subprocess.run(
            [str(cli), *shlex.split(named.group(1)), "--json"],
            env=grown.env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert moved.returncode == 0, moved.stdout + moved.stderr
        eventually(lambda: _owners(grown.status()["buckets"]["ranges"]) == {"s1", "s2"}, 30, what="the map")
        assert [grown.cli("session-get", s)["status"] for s in kept] == ["OK"] * len(kept)
        assert grown.ctrl_c() == 0, grown.err
    finally:
        grown.close()

    again = MakeRun(tmp_path, base_env=env)
    try:
        again.wait_ready()
        assert f"s1, s2, the 2 that {tmp_path} holds (etcd's bucket map)" in again.out
        assert [again.cli("session-get", s)["status"] for s in kept] == ["OK"] * len(kept)
        assert again.status()["healthy"]
        assert again.ctrl_c() == 0, again.err
    finally:
        again.close()
