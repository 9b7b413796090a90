"""`make run`: the whole stack starts, serves, shows its logs and stops cleanly on Ctrl-C (SIGINT);
it refuses to start next to another one, naming the variable to change."""

from __future__ import annotations

import json
import os
import pty
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devtools.devstack import (
    DEFAULT_EVENTS_PORT,
    DEFAULT_LISTEN_PORT,
    DEFAULT_PORTS,
    MAX_PORT_OFFSET,
    BadEnvironment,
    LogTail,
    Plan,
    free_port,
    listens,
    port_is_free,
)
from tests.helpers import eventually

PORT_VARIABLES = tuple(DEFAULT_PORTS)
LOGS = ("etcd-1", "etcd-2", "etcd-3", "tarantool-1", "tarantool-2", "tarantool-3", "backend", "service")


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


def _stack_env(var: Path) -> dict[str, str]:
    """make run's variables, every port a free one, data and logs in var."""
    return {
        **os.environ,
        **{name: str(free_port()) for name in PORT_VARIABLES},
        "SMARTCACHE_LISTEN": f"tcp://127.0.0.1:{free_port()}",
        "SMARTCACHE_EVENTS_LISTEN": f"tcp://127.0.0.1:{free_port()}",
        "SMARTCACHE_VAR": str(var),
    }


def _moved_stack_env(var: Path) -> tuple[dict[str, str], int]:
    """The environment of a user who moves the whole stack with one variable; (env, the offset)."""
    clean = {k: v for k, v in os.environ.items() if k not in DEFAULT_PORTS and not k.startswith("SMARTCACHE_")}
    for _ in range(100):
        offset = random.randrange(20000, MAX_PORT_OFFSET)
        if all(port_is_free(p + offset) for p in (*DEFAULT_PORTS.values(), DEFAULT_LISTEN_PORT, DEFAULT_EVENTS_PORT)):
            return {**clean, "SMARTCACHE_PORT_OFFSET": str(offset), "SMARTCACHE_VAR": str(var)}, offset
    raise AssertionError("no free offset")


