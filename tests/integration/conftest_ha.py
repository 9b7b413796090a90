"""etcd (three members) + three Tarantool instances in HA mode (lua/init.lua with SC_ETCD), for failover tests.

Real processes on free 127.0.0.1 ports, stopped by PID. `HACluster` asks each
instance `sc.role` over iproto as the service user, finds the leader, writes
sessions, and samples "how many instances say they are writable" in the
background to check that two never do.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import tarantool

from smartcache.devstack.etcd import EtcdCluster
from smartcache.devstack.stack import Tarantool

T = TypeVar("T")

TTL_S = 3  # SC_LEADER_TTL_S for these tests: the numbers scale with it
POLL_MS = 200
NAMES = ("ha1", "ha2", "ha3")


def _until(probe: Callable[[], T | None], timeout_s: float, interval_s: float, what: str | Callable[[], str]) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not true within {timeout_s} s: {what() if callable(what) else what or probe}")
        time.sleep(interval_s)


def eventually(
    condition: Callable[[], object],
    timeout_s: float = 20.0,
    interval_s: float = 0.05,
    what: str | Callable[[], str] = "",
) -> None:
    """Poll until condition() is truthy, or fail the test at the timeout."""
    _until(lambda: True if condition() else None, timeout_s, interval_s, what or str(condition))


def wait_for(
    value: Callable[[], T | None],
    timeout_s: float = 20.0,
    interval_s: float = 0.05,
    what: str | Callable[[], str] = "",
) -> T:
    """Poll until value() is not None; returns it, or fails the test at the timeout."""
    return _until(value, timeout_s, interval_s, what)


def ha_env(etcd: EtcdCluster, cluster: str, **extra: str) -> dict[str, str]:
    return {
        "SC_ETCD": etcd.url,
        "SC_CLUSTER": cluster,
        "SC_CLUSTER_SIZE": "3",
        "SC_LEADER_TTL_S": str(TTL_S),
        "SC_FAILOVER_POLL_MS": str(POLL_MS),
        "SC_LOG_FORMAT": "plain",
        "SC_MEMTX_MEMORY": str(64 * 1024 * 1024),
        **extra,
    }


@dataclass
class HACluster:
    base: Path
    etcd: EtcdCluster
    nodes: dict[str, Tarantool]
    _local: threading.local = field(default_factory=threading.local)  # connections are per thread

    # -- talking to instances ---------------------------------------------------

    @property
    def _conns(self) -> dict[str, tarantool.Connection]:
        if not hasattr(self._local, "conns"):
            self._local.conns = {}
        return self._local.conns  # type: ignore[no-any-return]

    def _conn(self, name: str) -> tarantool.Connection:
        conn = self._conns.get(name)
        if conn is None:
            node = self.nodes[name]
            conn = tarantool.Connection(
                "127.0.0.1",
                node.port,
                user="smartcache",
                password="smartcache",
                socket_timeout=0.5,
                reconnect_max_attempts=0,
                connect_now=True,
            )
            self._conns[name] = conn
        return conn

    def close_conns(self) -> None:
        """Close this thread's connections (each thread that calls must, before it ends)."""
        for name in list(self._conns):
            self.drop_conn(name)

    def drop_conn(self, name: str) -> None:
        conn = self._conns.pop(name, None)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def operator_call(self, name: str, proc: str, *args: object) -> dict[str, Any] | None:
        """sc.<proc>(meta=None, *args) as the operator user: switchover and rejoin are the operator's only."""
        node = self.nodes[name]
        try:
            conn = tarantool.Connection(
                "127.0.0.1",
                node.port,
                user="operator",
                password="operator",
                socket_timeout=65,
                reconnect_max_attempts=0,
                connect_now=True,
            )
        except (tarantool.error.Error, OSError, tarantool.error.NetworkWarning):
            return None
        try:
            return conn.call(f"sc.{proc}", [None, *args]).data[0]  # type: ignore[no-any-return]
        except (tarantool.error.Error, OSError, tarantool.error.NetworkWarning):
            return None
        finally:
            conn.close()

    def call(self, name: str, proc: str, *args: object) -> dict[str, Any] | None:
        """sc.<proc>(meta=None, *args) on one instance; None when it cannot answer."""
        try:
            return self._conn(name).call(f"sc.{proc}", [None, *args]).data[0]  # type: ignore[no-any-return]
        except (tarantool.error.Error, OSError, tarantool.error.NetworkWarning):
            # NetworkWarning: the connector warns before it gives up, and pytest turns warnings into errors
            self.drop_conn(name)
            return None

    def role(self, name: str) -> dict[str, Any] | None:
        return self.call(name, "role")

    def roles(self) -> dict[str, dict[str, Any] | None]:
        return {name: self.role(name) for name in self.nodes}

    def leader(self, timeout_s: float = 30.0, exclude: tuple[str, ...] = ()) -> str:
        """Until exactly one instance (not excluded) says leader and writable; its name."""

        def one() -> str | None:
            writable = []
            for n in self.nodes:
                r = self.role(n) if n not in exclude else None
                if r is not None and r["role"] == "leader" and r["writable"]:
                    writable.append(n)
            return writable[0] if len(writable) == 1 else None

        return wait_for(one, timeout_s, what=lambda: f"one writable leader: {self.roles()}")

    def wait_role(self, name: str, role: str, timeout_s: float = 30.0) -> dict[str, Any]:
        def in_role() -> dict[str, Any] | None:
            r = self.role(name)
            return r if r is not None and r["role"] == role else None

        return wait_for(in_role, timeout_s, what=lambda: f"{name} is {role}: {self.roles()}")

    def answers(self, name: str, status: str, proc: str, *args: object) -> bool:
        """Does sc.<proc>(*args) on this instance answer this status now?"""
        return self.status_of(name, proc, *args) == status

    def status_of(self, name: str, proc: str, *args: object) -> str | None:
        """The status a procedure answers, None when the instance does not answer."""
        r = self.call(name, proc, *args)
        return None if r is None else str(r["status"])

    def create_session(self, name: str, data: object = None) -> tuple[str, dict[str, Any] | None]:
        sid = str(uuid.uuid4())
        return sid, self.call(name, "session_create", sid, "client-ha", None, 600, data)

    # -- process control ------------------------------------------------------------

    def restart(self, name: str) -> None:
        self.drop_conn(name)
        self.nodes[name].stop()
        self.nodes[name].start()

    def close(self) -> None:
        self.close_conns()
        for node in self.nodes.values():
            node.stop()
        self.etcd.stop()
        self.etcd.cleanup()


