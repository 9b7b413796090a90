"""The system under test, each process on a host of its own (tests/netns.py).

Three etcd members (service/smartcache/devstack/etcd.py's EtcdCluster; hosts etcd1..etcd3, the
network group "etcd" standing for all three), three Tarantool instances in HA
mode (lua/init.lua) and two service instances (``python -m smartcache.server``),
every one inside its network namespace with the address of its host and the
production ports (2379/2380, 3301/8301, 5555/9105).
A row that grows the cluster (``cluster add``) asks for a fourth instance,
``SPARE_NODE`` on a host of its own, with ``add_node``: only then is it made, so
every other row, and every check that goes over ``nodes``, sees t1..t3 alone.
The services know the instances by a fixed list (``SMARTCACHE_TARANTOOL``),
or, with ``discovery``, find them in etcd (``SMARTCACHE_ETCD`` and
``SMARTCACHE_CLUSTER``) as the topology lists them.
Processes are devstack ``Child``ren: started by us, stopped by PID, gone when
we are (PR_SET_PDEATHSIG). The test itself is the observer: it talks to every
process over a link that faults never cut.
"""

from __future__ import annotations

import contextlib
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

from smartcache.devstack.etcd import EtcdCluster
from smartcache.devstack.stack import LUA_INIT, Child, http_get_json
from tests.integration.conftest_ha import ha_env
from tests.netns import Network

T = TypeVar("T")

TTL_S = 3  # SC_LEADER_TTL_S: every duration of the scenarios scales with it
NODES = ("t1", "t2", "t3")
#: the instance a membership row adds and removes again; its host is made when the row asks (add_node)
SPARE_NODE = "t4"
SERVICES = ("s1", "s2")
#: the etcd members' hosts, in member order: member etcd-N runs on host etcdN
ETCD_HOSTS = ("etcd1", "etcd2", "etcd3")
#: the network group of all three: cut(x, "etcd") cuts x from every member
ETCD_GROUP = "etcd"
HOSTS = [*ETCD_HOSTS, *NODES, *SERVICES]
IPROTO_PORT, HTTP_PORT = 3301, 8301
SERVICE_PORT, METRICS_PORT = 5555, 9105
ETCD_PORT, ETCD_PEER_PORT = 2379, 2380
ETCD_LIFETIME_S = 1800  # `timeout` ends a forgotten etcd
ASK_TIMEOUT_S = 0.3  # the observer's iproto calls: a stalled instance is "no answer", not a hang
USER = PASSWORD = "smartcache"
HTTP_TOKEN = "faults-token"
#: the services' session key (issue 37): storage holds HMAC-derived stored ids, the harness derives them too
SESSION_KEY_HEX = "5e" * 32


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


