"""Local processes for `make run`, the tests and the load tests.

Starts Tarantool instances (lua/init.lua), the service and the simulated
backend as child processes on 127.0.0.1, waits until each is ready, and stops
each by its PID. Children get SIGTERM if this process dies (PR_SET_PDEATHSIG),
so nothing outlives its parent, and start with no signal blocked (make run
blocks the ones it waits for: service/smartcache/devstack/supervise.py). Each start appends a
``run_started`` JSON line to the child's log, so a run's lines are easy to find
in an appended log.

``python -m smartcache.devstack`` is `make run`: three etcd members
(service/smartcache/devstack/etcd.py), three Tarantool instances that etcd elects a leader of,
the simulated backend and the service, in the foreground; Ctrl-C stops them
all. A child that dies is restarted and the rest keep running, as the Docker
stack's restart policy does (service/smartcache/devstack/supervise.py). Before starting anything
it checks every port it needs is free, binding as the servers do (SO_REUSEADDR:
a TIME-WAIT they could bind over does not count), and names the variable to
change and what holds the port if not (a second `make run` next to a running
one stops there); SMARTCACHE_PORT_OFFSET=N moves every default port by N at
once, and smartcache-cli's default endpoints with them. On the data of an
earlier run (var/), once etcd is up, it starts every shard etcd's bucket map
names (SMARTCACHE_SHARDS=2 make run, then make run: both shards, as the banner
says), or stops there in one sentence when it cannot start what var/ holds
(another shard count asked, instances on other ports): settle_shards. A
child is ready only when the process we started is the one listening on its
ports (Linux /proc; psutil would do it too, but is not worth a dependency for
one function), so another program answering on the same port can never pass
for it. On a terminal, the
logs of all of them are shown as they grow, one coloured line each
(structlog's console renderer).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TextIO

import structlog

from smartcache.devstack.supervise import RestartPolicy, Signals, Supervisor, stop_all
from smartcache.server.config import Settings
from smartcache.server.parsers import SettingsError
from smartcache.wire import ports
from smartcache.wire.ports import PORT_OFFSET_VARIABLE

#: the checkout: service/smartcache/devstack/stack.py -> the top level
ROOT = Path(__file__).resolve().parents[3]
LUA_INIT = ROOT / "lua" / "init.lua"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
POLL_S = 0.05
TAIL_POLL_S = 0.2
TAIL_JOIN_TIMEOUT_S = 2.0
_PR_SET_PDEATHSIG = 1
_TCP_LISTEN = "0A"  # socket states in /proc/net/tcp
_TCP_TIME_WAIT = "06"
_TCP_CLOSE = "07"  # bound, neither listening nor connected
#: make run's ports: variable -> default (SMARTCACHE_PORT_OFFSET is added to each default)
DEFAULT_PORTS = {
    **{f"SC_PORT_{i}": p for i, p in enumerate(ports.TARANTOOL_PORTS, 1)},
    **{f"SC_HTTP_PORT_{i}": p for i, p in enumerate(ports.TARANTOOL_HTTP_PORTS, 1)},
    **{f"ETCD_PORT_{i}": p for i, p in enumerate(ports.ETCD_PORTS, 1)},
    **{f"ETCD_PEER_PORT_{i}": p for i, p in enumerate(ports.ETCD_PEER_PORTS, 1)},
    "BACKEND_PORT": ports.BACKEND_PORT,
    "SMARTCACHE_METRICS_PORT": ports.METRICS_PORT,
    "SMARTCACHE_CONSOLE_PORT": ports.CONSOLE_PORT,
}
#: the three Tarantool instances of make run (elected: none is master by configuration)
INSTANCES = ("tarantool-1", "tarantool-2", "tarantool-3")
#: SC_CLUSTER of make run's instances and SMARTCACHE_CLUSTER of its service: keys under /smartcache/make-run/
CLUSTER = "make-run"
#: etcd runs as long as make run; its data stays in var/ like the instances'
ETCD_LIFETIME_S = 30 * 86400
#: make run's variables of before the three etcd members: refused, naming the new ones
GONE_VARIABLES = {
    "ETCD_PORT": "make run runs three etcd members now: set ETCD_PORT_1..3 (client ports) and "
    "ETCD_PEER_PORT_1..3 (peer ports) instead of ETCD_PORT",
}
#: SMARTCACHE_SHARDS=N make run: N trios, sharded by client (docs/design/sharding.md); their ports step by 10
SHARDS_VARIABLE = "SMARTCACHE_SHARDS"
MAX_SHARDS = 3
SHARD_PORT_STEP = 10
DEFAULT_LISTEN_PORT = ports.LISTEN_PORT
#: the service's events PUB socket (SMARTCACHE_EVENTS_LISTEN), moved by the offset too
DEFAULT_EVENTS_PORT = ports.EVENTS_PORT
MAX_PORT_OFFSET = 65535 - max(DEFAULT_PORTS.values())


class Stop(Protocol):
    """What a wait polls to give up early: a threading.Event, or make run's Signals (devstack/supervise.py)."""

    def wait(self, timeout: float | None = None) -> bool: ...


