"""The two-shard Docker deployment (docker/compose.shards.yml): `make docker-test`'s second stack.

docker/test.sh starts it after the one-replica-set smoke suite, on fresh volumes, with the same
images: tarantool-1..3 are shard s1, tarantool-4..6 shard s2, `shards-init` makes the bucket map
once. Checked from outside, through the published ports: the cluster status an operator reads
lists both shards healthy, sessions created through both services land on the shard their
client's bucket names (asked of each shard's leader, not of the service), and read back.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import tarantool

from smartcache.client import Client
from smartcache.wire import buckets
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
        assert (call(leaders[home], "session_locate", sid) or {}).get("status") == "OK", f"{sid} not on {home}"
        assert (call(leaders[other], "session_get", sid) or {}).get("status") == "WRONG_BUCKET"
    assert set(made.values()) == set(SHARDS), "forty clients land on both shards"
