"""`make run` (``python -m smartcache.devstack``): the whole stack in the foreground until Ctrl-C.

Three etcd members (etcd.py), three Tarantool instances per shard that etcd elects a leader of
(tarantool.py), the simulated backend, the service and the operator's console, as children on
127.0.0.1, each waited for in that order. Before anything starts, every variable is read and every
port checked (plan.py); once etcd is up, what var/ holds decides which shards start (shards.py).
A child that dies is restarted and the rest keep running, as the Docker stack's restart policy
does; Ctrl-C stops them all, the service first, etcd last (supervise.py). On a terminal, the logs
of all of them are shown as they grow, one coloured line each (logtail.py).
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from smartcache.devstack.child import Child, NotReady, http_status
from smartcache.devstack.etcd import Etcd, EtcdCluster
from smartcache.devstack.logtail import LogTail, print_banner
from smartcache.devstack.plan import CLUSTER, ETCD_LIFETIME_S, INSTANCES, SHARDS_VARIABLE, BadEnvironment, Plan
from smartcache.devstack.shards import read_recorded, seed_shards, seed_topology, settle_shards
from smartcache.devstack.supervise import RESTART, TARANTOOL_RESTART, reporter
from smartcache.devstack.tarantool import Tarantool, leads_or_follows, role_of, wait_cluster_formed
from smartcache.server.config import Settings
from smartcache.settings import SettingsError
from smartcache.supervision import Signals, Supervisor, stop_in_order


def main() -> int:
    """`make run`: etcd, three Tarantool instances, the simulated backend and the service, until Ctrl-C."""
    signals = Signals().block()  # before any thread or child: Ctrl-C is taken by sigtimedwait, never a handler
    try:
        plan = Plan.from_env(dict(os.environ))
        plan.check_ports()  # first: a make run refused leaves nothing behind (not even var/session.key)
        service_env = _service_env(plan, os.environ)
        Settings.from_env({**os.environ, **service_env})  # the service's own check, before anything starts
    except (BadEnvironment, SettingsError) as e:
        print(f"make run: {e}", file=sys.stderr, flush=True)  # noqa: T201
        return 1
    return Stack.create(plan, service_env).run(signals)


#: make run's session key in var/ (SMARTCACHE_SESSION_KEY_FILE of its service)
SESSION_KEY_FILE = "session.key"


def session_key_file(base: Path) -> Path:
    """var/session.key, made on the first start (32 random bytes as 64 hex characters, mode 0600) and kept:
    the sessions var/ holds are stored under it, so a new key would lose them (docs/operations.md)."""
    path = base / SESSION_KEY_FILE
    base.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    return path


def _session_key(plan: Plan, env: Mapping[str, str]) -> dict[str, str]:
    """The service's session key: the shell's SMARTCACHE_SESSION_KEY (or _FILE) when it sets one, else var/'s."""
    if any(env.get(name, "").strip() for name in ("SMARTCACHE_SESSION_KEY", "SMARTCACHE_SESSION_KEY_FILE")):
        return {}
    return {"SMARTCACHE_SESSION_KEY_FILE": str(session_key_file(plan.base))}


def _service_env(plan: Plan, env: Mapping[str, str]) -> dict[str, str]:
    return {
        **_session_key(plan, env),
        "SMARTCACHE_LISTEN": plan.listen,
        "SMARTCACHE_EVENTS_LISTEN": plan.events_listen,
        # the instances come from etcd (the topology make run seeds), so an instance added later is found with
        # no restart; none given here, whatever the shell exports for smartcache-cli
        "SMARTCACHE_ETCD": ",".join(plan.etcd_urls),
        "SMARTCACHE_CLUSTER": CLUSTER,
        "SMARTCACHE_TARANTOOL": "",
        "SMARTCACHE_METRICS_PORT": str(plan.ports["SMARTCACHE_METRICS_PORT"]),
        "SMARTCACHE_BACKEND_URL": f"http://127.0.0.1:{plan.ports['BACKEND_PORT']}",
    }


def _say(tail: LogTail | None) -> Callable[[str], None]:
    """make run's own lines: on stderr, between two of the tail's prints."""

    def say(text: str) -> None:
        if tail is not None:
            tail.say(f"make run: {text}", sys.stderr)
        else:
            print(f"make run: {text}", file=sys.stderr, flush=True)  # noqa: T201

    return say


def _console(plan: Plan, first: list[Tarantool], metrics_url: str) -> Child:
    """The operator's console over the stack: read-only unless SMARTCACHE_CONSOLE_TOKEN (or _FILE) is set."""
    return Child(
        name="console",
        argv=[
            sys.executable, "-m", "smartcache.console",
            "--listen", f"127.0.0.1:{plan.ports['SMARTCACHE_CONSOLE_PORT']}",
            "--tarantool", ",".join(t.address for t in first),
            "--etcd", ",".join(plan.etcd_urls),
            "--cluster", CLUSTER,
            "--service", f"{plan.listen}={metrics_url}",
            "--publishers", plan.events_listen,
        ],
        env={},
        log_path=plan.base / "console.log",
    )  # fmt: skip


