"""`make run`: the whole stack starts, serves, shows its logs and stops cleanly on Ctrl-C (SIGINT);
it refuses to start next to another one, naming the variable to change and what holds the port (a port
held only by TIME-WAIT sockets the servers can bind over is free), and starts what var/ holds or says why not."""

from __future__ import annotations

import json
import os
import pty
import random
import shutil
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

from smartcache.devstack import loglines
from smartcache.devstack.logtail import LogTail
from smartcache.devstack.plan import (
    DEFAULT_EVENTS_PORT,
    DEFAULT_LISTEN_PORT,
    DEFAULT_PORTS,
    MAX_PORT_OFFSET,
    BadEnvironment,
    Plan,
)
from smartcache.devstack.shards import Recorded, settle_shards
from smartcache.devstack.sockets import ephemeral_range, free_port, listens, port_holders, port_is_free, tcp_states
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
        [sys.executable, "-m", "smartcache.devstack"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
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
        [sys.executable, "-m", "smartcache.devstack"], env=env, stdout=terminal.slave, stderr=terminal.slave
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


def test_the_tail_shows_routine_lines_at_their_weight_and_keeps_every_other_error() -> None:
    """Tarantool's CRITICAL "leaving orphan mode" and etcd's "E |" while a peer starts or stops are routine: shown
    at their weight, with the level they were logged at and why; every other error stays one."""
    orphan = loglines.parse(
        '{"timestamp": "2026-12-06T17:29:35.900Z", "level": "critical", "event": "leaving orphan mode"}'
    )
    assert orphan is not None
    assert (orphan["level"], orphan["logged_as"], orphan["timestamp"]) == ("info", "critical", "17:29:35.900")
    assert "replication connected" in orphan["why"]
    entering = loglines.parse('{"level": "critical", "event": "entering orphan mode"}')
    assert entering is not None
    assert (entering["level"], "logged_as" in entering) == ("critical", False)
    dial = loglines.parse(
        "2026-12-06 17:29:41.958950 E | rafthttp: failed to dial 1b4dd640a2c47188 on stream MsgApp v2"
        " (peer 1b4dd640a2c47188 failed to find local node 4e2b12bb45d8dfba)"
    )
    assert dial is not None
    assert (dial["level"], dial["logged_as"], dial["logger"], dial["timestamp"]) == (
        "warning",
        "error",
        "rafthttp",
        "17:29:41.958",
    )
    real = loglines.parse("2026-12-06 17:29:41.958950 E | etcdserver: publish error: etcdserver: request timed out")
    assert real is not None
    assert (real["level"], "logged_as" in real) == ("error", False)
    raft = loglines.parse("raft2026/12/06 17:29:20 INFO: 4e2b12bb45d8dfba became follower at term 0")
    assert raft is not None
    assert (raft["level"], raft["logger"]) == ("info", "raft")
    assert loglines.parse("Traceback (most recent call last):") is None
    shown = LogTail(sys.stdout).render('{"level": "critical", "event": "leaving orphan mode"}')
    assert "logged_as" in shown
    assert "critical" in shown  # said, never hidden


def _time_wait(port: int, *, server_side: bool) -> None:
    """Leave only a TIME-WAIT socket on 127.0.0.1:port: a server's accepted connection, closed by the server
    first (its listener set SO_REUSEADDR, as Tarantool, etcd and ZeroMQ do), or an outgoing connection's
    local end, closed by the client first (no SO_REUSEADDR, as most clients)."""
    with socket.socket() as listener:
        if server_side:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port if server_side else free_port()))
        listener.listen()
        client = socket.socket()
        if not server_side:
            client.bind(("127.0.0.1", port))
        client.connect(listener.getsockname())
        accepted, _ = listener.accept()
    first, last = (accepted, client) if server_side else (client, accepted)
    first.close()  # who closes first holds the TIME-WAIT
    peer = last.getsockname()[1]
    eventually(lambda: "08" in tcp_states(peer), 5, what="the first FIN received (CLOSE-WAIT)")
    last.close()
    eventually(lambda: tcp_states(port) == {"06"}, 5, what=f"only TIME-WAIT on {port}")


