"""A throw-away stack for benchmarks: Tarantool, the service as a child process, optionally the backend."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from smartcache.client import Client, CurveKeys
from smartcache.devstack.stack import Tarantool, free_port, wait_cluster_formed
from smartcache.wire.keys import create_key_pair

CLK_TCK = os.sysconf("SC_CLK_TCK")
#: Tarantool's memory in benchmarks: a bench run writes about a million sessions (30 min lifetime) and as many
#: events; the test stacks' 128 MiB filled up during the direct row ("Failed to allocate ... for memtx_tuple")
BENCH_MEMTX_MEMORY = str(1 << 30)


@dataclass
class ServiceUnderTest:
    proc: subprocess.Popen[bytes]
    endpoint: str
    metrics_port: int
    #: the events PUB socket (SMARTCACHE_EVENTS_LISTEN); "" when off
    events_endpoint: str = ""

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime

    def rss_bytes(self, field: str = "VmRSS") -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        return 0


@contextlib.contextmanager
def stack(
    service_env: dict[str, str] | None = None, tarantool_env: dict[str, str] | None = None
) -> Iterator[tuple[Tarantool, ServiceUnderTest]]:
    """Tarantool master + `python -m smartcache.server` on free ports; everything stopped by PID afterwards."""
    base = Path(tempfile.mkdtemp(prefix="smartcache-bench-"))
    env = {"SC_LOG_LEVEL": "4", "SC_MEMTX_MEMORY": BENCH_MEMTX_MEMORY, **(tarantool_env or {})}
    master = Tarantool.create("bench-master", base, extra_env=env)
    master.start()
    try:
        master.wait_ready()
        with service(master, base / "service.log", service_env) as sut:
            yield master, sut
    finally:
        master.stop()


@contextlib.contextmanager
def service(
    master: Tarantool, log_path: Path, env: dict[str, str] | None = None, curve: CurveKeys | None = None
) -> Iterator[ServiceUnderTest]:
    """One more `python -m smartcache.server` on free ports against master (curve: the keys to check it is up)."""
    port, metrics_port = free_port(), free_port()
    full_env = {
        **os.environ,
        "SMARTCACHE_LISTEN": f"tcp://127.0.0.1:{port}",
        "SMARTCACHE_TARANTOOL": master.address,
        "SMARTCACHE_METRICS_PORT": str(metrics_port),
        "SMARTCACHE_EVENTS_LISTEN": f"tcp://127.0.0.1:{free_port()}",  # services of a run side by side
        **(env or {}),
    }
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "smartcache.server"], env=full_env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        events = full_env["SMARTCACHE_EVENTS_LISTEN"]
        sut = ServiceUnderTest(proc, f"tcp://127.0.0.1:{port}", metrics_port, "" if events == "none" else events)
        _wait_ready(sut, curve)
        yield sut
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(30)


@contextlib.contextmanager
def ha_stack(
    ttl_s: int = 5, tarantool_env: dict[str, str] | None = None
) -> Iterator[tuple[list[Tarantool], ServiceUnderTest]]:
    """etcd + three Tarantool instances in HA mode (synchronous sessions) + the service given all three."""
    from smartcache.devstack.etcd import EtcdCluster  # noqa: PLC0415 - dev tooling, needed by this benchmark only

    base = Path(tempfile.mkdtemp(prefix="smartcache-bench-ha-"))
    etcd = EtcdCluster.create(base)  # three members, as make run and a deployment run it
    etcd.start()
    nodes: list[Tarantool] = []
    try:
        etcd.wait_ready()
        env = {
            "SC_LOG_LEVEL": "4",
            "SC_MEMTX_MEMORY": BENCH_MEMTX_MEMORY,
            "SC_ETCD": etcd.url,
            "SC_CLUSTER": "bench",
            "SC_CLUSTER_SIZE": "3",
            "SC_LEADER_TTL_S": str(ttl_s),
            **(tarantool_env or {}),
        }
        nodes = [Tarantool.create(f"bench-ha{i}", base, extra_env=env) for i in (1, 2, 3)]
        for n in nodes:
            n.start()
        # Formed (a leader, both others following it), so the first writes find their quorum at once: a row
        # measured from a cluster still forming began with a 2 s stall (EXPIRED and OUTCOME_UNKNOWN answers).
        wait_cluster_formed(nodes, threading.Event())
        addresses = {"SMARTCACHE_TARANTOOL": ",".join(n.address for n in nodes)}
        with service(nodes[0], base / "service.log", addresses) as sut:
            yield nodes, sut
    finally:
        for n in nodes:
            n.stop()
        etcd.stop()
        etcd.cleanup()


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process and its live children, from /proc (an etcd member runs under `timeout`)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / CLK_TCK
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return own + sum(process_cpu_seconds(int(c)) for c in children)


@dataclass
class ShardedStack:
    """etcd, shards of three HA instances each, and one service finding them in etcd (discovery)."""

    service: ServiceUnderTest
    #: shard -> its instances (the first shard "" when there is one replica set)
    shards: dict[str, list[Tarantool]]
    etcd_pids: list[int]
    etcd_urls: list[str]

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far: the service, each shard's leader and followers, etcd."""
        out = {"service": self.service.cpu_seconds(), "etcd": sum(process_cpu_seconds(p) for p in self.etcd_pids)}
        for name, nodes in self.shards.items():
            times = [process_cpu_seconds(n.pid) for n in nodes]
            out[f"{name or 'shard'} instances"] = sum(times)
            out[f"{name or 'shard'} busiest"] = max(times)
        return out