class NotReady(Exception):
    """A child exited, or did not become ready in time, or we were asked to stop while waiting."""


#: ports free_port handed out in this process: never twice
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()
_random = random.Random()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (Linux's default if unreadable)."""
    with contextlib.suppress(OSError, ValueError):
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    return 32768, 60999


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now, below the ephemeral range, not handed out before here.

    Below the ephemeral range because a port the kernel chose (bind to 0) is one it may give, a moment
    later, to an outgoing connection of any process as its local port: a server started on it then
    fails with "Address already in use" (it did, once in CI: make run's metrics port was taken by a
    connection between the children it had just started). Ports below the range are only ever taken
    by a bind that names them.
    """
    highest = ephemeral_range()[0] - 1
    with _handed_out_lock:
        while True:
            port = _random.randint(10_000, highest)
            if port in _handed_out:
                continue
            with socket.socket() as s:  # no SO_REUSEADDR: a port in TIME_WAIT is not taken either
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could bind host:port now: a bind with SO_REUSEADDR, as Tarantool, etcd, ZeroMQ and
    Python's servers all set it.

    So a port held only by TIME-WAIT sockets that had SO_REUSEADDR (a server's accepted connections, closed
    by the server first) is free, and one held by a TIME-WAIT socket without it (the local end of an outgoing
    connection, most often on a port of the ephemeral range) is not: Linux lets a bind pass a TIME-WAIT socket
    only when both set the flag. Measured here (Linux 6.18, Tarantool 2.6.0): Tarantool's bind fails on the
    second kind ("failed to bind ... Address already in use") and passes on the first, as this check says
    (tests/integration/test_devstack.py).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def tcp_states(port: int) -> set[str]:
    """The states of the TCP sockets whose local port is port (Linux: /proc/net/tcp*, this network namespace)."""
    states = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for row in Path(table).read_text().splitlines()[1:]:
                f = row.split()
                if int(f[1].rsplit(":", 1)[1], 16) == port:
                    states.add(f[3])
    return states


def port_holders(port: int) -> str:
    """What holds a port that port_is_free finds taken, in words."""
    states = tcp_states(port)
    if _TCP_LISTEN in states:
        return "a listening socket, another make run?"
    if states - {_TCP_TIME_WAIT, _TCP_CLOSE}:
        return "the local end of a connection"
    if _TCP_TIME_WAIT in states:
        return "TIME-WAIT sockets of closed connections that did not set SO_REUSEADDR (outgoing ones), gone within 60 s"
    return "a socket bound to it" if states else "a socket /proc/net/tcp does not show (gone since?)"


def listens(pid: int, port: int) -> bool:
    """Whether process pid holds a listening TCP socket on port (Linux: /proc/net/tcp* and /proc/<pid>/fd)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for row in Path(table).read_text().splitlines()[1:]:
                f = row.split()
                if f[3] == _TCP_LISTEN and int(f[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{f[9]}]")
    if not inodes:
        return False
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) in inodes:
                    return True
    return False


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())  # make run blocks SIGINT/SIGTERM/SIGCHLD; a child must not