def _tarantool_binds(port: int, work_dir: Path) -> bool:
    """Whether a Tarantool (make run's storage) can listen on port: it binds and exits at once."""
    lua = f"box.cfg{{listen = '127.0.0.1:{port}', work_dir = '{work_dir}', log_level = 1}} os.exit(0)"
    done = subprocess.run(
        [shutil.which("tarantool") or "tarantool", "-e", lua],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=work_dir,
        check=False,
    )
    assert done.returncode == 0 or "Address already in use" in done.stdout + done.stderr, done
    return done.returncode == 0


def test_a_port_held_only_by_a_servers_time_wait_is_free_and_a_listener_on_it_is_not(tmp_path: Path) -> None:
    port = free_port()
    _time_wait(port, server_side=True)
    assert port_is_free(port)
    assert _tarantool_binds(port, tmp_path)  # the check says what the servers find
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
        assert not port_is_free(port)
        assert port_holders(port) == "a listening socket, another make run?"
    assert tcp_states(port) == {"06"}  # the TIME-WAIT was there all along


def test_a_port_held_by_an_outgoing_connections_time_wait_is_taken_for_tarantool_too(tmp_path: Path) -> None:
    """Linux lets a bind pass a TIME-WAIT socket only if both set SO_REUSEADDR: a client's did not."""
    port = free_port()
    _time_wait(port, server_side=False)
    assert not port_is_free(port)
    assert not _tarantool_binds(port, tmp_path)
    with pytest.raises(BadEnvironment) as refused:
        Plan.from_env({"BACKEND_PORT": str(port)}).check_ports(only=["BACKEND_PORT"])
    assert str(refused.value).startswith(
        f"port {port} (BACKEND_PORT) already in use ({port}: TIME-WAIT sockets of closed connections that did not"
        " set SO_REUSEADDR (outgoing ones), gone within 60 s): set each variable named to a free port"
    )


def test_a_taken_port_in_the_ephemeral_range_is_refused_naming_the_offsets_below_the_range() -> None:
    low, high = ephemeral_range()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # a port of the kernel's choosing: one of the ephemeral range
        s.listen()
        port = s.getsockname()[1]
        assert low <= port <= high
        with pytest.raises(BadEnvironment) as refused:
            Plan.from_env({"BACKEND_PORT": str(port)}).check_ports(only=["BACKEND_PORT"])
    highest_offset = low - 1 - max(*DEFAULT_PORTS.values(), DEFAULT_LISTEN_PORT, DEFAULT_EVENTS_PORT)
    assert str(refused.value) == (
        f"port {port} (BACKEND_PORT) already in use ({port}: a listening socket, another make run?): set each"
        " variable named to a free port, or move them all with SMARTCACHE_PORT_OFFSET=N;"
        f" {port} lies in the kernel's ephemeral range {low}-{high}, whose ports any outgoing connection may"
        f" take: SMARTCACHE_PORT_OFFSET up to {highest_offset} keeps every port below it"
    )


def _recorded(*shards: str, offset: int = 0) -> Recorded:
    """What etcd holds after a make run of these shards (none: one replica set) on that offset."""
    plan = Plan.from_env({"SMARTCACHE_PORT_OFFSET": str(offset), "SMARTCACHE_SHARDS": str(max(1, len(shards)))})
    if not shards:
        return Recorded((), {"": tuple(plan.addresses(1))})
    return Recorded(shards, {s: tuple(plan.addresses(k)) for k, s in enumerate(shards, 1)})


