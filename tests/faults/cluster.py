"""The system under test, each process on a host of its own (devtools/netns.py).

etcd, three Tarantool instances in HA mode (lua/init.lua) and two service
instances (``python -m service``), every one inside its network namespace with
the address of its host and the production ports (2379, 3301/8301, 5555/9105).
Processes are devstack ``Child``ren: started by us, stopped by PID, gone when
we are (PR_SET_PDEATHSIG). The test itself is the observer: it talks to every
process over a link that faults never cut.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import tarantool

from devtools.devstack import LUA_INIT, Child, http_get_json
from devtools.etcd import Etcd
from devtools.netns import Network
from tests.integration.conftest_ha import ha_env

T = TypeVar("T")

TTL_S = 3  # SC_LEADER_TTL_S: every duration of the scenarios scales with it
NODES = ("t1", "t2", "t3")
SERVICES = ("s1", "s2")
HOSTS = ["etcd", *NODES, *SERVICES]
IPROTO_PORT, HTTP_PORT = 3301, 8301
SERVICE_PORT, METRICS_PORT = 5555, 9105
ETCD_PORT, ETCD_PEER_PORT = 2379, 2380
ETCD_LIFETIME_S = 1800  # `timeout` ends a forgotten etcd
ASK_TIMEOUT_S = 0.3  # the observer's iproto calls: a stalled instance is "no answer", not a hang
USER = PASSWORD = "smartcache"
HTTP_TOKEN = "faults-token"


def until(
    probe: Callable[[], T | None], timeout_s: float, what: str | Callable[[], str], interval_s: float = 0.05
) -> T:
    """Poll until probe() is not None; its value, or AssertionError naming what did not happen."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what() if callable(what) else what}")
        time.sleep(interval_s)


@dataclass
class NsEtcd(Etcd):
    """devtools.etcd.Etcd on a host of its own (its address instead of 127.0.0.1)."""

    ip: str = ""

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{self.client_port}"


@dataclass
class Node:
    """One Tarantool instance: its process, host address and data dir."""

    name: str
    ip: str
    child: Child
    data_dir: Path

    @property
    def address(self) -> str:
        return f"{self.ip}:{IPROTO_PORT}"

    @property
    def http_url(self) -> str:
        return f"http://{self.ip}:{HTTP_PORT}"


@dataclass
class ServiceProc:
    name: str
    ip: str
    child: Child

    @property
    def endpoint(self) -> str:
        return f"tcp://{self.ip}:{SERVICE_PORT}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.ip}:{METRICS_PORT}/metrics"

    def ready(self) -> bool:
        with contextlib.suppress(OSError, ValueError):
            status, _ = http_get_json(f"http://{self.ip}:{METRICS_PORT}/health/ready", timeout_s=1.0)
            return status == 200
        return False


