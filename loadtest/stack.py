"""A throw-away stack for benchmarks: Tarantool, the service as a child process, optionally the backend."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from service.client import Client
from service.devstack import Tarantool, free_port

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class ServiceUnderTest:
    proc: subprocess.Popen[bytes]
    endpoint: str
    metrics_port: int

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime

    def rss_bytes(self, field: str = "VmRSS") -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        return 0


@contextlib.contextmanager
def stack(service_env: dict[str, str] | None = None) -> Iterator[tuple[Tarantool, ServiceUnderTest]]:
    """Tarantool master + `python -m service` on free ports; everything stopped by PID afterwards."""
    base = Path(tempfile.mkdtemp(prefix="smartcache-bench-"))
    master = Tarantool.create("bench-master", base, extra_env={"SC_LOG_LEVEL": "4"})
    master.start()
    proc = None
    try:
        master.wait_ready()
        port, metrics_port = free_port(), free_port()
        env = {
            **os.environ,
            "SMARTCACHE_LISTEN": f"tcp://127.0.0.1:{port}",
            "SMARTCACHE_TARANTOOL": master.address,
            "SMARTCACHE_METRICS_PORT": str(metrics_port),
            **(service_env or {}),
        }
        with (base / "service.log").open("wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "service"], env=env, stdout=log, stderr=subprocess.STDOUT)
        sut = ServiceUnderTest(proc, f"tcp://127.0.0.1:{port}", metrics_port)
        _wait_ready(sut)
        yield master, sut
    finally:
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(30)
        master.stop()


def _wait_ready(sut: ServiceUnderTest, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    with Client(sut.endpoint, timeout_s=0.5) as c:
        while True:
            try:
                c.device_lookup("bench-readiness")
                return
            except Exception:
                if time.monotonic() > deadline or sut.proc.poll() is not None:
                    raise
