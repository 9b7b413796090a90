"""Local processes for `make run`, the tests and the load tests.

Starts Tarantool instances (lua/init.lua), the service and the simulated
backend as child processes on 127.0.0.1, waits until each is ready, and stops
each by its PID. Children get SIGTERM if this process dies (PR_SET_PDEATHSIG),
so nothing outlives its parent.

``python -m service.devstack`` is `make run`: master + replica, the service and
the simulated backend in the foreground; Ctrl-C stops them all.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LUA_INIT = ROOT / "lua" / "init.lua"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def http_get_json(url: str, timeout_s: float = 2.0) -> tuple[int, Any]:
    """GET a JSON document; returns (status, parsed body)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 - our own local endpoint
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


@dataclass
class Child:
    """A child process started by us and stopped by its PID."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.argv,
            env={**os.environ, **self.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only prctl(2), safe after fork
            start_new_session=True,  # Ctrl-C reaches only us; we stop children in order
        )
        log.close()

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

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> dict[str, Any]:
        """Wait until /health answers 200; returns the health document."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited:\n{self.log_tail()}")
            with contextlib.suppress(OSError, ValueError):
                status, doc = http_get_json(self.http_url + "/health", timeout_s=1.0)
                if status == 200:
                    return doc  # type: ignore[no-any-return]
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} not ready in {timeout_s}s:\n{self.log_tail()}")


def _banner(lines: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        print(f"  {k:<{width}}  {v}", flush=True)  # noqa: T201 - the point of `make run`


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, "") or default)


def main() -> int:
    """`make run`: master + replica, the simulated backend and the service, until Ctrl-C."""
    base = Path(os.environ.get("SMARTCACHE_VAR", ROOT / "var"))
    master = Tarantool.create(
        "master", base, port=_env_int("SC_MASTER_PORT", 3301), http_port=_env_int("SC_MASTER_HTTP_PORT", 8301)
    )
    replica = Tarantool.create(
        "replica",
        base,
        port=_env_int("SC_REPLICA_PORT", 3302),
        http_port=_env_int("SC_REPLICA_HTTP_PORT", 8302),
        read_only=True,
        replication=[master.address],
    )
    backend_port = _env_int("BACKEND_PORT", 8090)
    backend = Child(
        name="backend",
        argv=[sys.executable, "-m", "loadtest.backend", "--port", str(backend_port)],
        env={},
        log_path=base / "backend.log",
    )
    listen = os.environ.get("SMARTCACHE_LISTEN", "tcp://127.0.0.1:5555")
    metrics_port = _env_int("SMARTCACHE_METRICS_PORT", 9105)
    service = Child(
        name="service",
        argv=[sys.executable, "-m", "service"],
        log_path=base / "service.log",
        env={
            "SMARTCACHE_LISTEN": listen,
            "SMARTCACHE_TARANTOOL": master.address,
            "SMARTCACHE_METRICS_PORT": str(metrics_port),
            "SMARTCACHE_BACKEND_URL": f"http://127.0.0.1:{backend_port}",
        },
    )
    children: list[Child] = []
    stopping = False

    def on_signal(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        for instance in (master, replica):
            instance.start()
            children.append(instance)
            instance.wait_ready()
        for child in (backend, service):
            child.start()
            children.append(child)
        _wait_for_port(backend_port, backend)
        _wait_for_port(metrics_port, service)
        _banner(
            [
                ("service (ZeroMQ)", f"{listen}  log {service.log_path}"),
                ("service metrics", f"http://127.0.0.1:{metrics_port}/metrics"),
                ("tarantool master", f"{master.address}  http {master.http_url}  log {master.log_path}"),
                ("tarantool replica", f"{replica.address}  http {replica.http_url}  log {replica.log_path}"),
                ("simulated backend", f"http://127.0.0.1:{backend_port}  log {backend.log_path}"),
                ("try", f".venv/bin/smartcache-cli --endpoint {listen} ping"),
                ("stop", "Ctrl-C"),
            ]
        )
        while not stopping and all(c.alive() for c in children):
            time.sleep(0.2)
        for c in children:
            if not stopping and not c.alive():
                print(f"{c.name} exited unexpectedly:\n{c.log_tail()}", file=sys.stderr)  # noqa: T201
                return 1
        return 0
    finally:
        for c in reversed(children):  # service first (it drains), storage last
            c.stop()


def _wait_for_port(port: int, child: Child, timeout_s: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not child.alive():
            raise RuntimeError(f"{child.name} exited:\n{child.log_tail()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"{child.name} did not open port {port}:\n{child.log_tail()}")


if __name__ == "__main__":
    sys.exit(main())