def http_get_json(url: str, timeout_s: float = 2.0) -> tuple[int, Any]:
    """GET a JSON document; returns (status, parsed body)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 - our own local endpoint
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def _now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Child:
    """A child process started by us and stopped by its PID."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    #: where this run's lines start in log_path (after the run_started marker)
    log_offset: int = 0

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            marker = {"timestamp": _now_iso(), "level": "info", "event": "run_started", "process": self.name}
            log.write(json.dumps({**marker, "argv": self.argv, "by_pid": os.getpid()}).encode() + b"\n")
            log.flush()
            self.log_offset = log.tell()
            self.proc = subprocess.Popen(
                self.argv,
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - only prctl(2), safe after fork
                start_new_session=True,  # Ctrl-C reaches only us; we stop children in order
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send_signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """Send sig, wait up to timeout_s, then SIGKILL; returns the exit code."""
        if self.proc is None:
            return None
        if self.alive():
            os.kill(self.pid, sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(timeout_s)
        return self.proc.returncode

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def wait_until(
        self,
        what: str,
        ready: Callable[[], bool],
        timeout_s: float = READY_TIMEOUT_S,
        stop: Stop | None = None,
    ) -> None:
        """Poll ready() until true; NotReady if this child exits, time runs out or stop is set."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            if not self.alive():
                raise NotReady(f"{self.name} exited before {what}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise NotReady(f"{self.name}: no {what} in {timeout_s:g} s:\n{self.log_tail()}")
            if stop is not None and stop.wait(POLL_S):
                raise NotReady(f"stopped while waiting for {self.name}")
            if stop is None:
                time.sleep(POLL_S)

    def wait_listening(self, *ports: int, stop: Stop | None = None) -> None:
        """Until this very process listens on every port (another program on one of them never counts)."""
        self.wait_until(
            f"listening on {', '.join(map(str, ports))}", lambda: all(listens(self.pid, p) for p in ports), stop=stop
        )


@dataclass
class Tarantool(Child):
    """One storage instance running lua/init.lua."""

    port: int = 0
    http_port: int = 0
    data_dir: Path = field(default_factory=Path)

    @classmethod
    def create(
        cls,
        name: str,
        base_dir: Path,
        *,
        port: int | None = None,
        http_port: int | None = None,
        read_only: bool = False,
        replication: list[str] | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> Tarantool:
        port = port or free_port()
        http_port = http_port or free_port()
        data_dir = base_dir / name
        env = {
            "SC_INSTANCE_NAME": name,
            "SC_LISTEN": f"127.0.0.1:{port}",
            "SC_HTTP_LISTEN": f"127.0.0.1:{http_port}",
            "SC_DATA_DIR": str(data_dir),
            "SC_READ_ONLY": "true" if read_only else "false",
            "SC_REPLICATION": ",".join(replication or []),
            "SC_MEMTX_MEMORY": str(128 * 1024 * 1024),
            **(extra_env or {}),
        }
        tarantool = shutil.which("tarantool") or "tarantool"
        return cls(
            name=name,
            argv=[tarantool, str(LUA_INIT)],
            env=env,
            log_path=base_dir / f"{name}.log",
            port=port,
            http_port=http_port,
            data_dir=data_dir,
        )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S, stop: Stop | None = None) -> dict[str, Any]:
        """Wait until this process listens on both ports and its /health answers 200; returns the document."""
        health: dict[str, Any] = {}

        def ready() -> bool:
            if not (listens(self.pid, self.port) and listens(self.pid, self.http_port)):
                return False
            with contextlib.suppress(OSError, ValueError):
                status, doc = http_get_json(self.http_url + "/health", timeout_s=1.0)
                if status == 200:
                    health.update(doc)
                    return True
            return False

        self.wait_until("/health 200", ready, timeout_s, stop)
        return health


# -- make run ----------------------------------------------------------------------------


class BadEnvironment(Exception):
    """A make run variable is unusable, or a port it needs is taken; the message names the variable."""


@dataclass
class Plan:
    """What `make run` starts, on which ports, from which variables."""

    base: Path
    #: variable -> port; every one must be free before anything starts
    ports: dict[str, int]
    listen: str
    listen_port: int | None  # None: an ipc:// endpoint, nothing to check
    #: the service's events socket (SMARTCACHE_EVENTS_LISTEN)
    events_listen: str = ""
    #: SMARTCACHE_SHARDS: one replica set (the default), or that many, sharded by client
    shards: int = 1
    #: whether SMARTCACHE_SHARDS said so (unset: as many as var/'s etcd records, settle_shards)
    shards_given: bool = False

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Plan:
        ports, errors = {}, []
        errors += [why for name, why in GONE_VARIABLES.items() if env.get(name, "").strip()]
        offset = env.get(PORT_OFFSET_VARIABLE, "").strip() or "0"
        if not offset.isdigit() or int(offset) > MAX_PORT_OFFSET:
            errors.append(f"{PORT_OFFSET_VARIABLE}={offset!r} must be a number 0..{MAX_PORT_OFFSET}")
            offset = "0"
        for name, default in DEFAULT_PORTS.items():
            raw = env.get(name, "").strip() or str(default + int(offset))
            if not raw.isdigit() or not 1 <= int(raw) <= 65535:
                errors.append(f"{name}={raw!r} must be a port number 1..65535")
            else:
                ports[name] = int(raw)
        listen = env.get("SMARTCACHE_LISTEN", "").strip() or f"tcp://127.0.0.1:{DEFAULT_LISTEN_PORT + int(offset)}"
        listen_port = None
        if listen.startswith("tcp://"):
            port = listen.rpartition(":")[2]
            if port.isdigit() and int(port) > 0:
                listen_port = ports["SMARTCACHE_LISTEN"] = int(port)
            else:
                errors.append(f"SMARTCACHE_LISTEN={listen!r}: make run needs a fixed port (tcp://host:PORT)")
        events = (
            env.get("SMARTCACHE_EVENTS_LISTEN", "").strip() or f"tcp://127.0.0.1:{DEFAULT_EVENTS_PORT + int(offset)}"
        )
        events_port = events.rpartition(":")[2] if events.startswith("tcp://") else ""
        if events_port.isdigit() and int(events_port) > 0:
            ports["SMARTCACHE_EVENTS_LISTEN"] = int(events_port)
        raw_shards = env.get(SHARDS_VARIABLE, "").strip()  # unset: as many as var/ holds (settle_shards), or one
        shards = int(raw_shards or "1") if (raw_shards or "1").isdigit() else 0
        if not 1 <= shards <= MAX_SHARDS:
            errors.append(f"{SHARDS_VARIABLE}={raw_shards!r} must be 1..{MAX_SHARDS}")
            shards = 1
        ports, moved_errors = _with_shard_ports(ports, shards)
        errors += moved_errors
        if errors:
            raise BadEnvironment("; ".join(errors))
        base = Path(env.get("SMARTCACHE_VAR") or ROOT / "var")
        return cls(base, ports, listen, listen_port, events, shards, shards_given=bool(raw_shards))

    def with_shards(self, shards: int) -> Plan:
        """This plan with that many shards (each one's ports 10 above the one before), as SMARTCACHE_SHARDS=N."""
        ports, errors = _with_shard_ports(self.ports, shards)
        if errors:
            raise BadEnvironment("; ".join(errors))
        return replace(self, ports=ports, shards=shards)

    def shard_names(self) -> list[str]:
        return [f"s{k}" for k in range(1, self.shards + 1)]

    def port(self, name: str, shard: int) -> int:
        """An instance port of shard k (1: the first trio's own)."""
        return self.ports[name] if shard == 1 else self.ports[f"{name} (shard s{shard})"]

    def addresses(self, shard: int) -> list[str]:
        """The iproto addresses of shard k's three instances (what its topology names)."""
        return [f"127.0.0.1:{self.port(f'SC_PORT_{i}', shard)}" for i in (1, 2, 3)]

    @property
    def etcd_urls(self) -> list[str]:
        """The three etcd members' client URLs (SC_ETCD, SMARTCACHE_ETCD)."""
        return [f"http://127.0.0.1:{self.ports[f'ETCD_PORT_{i}']}" for i in (1, 2, 3)]

    def check_ports(self, only: Collection[str] | None = None) -> None:
        """Every port distinct and free now (of those named in only, if given), or BadEnvironment naming each
        variable to change, what holds its port and, for a port in the ephemeral range, the offsets below it."""
        by_port: dict[int, list[str]] = {}
        for name, port in self.ports.items():
            by_port.setdefault(port, []).append(name)
        shared = [f"{' and '.join(names)} share port {port}" for port, names in by_port.items() if len(names) > 1]
        if shared:
            raise BadEnvironment(f"{'; '.join(shared)}: give each its own port")
        taken = {
            port: names[0]
            for port, names in by_port.items()
            if (only is None or names[0] in only) and not port_is_free(port)
        }
        if not taken:
            return
        low, high = ephemeral_range()
        in_range = [str(p) for p in taken if low <= p <= high]
        highest_offset = low - 1 - max(*DEFAULT_PORTS.values(), DEFAULT_LISTEN_PORT, DEFAULT_EVENTS_PORT)
        why = (
            f"; {', '.join(in_range)} {'lies' if len(in_range) == 1 else 'lie'} in the kernel's ephemeral range"
            f" {low}-{high}, whose ports any outgoing connection may take: {PORT_OFFSET_VARIABLE} up to"
            f" {highest_offset} keeps every port below it"
            if in_range and highest_offset >= 0
            else ""
        )
        raise BadEnvironment(
            f"port {', '.join(f'{p} ({name})' for p, name in taken.items())} already in use"
            f" ({'; '.join(f'{p}: {port_holders(p)}' for p in taken)}): set each variable named to a free port,"
            f" or move them all with {PORT_OFFSET_VARIABLE}=N{why}"
        )


def _with_shard_ports(ports: dict[str, int], shards: int) -> tuple[dict[str, int], list[str]]:
    """ports with the instance ports of shards 2..N (SHARD_PORT_STEP above the shard before each), and the
    errors of those that would pass 65535."""
    out = {name: port for name, port in ports.items() if " (shard s" not in name}
    errors = []
    for k in range(2, shards + 1):
        for i in (1, 2, 3):
            for name in (f"SC_PORT_{i}", f"SC_HTTP_PORT_{i}"):
                moved = out.get(name, 0) + SHARD_PORT_STEP * (k - 1)
                if name in out and moved > 65535:
                    errors.append(f"{name}={out[name]}: shard s{k}'s instance would need port {moved}")
                elif name in out:
                    out[f"{name} (shard s{k})"] = moved
    return out, errors


def _banner(lines: list[tuple[str, str]], out: TextIO) -> None:
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        print(f"  {k:<{width}}  {v}", file=out, flush=True)


def main() -> int:
    """`make run`: etcd, three Tarantool instances, the simulated backend and the service, until Ctrl-C."""
    signals = Signals().block()  # before any thread or child: Ctrl-C is taken by sigtimedwait, never a handler
    try:
        plan = Plan.from_env(dict(os.environ))
        service_env = {
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
        Settings.from_env({**os.environ, **service_env})  # the service's own check, before anything starts
        plan.check_ports()
    except (BadEnvironment, SettingsError) as e:
        print(f"make run: {e}", file=sys.stderr, flush=True)  # noqa: T201
        return 1
    return _run(plan, service_env, signals)


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


def _start(these: Sequence[Child], children: list[Child], tail: LogTail | None) -> None:
    """Start each in turn, add it to children (stopped in reverse), and follow its log on a terminal."""
    for child in these:
        child.start()
        children.append(child)
        if tail is not None:
            tail.follow(child)


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
    make-run.s1, tarantool-s1-1..."""
    trios: dict[str, list[Tarantool]] = {}
    for k, shard in enumerate(plan.shard_names(), 1):
        cluster = CLUSTER if plan.shards == 1 else f"{CLUSTER}.{shard}"
        ha = {"SC_ETCD": etcd_url, "SC_CLUSTER": cluster, "SC_CLUSTER_SIZE": str(len(INSTANCES))}
        trios[shard] = [
            Tarantool.create(
                name if plan.shards == 1 else name.replace("tarantool-", f"tarantool-{shard}-"),
                plan.base,
                port=plan.port(f"SC_PORT_{i}", k),
                http_port=plan.port(f"SC_HTTP_PORT_{i}", k),
                extra_env=ha,
            )
            for i, name in enumerate(INSTANCES, 1)
        ]
    return trios


def _run(plan: Plan, service_env: dict[str, str], stop: Signals) -> int:
    from smartcache.devstack.etcd import EtcdCluster  # noqa: PLC0415 - dev tooling; devtools imports this module

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
    metrics_url = f"http://127.0.0.1:{p['SMARTCACHE_METRICS_PORT']}"
    tail = LogTail(sys.stdout).start() if sys.stdout.isatty() else None
    say = _say(tail)
    children: list[Child] = []
    try:
        _start(etcd.members, children, tail)
        etcd.wait_ready(stop=stop)
        settled = _settled(plan, say)  # the shards var/ holds decide what starts: every one, or none and why
        if settled is None:
            return 1
        plan, shards_said = settled
        trios = _trios(plan, etcd.url)
        instances = [t for trio in trios.values() for t in trio]
        console = _console(plan, trios[plan.shard_names()[0]], metrics_url)
        _start([*instances, backend, service, console], children, tail)
        leaders = {shard: wait_cluster_formed(trio, stop) for shard, trio in trios.items()}
        for shard, trio in trios.items():
            say(seed_topology(trio, plan.etcd_urls, CLUSTER if plan.shards == 1 else f"{CLUSTER}.{shard}"))
        if plan.shards > 1:
            say(seed_shards(plan.shard_names(), plan.etcd_urls))
        backend.wait_listening(p["BACKEND_PORT"], stop=stop)
        service.wait_listening(p["SMARTCACHE_METRICS_PORT"], *filter(None, [plan.listen_port]), stop=stop)
        service.wait_until("/health/ready 200", lambda: _http_status(metrics_url + "/health/ready") == 200, stop=stop)
        console.wait_listening(p["SMARTCACHE_CONSOLE_PORT"], stop=stop)
        etcd_leader = etcd.leader()
        banner = [
            ("service (ZeroMQ)", f"{plan.listen}  log {service.log_path}"),
            ("service metrics", f"{metrics_url}/metrics  health {metrics_url}/health/ready"),
            ("service events (PUB)", f"{plan.events_listen}  smartcache-cli events tail"),
            *(
                (
                    f"{t.name}{' (leader)' if t in leaders.values() else ''}",
                    f"{t.address}  http {t.http_url}  log {t.log_path}",
                )
                for t in instances
            ),
            *(
                (
                    f"{m.name}{' (etcd leader)' if m is etcd_leader else ''}",
                    f"{m.url}  peer {m.peer_url}  log {m.log_path}",
                )
                for m in etcd.members
            ),
            ("SC_ETCD (who leads)", etcd.url),
            *(
                [("shards", shards_said or f"{', '.join(plan.shard_names())} ({SHARDS_VARIABLE}={plan.shards})")]
                if plan.shards > 1
                else []
            ),
            ("cluster", ".venv/bin/smartcache-cli cluster status"),
            ("operator console", f"http://127.0.0.1:{p['SMARTCACHE_CONSOLE_PORT']}/  log {console.log_path}"),
            ("simulated backend", f"http://127.0.0.1:{p['BACKEND_PORT']}  log {backend.log_path}"),
            ("try", f".venv/bin/smartcache-cli --endpoint {plan.listen} ping"),
            (
                "a child that dies",
                f"is restarted (a Tarantool instance after {TARANTOOL_RESTART.delay_s:g} s, the failover's time);"
                f" {RESTART.max_deaths} deaths within {RESTART.window_s:g} s stop all",
            ),
            ("ready; stop with", "Ctrl-C"),
        ]
        if tail is not None:
            tail.banner(banner)
        else:
            _banner(banner, sys.stdout)
        supervisor = Supervisor(stop=stop, say=say, policy=RESTART)
        for m in etcd.members:
            supervisor.add(m, m.healthy, lambda: "a healthy etcd member")
        for t in instances:  # back once it leads or follows (a restarted leader: follows its successor)
            supervisor.add(t, partial(_leads_or_follows, t), partial(_role_of, t), TARANTOOL_RESTART)
        supervisor.add(backend, partial(listens_on, backend, p["BACKEND_PORT"]))
        supervisor.add(service, lambda: _http_status(metrics_url + "/health/ready") == 200, lambda: "ready")
        supervisor.add(console, partial(listens_on, console, p["SMARTCACHE_CONSOLE_PORT"]))
        return supervisor.run()
    except NotReady as e:
        if stop.is_set():
            return 0
        say(str(e))
        return 1
    finally:
        # service first (it drains), storage, etcd last; a second Ctrl-C kills what is left at once
        stop_all(reversed(children), stop, say)
        if tail is not None:
            tail.stop()


#: make run's restart policy (as the Docker stack's restart: on-failure, with a limit)
RESTART = RestartPolicy()
#: a Tarantool instance waits out the failover first (the lease, TTL + 2 s at most: docs/operations.md), so that
#: a killed leader comes back as a follower of its successor; started sooner, it removes its own stale key and,
#: having every row, may well win the election again (seen here with a 1 s delay)
TARANTOOL_RESTART = RestartPolicy(delay_s=float(os.environ.get("SC_LEADER_TTL_S") or 5) + 2)


def _leads_or_follows(t: Tarantool) -> bool:
    return _role_of(t) in ("leader", "follower")


def _role_of(t: Tarantool) -> str:
    """The instance's role from its /health ('?' while it does not answer)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        _, doc = http_get_json(t.http_url + "/health", timeout_s=0.5)
        return str(doc.get("role"))
    return "?"


def listens_on(child: Child, port: int) -> bool:
    return child.alive() and listens(child.pid, port)


def wait_cluster_formed(instances: list[Tarantool], stop: Stop) -> Tarantool:
    """Until etcd has elected one instance and the others follow it (so a synchronous write finds its
    quorum at once: the first write of the quick start must not wait for followers); returns the leader."""
    elected: list[Tarantool] = []

    def formed() -> bool:
        roles = {}
        for t in instances:
            if not t.alive():
                raise NotReady(f"{t.name} exited before the cluster formed:\n{t.log_tail()}")
            with contextlib.suppress(OSError, ValueError):
                status, doc = http_get_json(t.http_url + "/health", timeout_s=1.0)
                if status == 200:
                    roles[t.name] = doc
        leaders = [t for t in instances if roles.get(t.name, {}).get("role") == "leader"]
        if len(leaders) != 1 or len(roles) != len(instances):
            return False
        followers = [roles[t.name] for t in instances if t is not leaders[0]]
        following = all(
            doc.get("role") == "follower" and any(r.get("upstream_status") == "follow" for r in doc["replication"])
            for doc in followers
        )
        downstreams = sum(1 for r in roles[leaders[0].name]["replication"] if r.get("downstream_status") == "follow")
        elected[:] = leaders
        return following and downstreams == len(followers)

    instances[0].wait_until("a leader elected by etcd, followed by the others", formed, READY_TIMEOUT_S, stop)
    return elected[0]


@dataclass(frozen=True)
class Recorded:
    """What etcd (its data is in var/) holds of make run's cluster from an earlier run."""

    #: the shards the bucket map names, in its order; () when there is none (one replica set, make-run)
    shards: tuple[str, ...]
    #: each shard's (or the one replica set's, under "") members as its topology names them; None: no topology
    members: dict[str, tuple[str, ...] | None]

    def describe(self) -> str:
        if not self.shards:
            return "the topology of one replica set (no shards)"
        n = len(self.shards)
        return f"a topology of {n} shard{'s' if n > 1 else ''} (etcd's bucket map names {', '.join(self.shards)})"


#: how long make run waits for etcd's answer when it reads what var/ holds
RECORDED_READ_S = 5.0


def read_recorded(etcd_urls: list[str]) -> Recorded | None:
    """The bucket map and topologies an earlier make run left in etcd (None: nothing, a new var/)."""
    from smartcache.cli import etcd  # noqa: PLC0415 - needs the server extra, as make run does
    from smartcache.wire import topology  # noqa: PLC0415 - as above, beside it

    def members(cluster: str) -> tuple[str, ...] | None:
        found = etcd.read(etcd_urls, topology.topology_key(cluster), RECORDED_READ_S)
        try:
            return tuple(m.address for m in topology.parse(found[0][1]).members) if found else None
        except ValueError:
            return None  # unreadable: nothing to compare with (the instances say what is wrong with it)

    try:
        found = etcd.read(etcd_urls, topology.buckets_key(CLUSTER), RECORDED_READ_S)
        if found:
            doc = json.loads(found[0][1])
            shards = tuple(str(s) for s in doc.get("shards") or ()) if isinstance(doc, dict) else ()
            return Recorded(shards, {s: members(topology.shard_cluster(CLUSTER, s)) for s in shards})
        one = members(CLUSTER)
    except etcd.EtcdUnavailable as e:
        raise NotReady(f"etcd did not say what var/ holds: {e}") from e
    return None if one is None else Recorded((), {"": one})


def settle_shards(plan: Plan, recorded: Recorded | None) -> tuple[Plan, str | None]:
    """The plan to run on what var/ holds, and a line for the banner saying so (None: nothing to say).

    Without SMARTCACHE_SHARDS, make run starts every shard the bucket map names (s1..sN, N <= MAX_SHARDS, each
    on its usual ports): a shard left out leaves the clients of its buckets with no storage (issue 35: half of
    them answered STORAGE_UNAVAILABLE; here the service was never ready, no /health/ready in 30 s). A shard
    count that differs from the one var/ holds, shards make run cannot start, or a topology whose instances are
    all on other ports than this make run's: BadEnvironment, one sentence saying how to go on.
    """
    if recorded is None:
        return plan, None
    n = max(1, len(recorded.shards))
    again = (
        f"run `{SHARDS_VARIABLE}={n} make run`, or `make reset-data` to start over"
        if recorded.shards
        else f"run `make run` without {SHARDS_VARIABLE}, or `make reset-data` to start over"
    )
    held = f"{plan.base} holds {recorded.describe()}"
    if not recorded.shards:
        if plan.shards > 1:
            raise BadEnvironment(f"{held}, which {SHARDS_VARIABLE}={plan.shards} would leave out of reach: {again}")
        wanted = plan
    elif list(recorded.shards) != [f"s{k}" for k in range(1, n + 1)] or not 2 <= n <= MAX_SHARDS:
        raise BadEnvironment(
            f"{held}, which make run cannot start (it starts 2..{MAX_SHARDS} shards named s1, s2...):"
            " start them as they were started (docs/sharding.md), or `make reset-data` to start over"
        )
    elif plan.shards_given and plan.shards != n:
        raise BadEnvironment(f"{held}, not the {plan.shards} {SHARDS_VARIABLE}={plan.shards} asks for: {again}")
    else:
        wanted = plan.with_shards(n)
    for k, name in enumerate(recorded.shards or ("",), 1):
        members = recorded.members.get(name)
        if members is not None and not set(members) & set(wanted.addresses(k)):
            raise BadEnvironment(
                f"{held}, whose {name or 'instances'} {'are' if not name else 'is'} on {', '.join(members)}, not on"
                f" this make run's {', '.join(wanted.addresses(k))}: run it with the ports it was made with"
                f" (the same {PORT_OFFSET_VARIABLE}), or `make reset-data` to start over"
            )
    if not recorded.shards or plan.shards_given:
        return wanted, None
    return wanted, (
        f"{', '.join(wanted.shard_names())}, the {n} that {plan.base} holds (etcd's bucket map): without"
        f" {SHARDS_VARIABLE} make run starts them all; `make reset-data` starts over with one replica set"
    )


def seed_shards(shards: list[str], etcd_urls: list[str]) -> str:
    """SMARTCACHE_SHARDS=N: the bucket map and each shard's buckets (`cluster init --shards`, idempotent)."""
    from smartcache.cli import cluster  # noqa: PLC0415 - needs the server extra's connector, as make run does

    access = cluster.Access(
        addresses=(),
        user=os.environ.get("SC_OPERATOR_USER") or "operator",
        password=os.environ.get("SC_OPERATOR_PASSWORD") or "operator",
        etcd=etcd_urls,
        cluster=CLUSTER,
    )
    # A shard that has just made its topology may have no leader for a moment (NO_LEADER): asked again,
    # since every step of it is idempotent.
    deadline = time.monotonic() + SHARDS_INIT_S
    made = False
    while True:
        r = cluster.shards_init(access, shards, SHARD_BUCKETS)
        made = made or bool(r.get("created"))
        if r.get("status") == "OK":
            break
        if time.monotonic() > deadline:
            raise NotReady(f"the shards did not take their buckets in {SHARDS_INIT_S:g} s: {r}")
        time.sleep(0.5)
    ranges = ", ".join(f"{s} {first}..{last}" for first, last, s in r["map"]["ranges"])
    return f"{'made' if made else 'kept'} the bucket map ({r['map']['buckets']} buckets): {ranges}"


#: how long make run asks the shards to take their buckets (each must have a leader)
SHARDS_INIT_S = 30.0
#: the bucket count of make run's sharded cluster
SHARD_BUCKETS = 1024


def seed_topology(instances: list[Tarantool], etcd_urls: list[str], cluster_name: str = CLUSTER) -> str:
    """The cluster's first topology, once it formed: `smartcache-cli cluster init` (idempotent: a make run on the
    data of an earlier one keeps the topology it has, members added since included). What it did, in words."""
    from smartcache.cli import cluster  # noqa: PLC0415 - needs the server extra's connector, as make run does

    access = cluster.Access(
        addresses=[t.address for t in instances],
        user=os.environ.get("SC_OPERATOR_USER") or "operator",
        password=os.environ.get("SC_OPERATOR_PASSWORD") or "operator",
        etcd=etcd_urls,
        cluster=cluster_name,
    )
    r = cluster.topology_init(access)
    if r.get("status") != "OK":
        return f"no topology ({r.get('reason') or r.get('status')}: {r.get('message')}): SC_CLUSTER_SIZE decides"
    made = "made the topology" if r.get("created") else "the topology is"
    return f"{made} (version {r['version']}): {r['members']}; smartcache-cli cluster add|remove changes it"


def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as r:  # noqa: S310 - our own local endpoint
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


# -- the coloured tail of all logs, on a terminal ----------------------------------------------

#: Tarantool's JSON log keys -> structlog's; the rest of its fields are noise on a terminal
_TARANTOOL_KEYS = {"time": "timestamp", "message": "event"}
_NOISE = ("pid", "cord_name", "fiber_id", "fiber_name", "file", "line")
_NAME_COLOURS = ("\x1b[36m", "\x1b[35m", "\x1b[33m", "\x1b[32m", "\x1b[34m")
_RESET = "\x1b[0m"


class LogTail:
    """Follows the children's logs from their run_started marker; prints each line rendered by structlog.

    A daemon thread polls the files; ``banner`` prints between two polls, so lines never interleave.
    """

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self._renderer = structlog.dev.ConsoleRenderer(colors=True, pad_event_to=25)
        self._files: list[tuple[Child, str, Any]] = []
        self._partial: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-tail", daemon=True)

    def start(self) -> LogTail:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Print what is left, then stop following (the thread is a daemon: a wait is bounded, never a hang)."""
        self._stop.set()
        self._thread.join(TAIL_JOIN_TIMEOUT_S)
        self.poll()
        for _, _, f in self._files:
            f.close()

    def _run(self) -> None:
        while not self._stop.wait(TAIL_POLL_S):
            self.poll()

    def banner(self, lines: list[tuple[str, str]]) -> None:
        self.poll()
        with self._lock:
            _banner(lines, self.out)

    def say(self, text: str, out: TextIO) -> None:
        """One line of make run's own, between two polls (never in the middle of a child's line)."""
        self.poll()
        with self._lock:
            print(text, file=out, flush=True)

    def follow(self, child: Child) -> None:
        f = child.log_path.open("rb")
        f.seek(child.log_offset)
        colour = _NAME_COLOURS[len(self._files) % len(_NAME_COLOURS)]
        with self._lock:
            self._files.append((child, f"{colour}{child.name:<8}{_RESET}|", f))

    def poll(self) -> None:
        """Print every complete line written since the last poll."""
        with self._lock:
            for child, prefix, f in self._files:
                data = self._partial.pop(child.name, b"") + f.read()
                *lines, rest = data.split(b"\n")
                if rest:
                    self._partial[child.name] = rest
                for line in lines:
                    if line.strip():
                        print(prefix, self.render(line.decode(errors="replace")), file=self.out)
            self.out.flush()

    def render(self, line: str) -> str:
        """A JSON log line (ours or Tarantool's) as one readable, coloured line; anything else as is."""
        try:
            doc = json.loads(line)
        except ValueError:
            return line
        if not isinstance(doc, dict):
            return line
        event: dict[str, Any] = {_TARANTOOL_KEYS.get(str(k), str(k)): v for k, v in doc.items() if k not in _NOISE}
        event["level"] = str(event.get("level", "info")).lower()
        event["timestamp"] = str(event.get("timestamp", ""))[11:23]  # the time of day is enough here
        event.setdefault("event", "")
        return str(self._renderer(None, "", event))