def _cli(env: dict[str, str], *args: str) -> dict:
    """smartcache-cli as a user types it (no --endpoint); its JSON output."""
    cli = Path(sys.executable).parent / "smartcache-cli"
    done = subprocess.run([str(cli), *args], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _make_run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A make run expected to stop at once (its checks fail)."""
    return subprocess.run(
        [sys.executable, "-m", "devtools.devstack"], env=env, capture_output=True, text=True, timeout=60, check=False
    )


class Terminal:
    """A pseudo-terminal as a child's stdout and stderr; a thread collects what the child prints."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every writer is gone
                return
            if not chunk:
                return
            self._chunks.append(chunk)

    @property
    def text(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")

    def wait_for(self, text: str, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.text:
            assert proc.poll() is None, f"exited {proc.returncode}:\n{self.text}"
            assert time.monotonic() < deadline, f"no {text!r} in:\n{self.text}"
            time.sleep(0.05)

    def close(self) -> None:
        os.close(self.master)


@pytest.fixture
def terminal() -> Iterator[Terminal]:
    t = Terminal()
    yield t
    t.close()


def test_make_run_moved_by_one_variable_serves_the_quick_start_shows_coloured_logs_and_stops_on_ctrl_c(
    tmp_path: Path, terminal: Terminal
) -> None:
    env, offset = _moved_stack_env(tmp_path)
    listen = f"tcp://127.0.0.1:{DEFAULT_LISTEN_PORT + offset}"
    metrics = f"http://127.0.0.1:{DEFAULT_PORTS['SMARTCACHE_METRICS_PORT'] + offset}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "devtools.devstack"], env=env, stdout=terminal.slave, stderr=terminal.slave
    )
    os.close(terminal.slave)
    try:
        terminal.wait_for("Ctrl-C", proc)
        assert listen in terminal.text
        children = _children(proc.pid)
        assert len(children) == 9  # three etcd members, three Tarantool instances, backend, service, console
        assert "(leader)" in terminal.text  # the banner says who leads
        # the README's quick start, with nothing but SMARTCACHE_PORT_OFFSET set
        assert _cli(env, "ping")["status"] == "OK"
        created = _cli(env, "session-create", "client-7", "--data", '{"step": 1}')
        assert _cli(env, "session-get", created["session_id"])["data"] == {"step": 1}
        assert _cli(env, "device-bind", "dev-1", "client-7")["status"] == "OK"
        assert _cli(env, "app-start", "dev-1")["status"] == "SENT"
        assert _cli(env, "products-get", "client-7", "1")["status"] == "OK"
        roles = sorted(
            httpx.get(f"http://127.0.0.1:{DEFAULT_PORTS[f'SC_HTTP_PORT_{i}'] + offset}/health", timeout=5).json()[
                "role"
            ]
            for i in (1, 2, 3)
        )
        assert roles == ["follower", "follower", "leader"]
        status = subprocess.run(
            [sys.executable, "-m", "smartcache.cli", "cluster", "status"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert status.returncode == 0, status.stdout  # exactly one writable, everyone reachable
        assert "smartcache_build_info" in httpx.get(f"{metrics}/metrics", timeout=5).text
        console = f"http://127.0.0.1:{DEFAULT_PORTS['SMARTCACHE_CONSOLE_PORT'] + offset}"
        eventually(lambda: httpx.get(f"{console}/api/status", timeout=5).json().get("leader"), 30, what="console")
        assert httpx.get(f"{metrics}/health/ready", timeout=5).status_code == 200

        # the terminal shows every child's log, one coloured readable line each (not JSON)
        terminal.wait_for("service_started", proc)
        line = next(li for li in terminal.text.splitlines() if "service_started" in li)
        assert "service" in line.split("|")[0]
        assert "\x1b[" in line
        assert "{" not in line.split("service_started")[0]
        assert "bound to 127.0.0.1" in terminal.text  # Tarantool's own lines too

        # a second make run next to this one stops before starting anything, naming the variables
        second = _make_run({**env, "SMARTCACHE_VAR": str(tmp_path / "second")})
        assert second.returncode == 1
        assert "Traceback" not in second.stderr
        assert second.stderr.startswith("make run: ")
        for name in (*PORT_VARIABLES, "SMARTCACHE_LISTEN"):
            assert name in second.stderr
        assert "SMARTCACHE_PORT_OFFSET" in second.stderr
        assert not (tmp_path / "second").exists()

        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        assert not [pid for pid in children if _alive(pid)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    for name in LOGS:  # this run's lines start at its marker
        first = json.loads((tmp_path / f"{name}.log").read_text().splitlines()[0])
        assert (first["event"], first["process"], first["by_pid"]) == ("run_started", name, proc.pid)


def test_make_run_refuses_a_port_that_is_taken_and_names_its_variable(tmp_path: Path) -> None:
    env = _stack_env(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _make_run({**env, "BACKEND_PORT": str(port)})
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"make run: port {port} (BACKEND_PORT) already in use")
    assert "set each variable named to a free port" in line
    assert done.stdout == ""
    assert not tmp_path.exists() or not list(tmp_path.iterdir())  # nothing was started


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"SC_PORT_1": "abc"}, "SC_PORT_1='abc'"),
        ({"SMARTCACHE_METRICS_PORT": "99999"}, "SMARTCACHE_METRICS_PORT='99999'"),
        ({"SC_PORT_1": "4001", "SC_PORT_2": "4001"}, "SC_PORT_1 and SC_PORT_2 share port 4001"),
        ({"SMARTCACHE_LISTEN": "127.0.0.1:5555"}, "SMARTCACHE_LISTEN"),
        ({"SMARTCACHE_WORKERS": "0"}, "SMARTCACHE_WORKERS='0'"),  # the service's own settings are checked first
    ],
)
def test_make_run_refuses_bad_values_naming_the_variable(tmp_path: Path, overrides: dict[str, str], named: str) -> None:
    done = _make_run({**_stack_env(tmp_path), **overrides})
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith("make run: ")
    assert named in line


def test_one_variable_moves_every_default_port() -> None:
    plan = Plan.from_env({"SMARTCACHE_PORT_OFFSET": "1000", "BACKEND_PORT": "7000"})
    assert plan.ports == {
        **{name: port + 1000 for name, port in DEFAULT_PORTS.items()},
        "BACKEND_PORT": 7000,  # a port set by its own variable stays
        "SMARTCACHE_LISTEN": 6555,
        "SMARTCACHE_EVENTS_LISTEN": 6556,
    }
    assert plan.listen == "tcp://127.0.0.1:6555"
    with pytest.raises(BadEnvironment, match="SMARTCACHE_PORT_OFFSET"):
        Plan.from_env({"SMARTCACHE_PORT_OFFSET": "60000"})


def test_listens_tells_the_process_holding_a_port_from_any_other() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert listens(os.getpid(), port)
        assert not listens(os.getppid(), port)
    assert not listens(os.getpid(), port)


def test_the_tail_renders_our_json_tarantool_json_and_plain_lines() -> None:
    tail = LogTail(sys.stdout)
    ours = tail.render(
        json.dumps({"event": "service_started", "level": "info", "timestamp": "2026-01-02T03:04:05.678Z"})
    )
    assert "service_started" in ours
    assert "03:04:05.678" in ours
    assert "\x1b[" in ours
    tarantool = tail.render(
        json.dumps(
            {"time": "2026-01-02T03:04:05.678+0000", "level": "INFO", "message": "ready", "pid": 7, "fiber_id": 1}
        )
    )
    assert "ready" in tarantool
    assert "fiber_id" not in tarantool
    assert tail.render("Traceback (most recent call last):") == "Traceback (most recent call last):"
