"""smartcache-cli and smartcache as real subprocesses: help, versions, JSON output, exit codes, errors."""

from __future__ import annotations

import argparse
import json
import os
import pty
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from smartcache import __version__
from smartcache.cli.main import _parser
from smartcache.devstack.stack import Tarantool, free_port
from smartcache.wire import sessionkeys
from tests.conftest import Running, service_process

BIN = Path(sys.executable).parent
SUBCOMMANDS = [
    "ping",
    "session-create",
    "session-get",
    "session-touch",
    "session-delete",
    "session-update",
    "session-list",
    "session-rotate",
    "session-delete-client",
    "cache-put",
    "cache-get",
    "cache-delete",
    "device-bind",
    "device-lookup",
    "app-start",
    "products-get",
    "info",
    "cluster",
    "audit",
    "keys",
    "counter-get",
    "counter-add",
    "counter-cas",
    "register-get",
    "register-cas",
    "sequence-get",
    "semaphore-get",
    "semaphore-release",
    "latch-get",
    "latch-count-down",
    "queue-stats",
    "queue-put",
    "events",
]


def run(program: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SMARTCACHE_")}
    return subprocess.run(
        [str(BIN / program), *args], env={**full_env, **env}, capture_output=True, text=True, timeout=60, check=False
    )


def cli(svc: Running, *args: str) -> tuple[int, dict]:
    """Run smartcache-cli against svc; (exit code, the JSON object it printed)."""
    done = run("smartcache-cli", "--endpoint", svc.endpoint, *args)
    assert done.stderr == ""
    return done.returncode, json.loads(done.stdout)


# -- smartcache-cli ----------------------------------------------------------------


def test_cli_ping_prints_ok_and_exits_0(svc: Running) -> None:
    code, out = cli(svc, "ping")
    assert (code, out["status"]) == (0, "OK")


def test_a_session_id_is_printed_by_create_only_and_session_list_shows_handles(svc: Running) -> None:
    """The id is the client's credential: session-create prints it (UUID text) with its handle; session-list names
    each session by its handle alone, and session-delete --handle --client ends one (sign out a device)."""
    client = f"cli-{uuid.uuid4()}"
    code, created = cli(svc, "session-create", client, "--data", '{"step": 1}', "--ttl", "60")
    assert (code, created["status"]) == (0, "OK")
    sid, handle = created["session_id"], created["handle"]
    assert str(uuid.UUID(sid)) == sid
    assert sessionkeys.is_handle(handle)
    code, got = cli(svc, "session-get", sid)
    assert (code, got["data"]) == (0, {"step": 1})
    listed = run("smartcache-cli", "--endpoint", svc.endpoint, "session-list", client)
    assert listed.returncode == 0
    assert [s["handle"] for s in json.loads(listed.stdout)["sessions"]] == [handle]
    assert sid not in listed.stdout, "no session id in a listing"
    assert sid.replace("-", "") not in listed.stdout
    code, deleted = cli(svc, "session-delete", "--handle", handle, "--client", client)
    assert (code, deleted["status"]) == (0, "OK")
    assert cli(svc, "session-get", sid)[1]["status"] == "NOT_FOUND"


def test_a_binding_and_an_absolute_lifetime_are_given_on_the_command_line(svc: Running) -> None:
    client = f"cli-{uuid.uuid4()}"
    code, created = cli(svc, "session-create", client, "--binding", "dev-7", "--max-lifetime", "600")
    assert code == 0
    assert 590_000 < created["absolute_expires_in_ms"] <= 600_000
    sid = created["session_id"]
    assert cli(svc, "session-get", sid)[1]["status"] == "BINDING_MISMATCH"
    assert cli(svc, "session-get", sid, "--binding", "dev-7")[1]["status"] == "OK"
    code, rotated = cli(svc, "session-rotate", sid, "--binding", "dev-7", "--grace-ms", "0")
    assert code == 0
    assert cli(svc, "session-get", sid, "--binding", "dev-7")[1]["status"] == "NOT_FOUND"  # no grace
    assert cli(svc, "session-get", rotated["session_id"], "--binding", "dev-7")[1]["status"] == "OK"


def test_another_status_exits_1(svc: Running) -> None:
    code, out = cli(svc, "session-get", str(uuid.uuid4()))
    assert (code, out["status"]) == (1, "NOT_FOUND")


def test_data_that_is_not_json_is_refused_unless_raw(svc: Running) -> None:
    client = f"cli-{uuid.uuid4()}"
    refused = run("smartcache-cli", "--endpoint", svc.endpoint, "session-create", client, "--data", "{step: 1")
    assert refused.returncode == 2
    error = json.loads(refused.stdout)
    assert error["error"] == "BAD_ARGUMENT"
    assert "not valid JSON" in error["message"]
    assert "--raw" in error["message"]
    assert refused.stderr.startswith("usage: smartcache-cli")
    assert cli(svc, "session-list", client)[1]["sessions"] == []  # nothing was sent
    code, created = cli(svc, "session-create", client, "--data", "{step: 1", "--raw")
    assert code == 0
    assert cli(svc, "session-get", created["session_id"])[1]["data"] == "{step: 1"


def test_cache_put_data_is_json_too(svc: Running) -> None:
    assert run("smartcache-cli", "--endpoint", svc.endpoint, "cache-put", "k-cli", "nope").returncode == 2
    assert cli(svc, "cache-put", "k-cli", '"yes"', "--data-type", "2")[0] == 0
    assert cli(svc, "cache-get", "k-cli")[1]["data"] == "yes"


def test_a_bad_session_id_is_a_bad_argument() -> None:
    done = run("smartcache-cli", "session-get", "not-a-uuid")
    assert done.returncode == 2
    error = json.loads(done.stdout)
    assert error["error"] == "BAD_ARGUMENT"
    assert "not a session id" in error["message"]
    assert "Traceback" not in done.stderr


def test_the_endpoint_comes_from_smartcache_endpoint(svc: Running) -> None:
    done = run("smartcache-cli", "ping", SMARTCACHE_ENDPOINT=svc.endpoint)
    assert (done.returncode, json.loads(done.stdout)["status"]) == (0, "OK")


def test_a_timeout_names_the_endpoint_it_tried_and_exits_3_not_as_a_usage_error() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"  # nobody listens there
    done = run("smartcache-cli", "--timeout", "0.3", "ping", SMARTCACHE_ENDPOINT=endpoint)
    assert done.returncode == 3
    out = json.loads(done.stdout)
    assert (out["error"], out["endpoint"]) == ("TIMEOUT", endpoint)
    assert endpoint in out["message"]


def test_a_malformed_endpoint_is_a_bad_argument() -> None:
    done = run("smartcache-cli", "--endpoint", "localhost:5555", "ping")
    assert done.returncode == 2
    error = json.loads(done.stdout)
    assert error["error"] == "BAD_ARGUMENT"
    assert "localhost:5555" in error["message"]
    assert "Traceback" not in done.stderr


def test_a_missing_argument_is_a_bad_argument_too() -> None:
    done = run("smartcache-cli", "products-get", "client-7")
    assert done.returncode == 2
    assert json.loads(done.stdout)["error"] == "BAD_ARGUMENT"
    assert "data_type" in done.stderr  # the usage


def test_cli_help_documents_endpoint_and_exit_codes() -> None:
    done = run("smartcache-cli", "--help")
    assert done.returncode == 0
    for text in ("SMARTCACHE_ENDPOINT", "--endpoint", "Exit codes", *SUBCOMMANDS):
        assert text in done.stdout
    for code in range(6):
        assert f"\n  {code}  " in done.stdout


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (["ping"], {"SMARTCACHE_PORT_OFFSET": "abc"}, "SMARTCACHE_PORT_OFFSET='abc': a whole number 0..56425"),
        (["ping"], {"SMARTCACHE_PORT_OFFSET": "99999"}, "SMARTCACHE_PORT_OFFSET='99999': a whole number 0..56425"),
        (["--timeout", "-1", "ping"], {}, "argument --timeout: must be a number of seconds above 0, not -1"),
        (["session-create", ""], {}, "argument client_id: the client id is empty"),
        (["sesion-get", "x"], {}, "invalid choice: 'sesion-get' (did you mean session-get"),
        (["cluster", "status", "--jsn"], {}, "--jsn (did you mean --json?)"),
    ],
    ids=["offset abc", "offset 99999", "timeout -1", "empty client id", "mistyped command", "mistyped option"],
)
def test_what_newcomers_typed_is_refused_with_a_precise_message_and_exit_2(
    args: list[str], env: dict[str, str], said: str
) -> None:
    done = run("smartcache-cli", *args, **env)
    assert done.returncode == 2
    doc = json.loads(done.stdout)
    assert doc["error"] == "BAD_ARGUMENT"
    assert said in doc["message"]
    assert "Traceback" not in done.stderr


