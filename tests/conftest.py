"""Fixtures: one per real component, started on free 127.0.0.1 ports and stopped by PID."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tarantool

from smartcache.client import Client
from smartcache.devstack.stack import Tarantool, free_port
from smartcache.server import logs
from smartcache.server.app import Service
from smartcache.server.config import Settings
from smartcache.server.handlers import Context, Handler, Request
from smartcache.server.handlers.routes import ALL_HANDLERS
from tests.helpers import eventually


@pytest.fixture(autouse=True, scope="session")
def _reconfigurable_logs() -> None:
    """Loggers that never cache their configuration, so a test may capture logs after others logged."""
    logs.configure("debug", cache=False)


@contextlib.contextmanager
def connect(
    instance: Tarantool, user: str = "smartcache", password: str = "smartcache"
) -> Iterator[tarantool.Connection]:
    """A connector connection as the service user (execute on procedures only), closed after use."""
    conn = tarantool.connect("127.0.0.1", instance.port, user=user, password=password)
    try:
        yield conn
    finally:
        conn.close()


def call(conn: tarantool.Connection, proc: str, *args: object) -> dict:
    """Call a stored procedure (no deadline, no idempotency key); returns its result map."""
    return conn.call(f"sc.{proc}", [None, *args]).data[0]


@pytest.fixture(scope="session")
def storage_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Tarantool, Tarantool]]:
    """A master and a read-only replica replicating from it."""
    base = tmp_path_factory.mktemp("pair")
    master = Tarantool.create("master", base)
    replica = Tarantool.create("replica", base, read_only=True, replication=[master.address])
    try:
        master.start()
        master.wait_ready()
        replica.start()
        replica.wait_ready()
        yield master, replica
    finally:
        replica.stop()
        master.stop()


@pytest.fixture
def storage_pair_fresh(tmp_path: Path) -> Iterator[tuple[Tarantool, Tarantool]]:
    """A master and a read-only replica of their own, for tests that stop or break them."""
    master = Tarantool.create("master", tmp_path)
    replica = Tarantool.create("replica", tmp_path, read_only=True, replication=[master.address])
    try:
        master.start()
        master.wait_ready()
        replica.start()
        replica.wait_ready()
        yield master, replica
    finally:
        replica.stop()
        master.stop()


@pytest.fixture
def fresh_master(tmp_path: Path) -> Iterator[Tarantool]:
    """A master of its own, for tests that stop or break it."""
    master = Tarantool.create("master", tmp_path)
    try:
        master.start()
        master.wait_ready()
        yield master
    finally:
        master.stop()


# -- the service -----------------------------------------------------------------


@pytest.fixture(scope="session")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tarantool]:
    """One master for the service tests, with the test-only debug_sleep procedure."""
    master = Tarantool.create("svc-master", tmp_path_factory.mktemp("svc"), extra_env={"SC_DEBUG_PROCEDURES": "1"})
    try:
        master.start()
        master.wait_ready()
        yield master
    finally:
        master.stop()


def service_settings(storage: Tarantool, **overrides: object) -> Settings:
    base = Settings(
        listen="tcp://127.0.0.1:0",
        tarantool=(storage.address,),
        metrics_port=0,
        drain_timeout_s=5.0,
        events_listen="tcp://127.0.0.1:0",  # any free port: services of a test run side by side
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


class Running:
    """An in-process service and a client connected to it."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.endpoint = service.broker.endpoint
        self.client = Client(self.endpoint, timeout_s=10)

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.service.metrics_port}/metrics"

    def wait_workers(self, timeout_s: float = 10.0) -> None:
        """Until the service is ready: every worker slot announced, storage connected (PING is the broker's)."""
        eventually(lambda: all(self.service.ready().values()), timeout_s, what="service ready")


@contextlib.contextmanager
def running_service(settings: Settings, handlers: dict[str, Handler] | None = None) -> Iterator[Running]:
    service = Service(settings, handlers)
    service.start()
    running = Running(service)
    try:
        running.wait_workers()
        yield running
    finally:
        running.client.close(linger_ms=0)
        if service.broker.is_alive():
            service.stop()


class SlowProbe:
    """A test handler set: DEVICE_LOOKUP sleeps in Tarantool for body['device_id'] = 'sleep:<ms>'.

    It records how many run at once, so bulkhead tests can check the limit.
    """

    def __init__(self) -> None:
        self.running = 0
        self.max_running = 0
        self.calls = 0

    async def slow(self, req: Request, ctx: Context) -> dict:
        self.calls += 1
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            ms = int(req.body["device_id"].split(":")[1])
            return await ctx.storage.call("debug_sleep", [ms], job=req.job)
        finally:
            self.running -= 1

    def wait_running(self, n: int, timeout_s: float = 10.0) -> None:
        """Until n slow calls are in progress (the worker slot is taken)."""
        eventually(lambda: self.running >= n, timeout_s, interval_s=0.005, what=f"{n} slow calls running")

    def handlers(self) -> dict[str, Handler]:
        return {**ALL_HANDLERS, "DEVICE_LOOKUP": self.slow}


@pytest.fixture(scope="module")
def svc(storage: Tarantool) -> Iterator[Running]:
    """A default service (100 workers, queue 3000) shared by a module's tests."""
    with running_service(service_settings(storage)) as r:
        yield r


@dataclasses.dataclass
class ServiceProcess:
    proc: subprocess.Popen[bytes]
    endpoint: str
    metrics_port: int
    log_path: Path

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        return self.proc.wait(timeout_s)


def service_env(tarantool: str, **env: str) -> tuple[dict[str, str], int, int]:
    """The environment of a real service process on free ports: (environment, client port, metrics port)."""
    port, metrics_port = free_port(), free_port()
    full_env = {
        **os.environ,
        "SMARTCACHE_LISTEN": f"tcp://127.0.0.1:{port}",
        "SMARTCACHE_TARANTOOL": tarantool,
        "SMARTCACHE_METRICS_PORT": str(metrics_port),
        "SMARTCACHE_EVENTS_LISTEN": f"tcp://127.0.0.1:{free_port()}",
        **env,
    }
    return full_env, port, metrics_port


@contextlib.contextmanager
def service_process(storage: Tarantool, tmp_path: Path, **env: str) -> Iterator[ServiceProcess]:
    """The real `python -m smartcache.server` as a child process, stopped by its PID."""
    full_env, port, metrics_port = service_env(storage.address, **env)
    log_path = tmp_path / "service.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "smartcache.server"], env=full_env, stdout=log, stderr=subprocess.STDOUT
        )
    sp = ServiceProcess(proc, f"tcp://127.0.0.1:{port}", metrics_port, log_path)
    try:
        with Client(sp.endpoint, timeout_s=0.5) as c:
            deadline = time.monotonic() + 20
            while True:
                try:
                    if c.device_lookup("readiness-probe").status in ("NOT_FOUND", "OK"):
                        break
                except Exception:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise
        yield sp
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