def _settled(plan: Plan, say: Callable[[str], None]) -> tuple[Plan, str | None] | None:
    """The plan for what var/'s etcd holds (settle_shards) with its extra shards' ports checked free, and the
    banner's line on it; None when make run cannot start on it (said why)."""
    try:
        settled, said = settle_shards(plan, read_recorded(plan.etcd_urls))
        settled.check_ports(only=[name for name in settled.ports if name not in plan.ports])
    except BadEnvironment as e:
        say(str(e))
        return None
    return settled, said


def _trios(plan: Plan, etcd_url: str) -> dict[str, list[Tarantool]]:
    """Each shard's three Tarantool instances. One replica set: make-run, tarantool-1..3, as always; sharded:
    make-run.s1, tarantool-s1-1... (tarantool-1..3 for s1 grown from one replica set: Plan.instance_name)."""
    trios: dict[str, list[Tarantool]] = {}
    for k, shard in enumerate(plan.shard_names(), 1):
        cluster = CLUSTER if plan.shards == 1 else f"{CLUSTER}.{shard}"
        ha = {"SC_ETCD": etcd_url, "SC_CLUSTER": cluster, "SC_CLUSTER_SIZE": str(len(INSTANCES))}
        trios[shard] = [
            Tarantool.create(
                plan.instance_name(k, i),
                plan.base,
                port=plan.port(f"SC_PORT_{i}", k),
                http_port=plan.port(f"SC_HTTP_PORT_{i}", k),
                extra_env=ha,
            )
            for i in range(1, len(INSTANCES) + 1)
        ]
    return trios


@dataclass
class Stack:
    """make run's children: etcd first, then storage, the backend, the service, the console (stopped in reverse)."""

    plan: Plan
    etcd: EtcdCluster
    backend: Child
    service: Child
    #: each shard's trio and the console: known once etcd says what var/ holds
    trios: dict[str, list[Tarantool]] = field(default_factory=dict)
    console: Child | None = None
    #: every child started, in order
    children: list[Child] = field(default_factory=list)
    tail: LogTail | None = None
    #: the banner's line on the shards var/ holds
    shards_said: str | None = None

    @classmethod
    def create(cls, plan: Plan, service_env: dict[str, str]) -> Stack:
        p = plan.ports
        etcd = EtcdCluster.create(
            plan.base,
            client_ports=[p[f"ETCD_PORT_{i}"] for i in (1, 2, 3)],
            peer_ports=[p[f"ETCD_PEER_PORT_{i}"] for i in (1, 2, 3)],
            lifetime_s=ETCD_LIFETIME_S,
        )
        backend = Child(
            name="backend",
            argv=[sys.executable, "-m", "loadtest.backend", "--port", str(p["BACKEND_PORT"])],
            env={},
            log_path=plan.base / "backend.log",
        )
        service = Child(
            name="service",
            argv=[sys.executable, "-m", "smartcache.server"],
            log_path=plan.base / "service.log",
            env=service_env,
        )
        return cls(plan, etcd, backend, service)

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.plan.ports['SMARTCACHE_METRICS_PORT']}"

    @property
    def instances(self) -> list[Tarantool]:
        return [t for trio in self.trios.values() for t in trio]

    def run(self, stop: Signals) -> int:
        """Start, wait for each, show the banner, supervise until Ctrl-C (0) or a child died too often (1)."""
        self.tail = LogTail(sys.stdout).start() if sys.stdout.isatty() else None
        say = _say(self.tail)
        try:
            if not self._start(stop, say):
                return 1
            leaders = self._wait_ready(stop, say)
            self._banner(leaders)
            return self._supervisor(say).run(stop)
        except NotReady as e:
            if stop.is_set():
                return 0
            say(str(e))
            return 1
        finally:
            # service first (it drains), storage, etcd last; a second Ctrl-C kills what is left at once
            stop_in_order(reversed(self.children), stop, say)
            if self.tail is not None:
                self.tail.stop()

    def _start_each(self, these: Sequence[Child]) -> None:
        """Start each in turn, add it to children (stopped in reverse), and follow its log on a terminal."""
        for child in these:
            child.start()
            self.children.append(child)
            if self.tail is not None:
                self.tail.follow(child)

    def _start(self, stop: Signals, say: Callable[[str], None]) -> bool:
        """etcd, then what var/ holds decides the shards; every child started. False: cannot start (said why)."""
        self._start_each(self.etcd.members)
        self.etcd.wait_ready(stop=stop)
        settled = _settled(self.plan, say)  # the shards var/ holds decide what starts: every one, or none and why
        if settled is None:
            return False
        self.plan, self.shards_said = settled
        self.trios = _trios(self.plan, self.etcd.url)
        self.console = _console(self.plan, self.trios[self.plan.shard_names()[0]], self.metrics_url)
        self._start_each([*self.instances, self.backend, self.service, self.console])
        return True

    def _wait_ready(self, stop: Signals, say: Callable[[str], None]) -> list[Tarantool]:
        """Until every trio elected a leader, the topology and bucket map are seeded, and the rest answer;
        the leaders."""
        plan, p = self.plan, self.plan.ports
        leaders = {shard: wait_cluster_formed(trio, stop) for shard, trio in self.trios.items()}
        for shard, trio in self.trios.items():
            say(seed_topology(trio, plan.etcd_urls, CLUSTER if plan.shards == 1 else f"{CLUSTER}.{shard}"))
        if plan.shards > 1:
            say(seed_shards(plan))
        self.backend.wait_listening(p["BACKEND_PORT"], stop=stop)
        self.service.wait_listening(p["SMARTCACHE_METRICS_PORT"], *filter(None, [plan.listen_port]), stop=stop)
        ready_url = self.metrics_url + "/health/ready"
        self.service.wait_until("/health/ready 200", lambda: http_status(ready_url) == 200, stop=stop)
        assert self.console is not None
        self.console.wait_listening(p["SMARTCACHE_CONSOLE_PORT"], stop=stop)
        return list(leaders.values())

    def _banner(self, leaders: list[Tarantool]) -> None:
        lines = banner(self, leaders)
        if self.tail is not None:
            self.tail.banner(lines)
        else:
            print_banner(lines, sys.stdout)

    def _supervisor(self, say: Callable[[str], None]) -> Supervisor:
        p = self.plan.ports
        supervisor = Supervisor(report=reporter(say), policy=RESTART)
        for m in self.etcd.members:
            supervisor.add(m, m.healthy, lambda: "a healthy etcd member")
        for t in self.instances:  # back once it leads or follows (a restarted leader: follows its successor)
            supervisor.add(t, partial(leads_or_follows, t), partial(role_of, t), TARANTOOL_RESTART)
        supervisor.add(self.backend, partial(self.backend.listens_on, p["BACKEND_PORT"]))
        ready_url = self.metrics_url + "/health/ready"
        supervisor.add(self.service, lambda: http_status(ready_url) == 200, lambda: "ready")
        assert self.console is not None
        supervisor.add(self.console, partial(self.console.listens_on, p["SMARTCACHE_CONSOLE_PORT"]))
        return supervisor


