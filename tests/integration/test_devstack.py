"""`make run`: the whole stack starts, serves, and stops cleanly on Ctrl-C (SIGINT)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from service.client import Client
from service.devstack import free_port


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def test_make_run_stack_serves_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    ports = {
        name: free_port()
        for name in (
            "SC_MASTER_PORT",
            "SC_REPLICA_PORT",
            "SC_MASTER_HTTP_PORT",
            "SC_REPLICA_HTTP_PORT",
            "BACKEND_PORT",
            "SMARTCACHE_METRICS_PORT",
        )
    }
    listen = f"tcp://127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        **{k: str(v) for k, v in ports.items()},
        "SMARTCACHE_LISTEN": listen,
        "SMARTCACHE_VAR": str(tmp_path),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.devstack"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 60
        banner = ""
        while "Ctrl-C" not in banner:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, banner
            banner += proc.stdout.readline() if proc.stdout else ""
        assert listen in banner
        children = _children(proc.pid)
        assert len(children) == 4  # master, replica, backend, service
        with Client(listen, timeout_s=10) as c:
            created = c.session_create("devstack-client", data={"x": 1})
            assert created.ok
            assert c.device_bind("devstack-dev", "devstack-client").ok
        replica = f"http://127.0.0.1:{ports['SC_REPLICA_HTTP_PORT']}"
        health = httpx.get(f"{replica}/health", timeout=5).json()
        assert (health["role"], health["replication"][0]["upstream_status"]) == ("replica", "follow")
        metrics = httpx.get(f"http://127.0.0.1:{ports['SMARTCACHE_METRICS_PORT']}/metrics", timeout=5).text
        assert "smartcache_build_info" in metrics
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        assert not [pid for pid in children if _alive(pid)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
