"""The two-shard Docker deployment (docker/compose.shards.yml): `make docker-test`'s second stack.

docker/test.sh starts it after the one-replica-set smoke suite, on fresh volumes, with the same
images: tarantool-1..3 are shard s1, tarantool-4..6 shard s2, `shards-init` makes the bucket map
once. Checked from outside, through the published ports: the cluster status an operator reads
lists both shards healthy, sessions created through both services land on the shard their
client's bucket names (asked of each shard's leader, not of the service), and read back. Last,
a third shard (tarantool-7..9, profile third-shard) is started, added to the map and filled by a
rebalance while both services take writes.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import tarantool

from smartcache.client import Client
from smartcache.wire import buckets, sessionkeys
from smartcache.wire.errors import RequestError

COMPOSE = shlex.split(os.environ.get("SMOKE_COMPOSE", "docker compose"))
SECRETS_DIR = os.environ.get("SMARTCACHE_SECRETS_DIR", "")
SHARDS = {"s1": (1, 2, 3), "s2": (4, 5, 6)}
BUCKETS = 1024  # what compose.shards.yml's shards-init gives
READY_TIMEOUT_S = 180.0

T = TypeVar("T")


def secret(name: str, variable: str, default: str) -> str:
    if SECRETS_DIR:
        return Path(SECRETS_DIR, name).read_text().strip()
    return os.environ.get(variable) or default


SERVICE_PASSWORD = secret("service_password", "SC_SERVICE_PASSWORD", "smartcache")
#: the services' session key (docker/make-secrets.sh's session_key; unset: the all-zero development key)
SESSION_KEY = bytes.fromhex(secret("session_key", "SMARTCACHE_SESSION_KEY", "00" * 32))


def stored_id(sid: str) -> str:
    """The id storage keeps a session under (PROTOCOL.md section 4), derived as the services derive it: the
    bucket bits stay, so it routes as the session id does."""
    return str(uuid.UUID(bytes=sessionkeys.derive(SESSION_KEY, uuid.UUID(sid).bytes)))


BOTH = f"tcp://127.0.0.1:{os.environ['SERVICE_1_PORT']},tcp://127.0.0.1:{os.environ['SERVICE_2_PORT']}"


def eventually(probe: Callable[[], T | None], timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
            last = value
        except (OSError, ValueError, KeyError, RequestError, subprocess.SubprocessError) as e:
            last = f"{type(e).__name__}: {e}"
        time.sleep(1.0)
    raise AssertionError(f"not within {timeout_s:g} s: {what} (last: {last})")


def cluster_status() -> dict[str, Any]:
    argv = [*COMPOSE, "run", "--rm", "-T", "cli", "cluster", "status"]
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), f"cluster status: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def call(n: int, procedure: str, *args: Any) -> dict[str, Any] | None:
    """sc.<procedure> on tarantool-n through its published port, as the service user; None if it cannot."""
    try:
        conn = tarantool.Connection(
            "127.0.0.1",
            int(os.environ[f"TARANTOOL_{n}_PORT"]),
            user="smartcache",
            password=SERVICE_PASSWORD,
            connection_timeout=2,
            socket_timeout=5,
        )
    except (tarantool.error.Error, OSError):
        return None
    try:
        return conn.call(f"sc.{procedure}", [None, *args]).data[0]  # type: ignore[no-any-return]
    except (tarantool.error.Error, OSError):
        return None
    finally:
        conn.close()


def leader_of(shard: str) -> int:
    def one() -> int | None:
        writable = [n for n in SHARDS[shard] if ((call(n, "role") or {}).get("writable"))]
        return writable[0] if len(writable) == 1 else None

    return eventually(one, 60, f"one writable leader of {shard}")


def test_both_shards_are_healthy_in_the_status_operators_read() -> None:
    def healthy() -> dict[str, Any] | None:
        s = cluster_status()
        return s if s.get("healthy") and set(s.get("shards") or ()) == set(SHARDS) else None

    status = eventually(healthy, READY_TIMEOUT_S, "cluster status: two shards, healthy")
    assert all(len(status["shards"][s]["instances"]) == 3 for s in SHARDS)


def test_sessions_land_on_their_client_s_shard_and_read_back() -> None:
    with Client(BOTH, timeout_s=5) as c:
        eventually(lambda: c.session_create("docker-shard-probe").ok, READY_TIMEOUT_S, "a session created")
        made: dict[str, str] = {}
        for i in range(40):
            client = f"docker-shard-{i}-{uuid.uuid4().hex[:6]}"
            r = c.session_create(client, data={"i": i})
            assert r.ok, r
            assert r.session_id is not None
            assert buckets.session_bucket(r.session_id.bytes) == buckets.bucket_of(client, BUCKETS)
            made[str(r.session_id)] = "s1" if buckets.bucket_of(client, BUCKETS) < BUCKETS // 2 else "s2"
        for sid in made:
            assert c.session_get(uuid.UUID(sid)).ok
    leaders = {s: leader_of(s) for s in SHARDS}
    for sid, home in made.items():
        other = "s2" if home == "s1" else "s1"
        stored = stored_id(sid)
        assert (call(leaders[home], "session_locate", stored) or {}).get("status") == "OK", f"{sid} not on {home}"
        assert (call(leaders[other], "session_get", stored) or {}).get("status") == "WRONG_BUCKET"
    assert set(made.values()) == set(SHARDS), "forty clients land on both shards"


THIRD = (7, 8, 9)  # shard s3: compose.shards.yml's profile third-shard


def say(message: str) -> None:
    print(f"  shards: {message}")


def cli(*args: str, timeout_s: float = 600) -> dict[str, Any]:
    argv = [*COMPOSE, "run", "--rm", "-T", "cli", *args]
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, f"{' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr[-2000:]}"
    return json.loads(done.stdout)  # type: ignore[no-any-return]


class Writer(threading.Thread):
    """Sessions of 300 clients created through both services until stopped; what was acknowledged."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.acked: list[tuple[str, str]] = []
        self.failed: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with Client(BOTH, timeout_s=5) as c:
            i = 0
            while not self.stop.is_set():
                client = f"docker-move-{i % 300}"
                i += 1
                try:
                    r = c.session_create(client, data={"i": i})
                except RequestError as e:
                    self.failed.append(e.transport_error)
                    continue
                if r.ok and r.session_id is not None:
                    self.acked.append((str(r.session_id), client))
                else:
                    self.failed.append(str(r.status))