def banner(stack: Stack, leaders: list[Tarantool]) -> list[tuple[str, str]]:
    """What runs where, who leads, how to try it: make run's banner, once everything is ready."""
    plan, p, etcd = stack.plan, stack.plan.ports, stack.etcd
    service, backend, console, metrics_url = stack.service, stack.backend, stack.console, stack.metrics_url
    assert console is not None
    etcd_leader = etcd.leader()
    return [
        ("service (ZeroMQ)", f"{plan.listen}  pid {service.pid}  log {service.log_path}"),
        ("service metrics", f"{metrics_url}/metrics  health {metrics_url}/health/ready"),
        ("service events (PUB)", f"{plan.events_listen}  smartcache-cli events tail"),
        *(
            (
                f"{t.name}{' (leader)' if t in leaders else ''}",
                f"{t.address}  http {t.http_url}  pid {t.pid}  log {t.log_path}",
            )
            for t in stack.instances
        ),
        *(
            (
                f"{m.name}{' (etcd leader)' if m is etcd_leader else ''}",
                f"{m.url}  peer {m.peer_url}  pid {_etcd_pid(m)}  log {m.log_path}",
            )
            for m in etcd.members
        ),
        ("SC_ETCD (who leads)", etcd.url),
        *(
            [("shards", stack.shards_said or f"{', '.join(plan.shard_names())} ({SHARDS_VARIABLE}={plan.shards})")]
            if plan.shards > 1
            else []
        ),
        ("cluster", ".venv/bin/smartcache-cli cluster status"),
        ("session key", service.env.get("SMARTCACHE_SESSION_KEY_FILE") or "the shell's SMARTCACHE_SESSION_KEY"),
        (
            "operator console",
            f"http://127.0.0.1:{p['SMARTCACHE_CONSOLE_PORT']}/  pid {console.pid}  log {console.log_path}",
        ),
        ("simulated backend", f"http://127.0.0.1:{p['BACKEND_PORT']}  pid {backend.pid}  log {backend.log_path}"),
        ("try", f".venv/bin/smartcache-cli --endpoint {plan.listen} ping"),
        (
            "a child that dies",
            f"is restarted (a Tarantool instance after {TARANTOOL_RESTART.delay_s:g} s, the failover's time) and"
            f" its new pid said; {RESTART.max_deaths} deaths within {RESTART.window_s:g} s stop all",
        ),
        ("ready; stop with", "Ctrl-C"),
    ]


def _etcd_pid(member: Etcd) -> int:
    """etcd's own PID (what a kill -9 of the member names), else its `timeout` wrapper's."""
    try:
        return member.etcd_pid
    except (RuntimeError, OSError):
        return member.pid