def etcd_host(member: str) -> str:
    """The host an etcd member runs on: etcd-2 -> etcd2."""
    return member.replace("-", "")


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
    #: the services find the instances in etcd (the topology, else the live member records), not in a list
    discovery: bool = False
    etcd: EtcdCluster = field(init=False)
    #: SC_CLUSTER: the etcd prefix of this cluster's keys, and the services' SMARTCACHE_CLUSTER
    name: str = field(init=False)
    #: what every instance of the cluster is started with (each adds its own name, addresses, data dir)
    instance_env: dict[str, str] = field(init=False)
    nodes: dict[str, Node] = field(default_factory=dict)
    services: dict[str, ServiceProc] = field(default_factory=dict)
    _local: threading.local = field(default_factory=threading.local)

    def __post_init__(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.net.add_group(ETCD_GROUP, list(ETCD_HOSTS))
        self.etcd = EtcdCluster.create(
            self.base,
            client_ports=[ETCD_PORT] * len(ETCD_HOSTS),
            peer_ports=[ETCD_PEER_PORT] * len(ETCD_HOSTS),
            hosts=[self.net.hosts[h].ip for h in ETCD_HOSTS],
            lifetime_s=ETCD_LIFETIME_S,
            wrap=lambda i, argv: self.net.argv_in(ETCD_HOSTS[i], argv),
        )
        self.name = f"faults{random.randrange(1 << 30)}"
        self.instance_env = ha_env(self.etcd, self.name)  # SC_ETCD: all three members
        self.instance_env["SC_LEADER_TTL_S"] = str(TTL_S)
        # The shipped default, as production runs: memtx 2.6 maps its quota in 16 MiB slabs, and at the
        # integration tests' 64 MiB (4 slabs) a follower of a load row ran out of a size class while the
        # leader's grew hot sessions past it ("Failed to allocate 13623 bytes in slab allocator"): its applier
        # stopped and load-pulses-one failed to catch up in CI (memory.lua warns below 256 MiB).
        self.instance_env["SC_MEMTX_MEMORY"] = str(256 << 20)
        for name in NODES:
            self.nodes[name] = self._node(name)
        addresses = ",".join(n.address for n in self.nodes.values())
        # With discovery the services know only what etcd says: SMARTCACHE_TARANTOOL is set empty (the default, no
        # list once SMARTCACHE_CLUSTER is set) rather than left out, so that one in our own environment, which a
        # Child passes on, cannot add a list.
        found_by = (
            {"SMARTCACHE_TARANTOOL": "", "SMARTCACHE_ETCD": self.etcd.url, "SMARTCACHE_CLUSTER": self.name}
            if self.discovery
            else {"SMARTCACHE_TARANTOOL": addresses}
        )
        for name in SERVICES:
            ip = self.net.hosts[name].ip
            service_env = {
                "SMARTCACHE_LISTEN": f"tcp://{ip}:{SERVICE_PORT}",
                **found_by,
                "SMARTCACHE_METRICS_ADDR": ip,
                "SMARTCACHE_METRICS_PORT": str(METRICS_PORT),
                "SMARTCACHE_INSTANCE_ID": name,
                "SMARTCACHE_SESSION_KEY": SESSION_KEY_HEX,
                "SMARTCACHE_WORKERS": "50",
                "SMARTCACHE_LOG_LEVEL": "info",
                **self.service_env,
            }
            child = Child(
                name=name,
                argv=self.net.argv_in(name, [sys.executable, "-m", "smartcache.server"]),
                env=service_env,
                log_path=self.base / f"{name}.log",
            )
            self.services[name] = ServiceProc(name, ip, child)

    def _node(self, name: str) -> Node:
        """One instance of the cluster on its host (not started)."""
        ip = self.net.hosts[name].ip
        data_dir = self.data_dirs.get(name, self.base / name)
        env = {
            **self.instance_env,
            "SC_INSTANCE_NAME": name,
            "SC_LISTEN": f"{ip}:{IPROTO_PORT}",
            "SC_HTTP_LISTEN": f"{ip}:{HTTP_PORT}",
            "SC_DATA_DIR": str(data_dir),
            "SC_HTTP_TOKEN": HTTP_TOKEN,  # required off localhost (the data routes; /health and /metrics stay open)
            **self.node_env.get(name, {}),
        }
        child = Child(
            name=name,
            argv=self.net.argv_in(name, [shutil.which("tarantool") or "tarantool", str(LUA_INIT)]),
            env=env,
            log_path=self.base / f"{name}.log",
        )
        return Node(name, ip, child, data_dir)

    def add_node(self, name: str = SPARE_NODE) -> Node:
        """One more instance of this cluster, empty, on a host of its own (made now if this run has none yet: the
        namespaces outlive a row), not started. From here on it is one of ``nodes``: the sampler asks it, the
        final read counts it when it follows, ``close`` stops it."""
        if name not in self.net.hosts:
            self.net.add_host(name)
        node = self.nodes[name] = self._node(name)
        return node

    # -- start and stop ---------------------------------------------------------------

    def start(self) -> None:
        """etcd (a leader, all three healthy), then the three instances (one leads, two follow), then both
        services (ready)."""
        self.etcd.start()
        self.etcd.wait_ready(timeout_s=60)
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
        """Start every etcd member that is not running (on its data), until a leader and all healthy."""
        for m in self.etcd.members:
            if not m.alive():
                m.start()
        self.etcd.wait_ready(timeout_s=60)

    def close(self) -> None:
        """Stop every process by its PID (services first: they drain), resuming any we froze."""
        self.close_conns()
        for svc in self.services.values():
            svc.child.send_signal(signal.SIGCONT)
            svc.child.stop(timeout_s=15)
        for node in self.nodes.values():
            node.child.send_signal(signal.SIGCONT)
            node.child.stop(timeout_s=10)
        self.etcd.stop()  # SIGCONT to a frozen member first

    # -- signals --------------------------------------------------------------------

    def signal_node(self, name: str, sig: int) -> None:
        self.nodes[name].child.send_signal(sig)

    def kill_etcd(self) -> None:
        """kill -9 every etcd member (etcd itself, not the `timeout` around it): etcd down as a whole."""
        for m in self.etcd.members:
            if m.alive():
                self.etcd.kill(m.name)

    def kill_etcd_member(self, name: str) -> int:
        """kill -9 one etcd member ("etcd-2"; the leader: ``self.etcd.leader().name``); its PID. Start it again
        with ``self.etcd.restart(name)`` (on its data: it rejoins)."""
        return self.etcd.kill(name)

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