def test_events_tail_prints_json_lines_on_a_terminal_as_the_readme_says(svc: Running) -> None:
    """The README: `smartcache-cli events tail  # every change as a JSON line`, typed on a terminal (a pseudo-
    terminal here); --format columns lays them out for reading."""
    assert svc.service.events is not None
    topic = f"app.tty-{uuid.uuid4().hex[:8]}"
    seq = svc.client.event_publish(topic, {"n": 1}, key="k1").body["seq"]
    tail = [str(BIN / "smartcache-cli"), "--endpoint", svc.endpoint, "events", "tail", "--topic", topic]
    tail += ["--from", str(seq), "--count", "1", "--publishers", svc.service.events.endpoint]
    for extra, as_json in (([], True), (["--format", "columns"], False)):
        out = bytearray()

        def read(fd: int, out: bytearray = out) -> bytes:
            data = os.read(fd, 1024)
            out.extend(data)
            return data

        assert os.waitstatus_to_exitcode(pty.spawn([*tail, *extra], read)) == 0
        (line,) = out.decode().replace("\r\n", "\n").strip().splitlines()
        if as_json:
            assert json.loads(line)["seq"] == seq
        else:
            assert line.startswith(f"{seq}  {topic}  k1  ")


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_help(command: str) -> None:
    done = run("smartcache-cli", command, "--help")
    assert done.returncode == 0
    assert f"usage: smartcache-cli {command}" in done.stdout