@pytest.mark.parametrize(
    ("env", "recorded", "said"),
    [
        ({}, None, 1),  # a new var/: one replica set, or what SMARTCACHE_SHARDS asks
        ({"SMARTCACHE_SHARDS": "2"}, None, 2),
        ({}, _recorded(), 1),
        ({}, _recorded("s1", "s2"), 2),  # every shard var/ holds, without being asked
        ({}, _recorded("s1", "s2", "s3"), 3),
        ({"SMARTCACHE_SHARDS": "2"}, _recorded("s1", "s2"), 2),
        (
            {"SMARTCACHE_SHARDS": "1"},
            _recorded("s1", "s2"),
            "holds a topology of 2 shards (etcd's bucket map names s1, s2), not the 1 SMARTCACHE_SHARDS=1 asks for:"
            " run `SMARTCACHE_SHARDS=2 make run`, or `make reset-data` to start over",
        ),
        ({"SMARTCACHE_SHARDS": "3"}, _recorded("s1", "s2"), 3),  # grown: s3 joins the map empty
        ({"SMARTCACHE_SHARDS": "2"}, _recorded(), 2),  # grown: the one replica set is s1, s2 joins empty
        ({"SMARTCACHE_SHARDS": "3"}, _recorded(), 3),
        ({"SMARTCACHE_SHARDS": "2"}, _recorded("s1"), 2),  # a growth stopped half-way goes on
        ({}, _recorded("s1", "s3"), "which make run cannot start (it starts 2..3 shards named s1, s2...)"),
        (
            {},
            _recorded("s1"),
            "holds a topology of 1 shard (etcd's bucket map names s1): a growth from one replica set stopped"
            " half-way; run `SMARTCACHE_SHARDS=2 make run`, or `make reset-data` to start over",
        ),
        ({}, _recorded("s1", "s2", offset=1000), "whose s1 is on 127.0.0.1:4301, 127.0.0.1:4302, 127.0.0.1:4303, not"),
        ({"SMARTCACHE_PORT_OFFSET": "1000"}, _recorded(), "whose instances are on 127.0.0.1:3301"),
    ],
)
def test_make_run_starts_what_var_holds_or_says_how_to_go_on(
    env: dict[str, str], recorded: Recorded | None, said: int | str
) -> None:
    plan = Plan.from_env({**env, "SMARTCACHE_VAR": "/v"})
    if isinstance(said, int):
        assert settle_shards(plan, recorded)[0].shards == said
        return
    with pytest.raises(BadEnvironment) as refused:
        settle_shards(plan, recorded)
    assert str(refused.value).startswith("/v holds ")
    assert said in str(refused.value)


@pytest.mark.parametrize(
    ("recorded", "asked", "added"),
    [((), 2, ("s2",)), ((), 3, ("s2", "s3")), (("s1",), 2, ("s2",)), (("s1", "s2"), 3, ("s3",)), (("s1", "s2"), 2, ())],
)
def test_more_shards_than_var_holds_are_added_empty_for_a_rebalance(
    recorded: tuple[str, ...], asked: int, added: tuple[str, ...]
) -> None:
    """SMARTCACHE_SHARDS above what var/ holds: the shards it lacks join the bucket map empty, and the banner names
    the rebalance that fills them (docs/sharding.md); one replica set is shard s1 from then on."""
    plan = Plan.from_env({"SMARTCACHE_SHARDS": str(asked), "SMARTCACHE_VAR": "/v"})
    settled, said = settle_shards(plan, _recorded(*recorded))
    assert (settled.shards, settled.added) == (asked, added)
    if not added:
        assert said is None
        return
    assert said is not None
    assert f"{', '.join(added)} joined the bucket map holding no bucket (cluster shard add)" in said
    assert "`.venv/bin/smartcache-cli cluster --cluster make-run rebalance --reason 'grown to " in said
    assert ("it is shard s1 now, its data where it was" in said) == (not recorded)


def test_s1_grown_from_one_replica_set_keeps_its_instances_and_their_data_where_they_were(tmp_path: Path) -> None:
    plan = Plan.from_env({"SMARTCACHE_SHARDS": "2", "SMARTCACHE_VAR": str(tmp_path)})
    assert [plan.instance_name(1, i) for i in (1, 2, 3)] == ["tarantool-s1-1", "tarantool-s1-2", "tarantool-s1-3"]
    (tmp_path / "tarantool-1").mkdir()  # one replica set ran here
    assert [plan.instance_name(k, 1) for k in (1, 2)] == ["tarantool-1", "tarantool-s2-1"]
    assert Plan.from_env({"SMARTCACHE_VAR": str(tmp_path)}).instance_name(1, 2) == "tarantool-2"


def test_a_shard_whose_topology_gained_or_lost_a_member_is_still_started() -> None:
    """A member added or removed with smartcache-cli cluster add|remove: the trio's ports still match."""
    plan = Plan.from_env({"SMARTCACHE_VAR": "/v"})
    s1, s2 = plan.with_shards(2).addresses(1), plan.with_shards(2).addresses(2)
    recorded = Recorded(("s1", "s2"), {"s1": (*s1, "127.0.0.1:4999"), "s2": tuple(s2[:2])})
    settled, banner = settle_shards(plan, recorded)
    assert settled.shards == 2
    assert settled.addresses(2) == s2
    assert banner == (
        "s1, s2, the 2 that /v holds (etcd's bucket map): without SMARTCACHE_SHARDS make run starts them all;"
        " `make reset-data` starts over with one replica set"
    )