def http_text(url: str, timeout_s: float = 1.0) -> str | None:
    """GET a page as text (any status); None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return str(r.read().decode())
    except urllib.error.HTTPError as e:
        return str(e.read().decode())
    except (OSError, ValueError):
        return None


def metric_value(text: str | None, name: str, labels: dict[str, str] | None = None) -> float | None:
    """Sum of the samples of one series in Prometheus text (None: no such sample)."""
    if text is None:
        return None
    total, seen = 0.0, False
    want = [f'{k}="{v}"' for k, v in (labels or {}).items()]
    for line in text.splitlines():
        if line.startswith("#") or not (line.startswith((name + " ", name + "{"))):
            continue
        series, _, value = line.rpartition(" ")
        if all(w in series for w in want):
            total += float(value)
            seen = True
    return total if seen else None


@dataclass
class Cluster:
    """etcd + t1..t3 + s1, s2 on the hosts of one Network; ``close()`` stops every process by its PID."""

    base: Path
    net: Network
    node_env: dict[str, dict[str, str]] = field(default_factory=dict)
    service_env: dict[str, str] = field(default_factory=dict)
    data_dirs: dict[str, Path] = field(default_factory=dict)
    etcd: NsEtcd = field(init=False)
    nodes: dict[str, Node] = field(default_factory=dict)
    services: dict[str, ServiceProc] = field(default_factory=dict)
    _local: threading.local = field(default_factory=threading.local)

    def __post_init__(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        ip = self.net.hosts["etcd"].ip
        etcd = shutil.which("etcd") or "/usr/bin/etcd"
        client_url, peer_url = f"http://{ip}:{ETCD_PORT}", f"http://{ip}:{ETCD_PEER_PORT}"
        argv = ["timeout", "--kill-after=5", str(ETCD_LIFETIME_S), etcd, "--name", "etcd"]
        argv += ["--data-dir", str(self.base / "etcd.data"), "--log-level", "warn"]
        argv += ["--listen-client-urls", client_url, "--advertise-client-urls", client_url]
        argv += ["--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url]
        argv += ["--initial-cluster", f"etcd={peer_url}", "--initial-cluster-state", "new"]
        self.etcd = NsEtcd(
            name="etcd",
            argv=self.net.argv_in("etcd", argv),
            env={},
            log_path=self.base / "etcd.log",
            client_port=ETCD_PORT,
            peer_port=ETCD_PEER_PORT,
            data_dir=self.base / "etcd.data",
            ip=ip,
        )
        env = ha_env(self.etcd, f"faults{random.randrange(1 << 30)}")  # NsEtcd is an Etcd
        env["SC_LEADER_TTL_S"] = str(TTL_S)
        tarantool_bin = shutil.which("tarantool") or "tarantool"
        for name in NODES:
            ip = self.net.hosts[name].ip
            data_dir = self.data_dirs.get(name, self.base / name)
            node_env = {
                **env,
                "SC_INSTANCE_NAME": name,
                "SC_LISTEN": f"{ip}:{IPROTO_PORT}",
                "SC_HTTP_LISTEN": f"{ip}:{HTTP_PORT}",
                "SC_DATA_DIR": str(data_dir),
                "SC_HTTP_TOKEN": HTTP_TOKEN,  # required off localhost (the data routes; /health and /metrics stay open)
                **self.node_env.get(name, {}),
            }
            child = Child(
                name=name,
                argv=self.net.argv_in(name, [tarantool_bin, str(LUA_INIT)]),
                env=node_env,
                log_path=self.base / f"{name}.log",
            )
            self.nodes[name] = Node(name, ip, child, data_dir)
        addresses = ",".join(n.address for n in self.nodes.values())
        for name in SERVICES:
            ip = self.net.hosts[name].ip
            service_env = {
                "SMARTCACHE_LISTEN": f"tcp://{ip}:{SERVICE_PORT}",
                "SMARTCACHE_TARANTOOL": addresses,
                "SMARTCACHE_METRICS_ADDR": ip,
                "SMARTCACHE_METRICS_PORT": str(METRICS_PORT),
                "SMARTCACHE_INSTANCE_ID": name,
                "SMARTCACHE_WORKERS": "50",
                "SMARTCACHE_LOG_LEVEL": "info",
                **self.service_env,
            }
            child = Child(
                name=name,
                argv=self.net.argv_in(name, [sys.executable, "-m", "service"]),
                env=service_env,
                log_path=self.base / f"{name}.log",
            )
            self.services[name] = ServiceProc(name, ip, child)

    # -- start and stop ---------------------------------------------------------------

    def start(self) -> None:
        """etcd, then the three instances (one leads, two follow), then both services (ready)."""
        self.etcd.start()
        self.etcd.wait_ready()
        for node in self.nodes.values():
            node.child.start()
        leader = self.leader(timeout_s=60)
        for name in self.nodes:
            if name != leader:
                self.wait_role(name, "follower", timeout_s=60)
        for svc in self.services.values():
            self.start_service(svc.name)

    def start_service(self, name: str) -> None:
        svc = self.services[name]
        svc.child.start()
        svc.child.wait_until("/health/ready 200", svc.ready, timeout_s=30)

    def start_node(self, name: str) -> None:
        self.drop_conn(name)
        self.nodes[name].child.start()

    def restart_etcd(self) -> None:
        self.etcd.start()
        self.etcd.wait_ready()

    def close(self) -> None:
        """Stop every process by its PID (services first: they drain), resuming any we froze."""
        self.close_conns()
        for svc in self.services.values():
            svc.child.send_signal(signal.SIGCONT)
            svc.child.stop(timeout_s=15)
        for node in self.nodes.values():
            node.child.send_signal(signal.SIGCONT)
            node.child.stop(timeout_s=10)
        with contextlib.suppress(RuntimeError, OSError):
            if self.etcd.alive():
                self.etcd.send_signal(signal.SIGCONT)
        self.etcd.stop(timeout_s=10)

    # -- signals --------------------------------------------------------------------

    def signal_node(self, name: str, sig: int) -> None:
        self.nodes[name].child.send_signal(sig)

    def kill_etcd(self) -> None:
        """kill -9 etcd itself (not the `timeout` around it), and wait until it is gone."""
        os.kill(self.etcd.etcd_pid, signal.SIGKILL)
        until(lambda: True if not self.etcd.alive() else None, 10, "etcd gone after kill -9")

    # -- asking instances -----------------------------------------------------------

    @property
    def _conns(self) -> dict[str, tarantool.Connection]:
        if not hasattr(self._local, "conns"):
            self._local.conns = {}
        return self._local.conns  # type: ignore[no-any-return]

    def open_conn(
        self, name: str, timeout_s: float = ASK_TIMEOUT_S, user: str = USER, password: str = PASSWORD
    ) -> tarantool.Connection:
        """A new connection to one instance (as the service user); every call on it times out after timeout_s."""
        return tarantool.Connection(
            self.nodes[name].ip,
            IPROTO_PORT,
            user=user,
            password=password,
            socket_timeout=timeout_s,
            connection_timeout=timeout_s,
            reconnect_max_attempts=0,
            connect_now=True,
            fetch_schema=False,
        )

    def _conn(self, name: str, timeout_s: float) -> tarantool.Connection:
        conn = self._conns.get(name)
        if conn is None:
            conn = self._conns[name] = self.open_conn(name, timeout_s)
        return conn

    def drop_conn(self, name: str) -> None:
        conn = self._conns.pop(name, None)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def close_conns(self) -> None:
        """Close this thread's connections (every thread that asks must, before it ends)."""
        for name in list(self._conns):
            self.drop_conn(name)

    def call(self, name: str, proc: str, *args: object, timeout_s: float = ASK_TIMEOUT_S) -> dict[str, Any] | None:
        """sc.<proc>(meta=None, *args) on one instance; None when it does not answer in time."""
        try:
            return self._conn(name, timeout_s).call(f"sc.{proc}", [None, *args]).data[0]  # type: ignore[no-any-return]
        except (tarantool.error.Error, OSError, tarantool.error.NetworkWarning):
            self.drop_conn(name)
            return None

    def role(self, name: str) -> dict[str, Any] | None:
        return self.call(name, "role")

    def roles(self) -> dict[str, str]:
        """Each instance's role in a word (for messages)."""
        out = {}
        for n in self.nodes:
            r = self.role(n)
            out[n] = "no answer" if r is None else f"{r['role']}{' writable' if r['writable'] else ''}"
        return out

    def writable_now(self) -> list[str]:
        out = []
        for n in self.nodes:
            r = self.role(n)
            if r is not None and r["writable"]:
                out.append(n)
        return out

    def leader(self, timeout_s: float = 30.0, exclude: tuple[str, ...] = ()) -> str:
        """Until exactly one instance (not excluded) is leader and writable; its name."""

        def one() -> str | None:
            w = [n for n in self.writable_now() if n not in exclude]
            return w[0] if len(w) == 1 else None

        return until(one, timeout_s, lambda: f"one writable leader: {self.roles()}")

    def wait_role(self, name: str, role: str, timeout_s: float = 30.0) -> dict[str, Any]:
        return self.wait_any_role(name, (role,), timeout_s)

    def wait_any_role(self, name: str, roles: tuple[str, ...], timeout_s: float = 30.0) -> dict[str, Any]:
        def in_role() -> dict[str, Any] | None:
            r = self.role(name)
            return r if r is not None and r["role"] in roles else None

        return until(in_role, timeout_s, lambda: f"{name} {' or '.join(roles)}: {self.roles()}")

    def vclock(self, name: str) -> dict[int, int] | None:
        r = self.role(name)
        if r is None or not isinstance(r.get("vclock"), dict):
            return None
        return {int(k): int(v) for k, v in r["vclock"].items() if int(k) != 0}

    def caught_up(self, leader: str, names: list[str]) -> bool:
        """Every named instance has at least what the leader has now (component 0 excluded)."""
        lv = self.vclock(leader)
        if lv is None:
            return False
        for n in names:
            v = self.vclock(n)
            if v is None or any(v.get(k, 0) < lsn for k, lsn in lv.items()):
                return False
        return True

    def node_metric(self, name: str, metric: str, labels: dict[str, str] | None = None) -> float | None:
        return metric_value(http_text(self.nodes[name].http_url + "/metrics"), metric, labels)

    def service_metric(self, name: str, metric: str, labels: dict[str, str] | None = None) -> float | None:
        return metric_value(http_text(self.services[name].metrics_url), metric, labels)