@contextlib.contextmanager
def sharded_stack(
    shards: int,
    ttl_s: int = 5,
    buckets: int = 1024,
    *,
    mapped: int | None = None,
    memtx_memory: str = BENCH_MEMTX_MEMORY,
    data_dir: str | None = None,
) -> Iterator[ShardedStack]:
    """Like ha_stack, but the service discovers the instances in etcd and, with shards > 1, the cluster is
    sharded by client over that many trios (`cluster init --shards`); shards = 1 is the same path unsharded.
    mapped: how many of the trios the bucket map names at the start (the others wait for `shard add`);
    data_dir: where the instances' files go (default the temp dir)."""
    from smartcache.devstack.etcd import EtcdCluster  # noqa: PLC0415 - dev tooling, needed by this benchmark only
    from smartcache.ops import cluster  # noqa: PLC0415 - the server extra's connector

    base = Path(tempfile.mkdtemp(prefix="smartcache-bench-shards-", dir=data_dir))
    etcd = EtcdCluster.create(base)
    etcd.start()
    names = [f"s{k}" for k in range(1, shards + 1)] if shards > 1 else [""]
    trios: dict[str, list[Tarantool]] = {}
    try:
        etcd.wait_ready()
        for name in names:
            env = {
                "SC_LOG_LEVEL": "4",
                "SC_MEMTX_MEMORY": memtx_memory,
                "SC_ETCD": etcd.url,
                "SC_CLUSTER": f"bench.{name}" if name else "bench",
                "SC_CLUSTER_SIZE": "3",
                "SC_LEADER_TTL_S": str(ttl_s),
            }
            trios[name] = [Tarantool.create(f"bench-{name or 'one'}-{i}", base, extra_env=env) for i in (1, 2, 3)]
            for n in trios[name]:
                n.start()
        for trio in trios.values():
            wait_cluster_formed(trio, threading.Event())
        if shards > 1:
            access = cluster.Access(
                addresses=(),
                user="operator",
                password=os.environ.get("SC_OPERATOR_PASSWORD") or "operator",
                etcd=[m.url for m in etcd.members],
                cluster="bench",
            )
            made = cluster.shards_init(access, names[: mapped or len(names)], buckets)
            if made.get("status") != "OK":
                raise RuntimeError(f"cluster init --shards: {made}")
        first = next(iter(trios.values()))[0]
        env = {"SMARTCACHE_TARANTOOL": "", "SMARTCACHE_ETCD": etcd.url, "SMARTCACHE_CLUSTER": "bench"}
        with service(first, base / "service.log", env) as sut:
            yield ShardedStack(sut, trios, [m.pid for m in etcd.members], [m.url for m in etcd.members])
    finally:
        for trio in trios.values():
            for n in trio:
                n.stop()
        etcd.stop()
        etcd.cleanup()


def curve_keys(directory: Path) -> tuple[dict[str, str], CurveKeys]:
    """A service key pair and one allowed client: the service's environment and the client's keys."""
    (directory / "clients").mkdir(parents=True)
    create_key_pair(directory, "service")
    _, secret = create_key_pair(directory, "bench")
    (directory / "clients" / "bench.key").write_text((directory / "bench.key").read_text())
    env = {
        "SMARTCACHE_CURVE_SECRET_KEY_FILE": str(directory / "service.key_secret"),
        "SMARTCACHE_CURVE_CLIENTS_DIR": str(directory / "clients"),
    }
    return env, CurveKeys.from_files(directory / "service.key", secret)


def _wait_ready(sut: ServiceUnderTest, curve: CurveKeys | None = None, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    with Client(sut.endpoint, timeout_s=0.5, curve=curve) as c:
        while True:
            try:
                c.device_lookup("bench-readiness")
                return
            except Exception:
                if time.monotonic() > deadline or sut.proc.poll() is not None:
                    raise