@contextlib.contextmanager
def ha_cluster(base: Path, data_dirs: dict[str, Path] | None = None, **extra_env: str) -> Iterator[HACluster]:
    """etcd and three empty instances; returns once one leads and two follow.

    data_dirs: a data dir of its own for some instances (say, a small tmpfs).
    """
    etcd = EtcdCluster.create(base)
    etcd.start()
    cluster = None
    try:
        etcd.wait_ready()
        env = ha_env(etcd, f"t{random.randrange(1 << 30)}", **extra_env)
        nodes = {}
        for name in NAMES:
            own = (data_dirs or {}).get(name)
            nodes[name] = Tarantool.create(name, base, extra_env={**env, "SC_DATA_DIR": str(own)} if own else env)
            if own:
                nodes[name].data_dir = own
        cluster = HACluster(base, etcd, nodes)
        for node in nodes.values():
            node.start()
        leader = cluster.leader()
        for name in NAMES:
            if name != leader:
                cluster.wait_role(name, "follower")
        yield cluster
    finally:
        if cluster is not None:
            cluster.close()
        else:
            etcd.stop()
            etcd.cleanup()


class WritableSampler(threading.Thread):
    """Asks every instance sc.role every few ms; records any moment two say writable.

    A round asks the instances one after the other; when two answer writable,
    both are asked again at once, and only a repeat counts (a leader that
    fenced between two questions and a successor that took over cannot look
    writable twice in a row: the successor is elected only after the
    predecessor's lease has run out).
    """

    def __init__(self, cluster: HACluster, interval_s: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.interval_s = interval_s
        self.stopping = threading.Event()
        self.rounds = 0
        self.violations: list[dict[str, Any]] = []

    def writable(self, names: list[str]) -> list[str]:
        out = []
        for n in names:
            r = self.cluster.role(n)
            if r is not None and r["writable"]:
                out.append(n)
        return out

    def run(self) -> None:
        while not self.stopping.is_set():
            names = list(self.cluster.nodes)
            random.shuffle(names)
            w = self.writable(names)
            if len(w) >= 2:
                again = self.writable(w)
                if len(again) >= 2:
                    self.violations.append({"at": time.monotonic(), "writable": again})
            self.rounds += 1
            time.sleep(self.interval_s)
        self.cluster.close_conns()

    def __enter__(self) -> WritableSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.join(10)