def add_s3_and_rebalance() -> dict[str, Any]:
    up = [*COMPOSE, "--profile", "third-shard", "up", "-d", "--no-build", *(f"tarantool-{n}" for n in THIRD)]
    subprocess.run(up, check=True, capture_output=True, timeout=300)

    def s3_leader() -> int | None:
        writable = [n for n in THIRD if ((call(n, "role") or {}).get("writable"))]
        return writable[0] if len(writable) == 1 else None

    eventually(s3_leader, READY_TIMEOUT_S, "shard s3 elects a leader")
    added = cli("cluster", "shard", "add", "s3", "--reason", "docker test: a third shard")
    assert added["shards"] == ["s1", "s2", "s3"], added
    return cli("cluster", "rebalance", "--parallel", "2", "--reason", "docker test: fill s3")


def test_a_third_shard_is_added_and_a_rebalance_moves_a_third_of_the_buckets_under_load() -> None:
    """An operator starts a third replica set (profile third-shard), adds it to the map, and rebalances while
    both services take writes: every session acknowledged before, during and after is read back, from the
    shard the map names (asked of that shard's leader), and every shard holds a third of the buckets."""
    writer = Writer()
    writer.start()
    try:
        moved = add_s3_and_rebalance()
        time.sleep(2.0)
    finally:
        writer.stop.set()
        writer.join(30)
    assert moved["status"] == "OK", moved
    assert moved["moved"] == 341, moved  # 512 + 512 -> 342 + 341 + 341
    say(f"rebalance moved {moved['moved']} buckets, {moved['rows']} rows in {moved['seconds']} s "
        f"({moved['buckets_per_s']} buckets/s, {moved['rows_per_s']} rows/s), pause {moved['paused_ms']}")  # fmt: skip
    status = eventually(lambda: (s := cluster_status()).get("healthy") and s, 120, "three healthy shards")
    assert set(status["shards"]) == {"s1", "s2", "s3"}
    held = {name: shard["buckets"]["active"] for name, shard in status["shards"].items()}
    assert sorted(held.values()) == [341, 341, 342], held
    assert all(not shard["buckets"]["moving"] for shard in status["shards"].values())
    owner = {b: s for first, last, s in status["buckets"]["ranges"] for b in range(first, last + 1)}
    members = {**SHARDS, "s3": THIRD}
    leaders = {s: next(n for n in members[s] if (call(n, "role") or {}).get("writable")) for s in members}
    assert len(writer.acked) > 100, (len(writer.acked), writer.failed[:5])
    with Client(BOTH, timeout_s=5) as c:
        for sid, client in writer.acked:
            assert c.session_get(uuid.UUID(sid)).ok, f"{sid} acknowledged, not read back"
            home = owner[buckets.bucket_of(client, BUCKETS)]
            located = call(leaders[home], "session_locate", stored_id(sid)) or {}
            assert located.get("status") == "OK", f"{sid} not on {home}"
    say(f"{len(writer.acked)} sessions written during the move, all read back; {len(writer.failed)} not acknowledged")