def test_every_argument_has_help_text() -> None:
    parser = _parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert sorted(sub.choices) == sorted(SUBCOMMANDS)
    for name, p in [("", parser), *sub.choices.items()]:
        for action in p._actions:
            assert action.help, f"{name} {action.dest} has no help"


def test_products_get_help_says_what_data_types_mean() -> None:
    words = " ".join(run("smartcache-cli", "products-get", "--help").stdout.split())  # argparse wraps lines
    assert "1 accounts, 2 cards, 3 deposits, 4 loans are prewarmed by default" in words


def test_cli_version() -> None:
    done = run("smartcache-cli", "--version")
    assert (done.returncode, done.stdout.split()[:2]) == (0, ["smartcache-cli", __version__])


# -- smartcache (the service) ---------------------------------------------------------


def test_service_help_does_not_start_the_service() -> None:
    port, metrics_port = free_port(), free_port()
    done = run(
        "smartcache", "--help", SMARTCACHE_LISTEN=f"tcp://127.0.0.1:{port}", SMARTCACHE_METRICS_PORT=str(metrics_port)
    )
    assert done.returncode == 0
    assert "usage: smartcache" in done.stdout
    assert "SMARTCACHE_" in done.stdout
    assert "service_started" not in done.stdout + done.stderr
    assert done.stderr == ""


def test_service_version() -> None:
    done = run("smartcache", "--version")
    assert (done.returncode, done.stdout.strip()) == (0, f"smartcache {__version__}")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SMARTCACHE_METRICS_PORT", "99999"),  # was an OverflowError traceback
        ("SMARTCACHE_LISTEN", "127.0.0.1:5555"),  # was a zmq traceback
        ("SMARTCACHE_TARANTOOL", "127.0.0.1"),
        ("SMARTCACHE_BACKEND_URL", "ftp://core"),
    ],
)
def test_bad_settings_exit_2_with_one_json_line_naming_the_variable(name: str, value: str) -> None:
    done = run("smartcache", **{name: value})
    assert done.returncode == 2
    assert "Traceback" not in done.stdout + done.stderr
    (line,) = done.stdout.splitlines()
    doc = json.loads(line)
    assert (doc["event"], doc["level"]) == ("bad_settings", "error")
    assert f"{name}={value!r}" in doc["error"]


@pytest.mark.parametrize("variable", ["SMARTCACHE_METRICS_PORT", "SMARTCACHE_LISTEN"])
def test_a_taken_port_exits_1_naming_its_variable(variable: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {"SMARTCACHE_METRICS_PORT": "0", "SMARTCACHE_LISTEN": "tcp://127.0.0.1:0"}
        env[variable] = str(port) if variable == "SMARTCACHE_METRICS_PORT" else f"tcp://127.0.0.1:{port}"
        done = run("smartcache", **env)
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    (failed,) = [json.loads(line) for line in done.stdout.splitlines() if '"start_failed"' in line]
    assert f"{variable}=" in failed["error"]
    assert "in use" in failed["error"]


def test_service_logs_its_effective_settings_with_secrets_hidden(storage: Tarantool, tmp_path: Path) -> None:
    with service_process(storage, tmp_path, SMARTCACHE_WORKERS="7", SMARTCACHE_WORKER_TYPO="1") as sp:
        assert sp.stop() == 0
    lines = [json.loads(line) for line in sp.log_path.read_text().splitlines()]
    (settings,) = [line["settings"] for line in lines if line["event"] == "settings"]
    assert settings["tarantool_password"] == "***"
    assert (settings["workers"], settings["listen"], settings["tarantool"]) == (7, sp.endpoint, [storage.address])
    (unknown,) = [line for line in lines if line["event"] == "unknown_settings"]
    assert unknown["variables"] == ["SMARTCACHE_WORKER_TYPO"]
