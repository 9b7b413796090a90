"""smartcache-cli's command line (issue 36, what newcomers tripped on): what cannot be meant is refused with a
precise message (a port offset, a timeout, an empty id), a mistyped name gets "did you mean", and every kind of
outcome has its own exit code, listed in --help."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from smartcache.cli import exits, main, suggest
from smartcache.console import serve
from smartcache.ops import cluster
from smartcache.wire import ports
from smartcache.wire.errors import RequestError, RequestTimeout


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """main(argv) exits with the usage code; the message of the one JSON object it printed."""
    with pytest.raises(SystemExit) as exited:
        main.main(argv)
    assert exited.value.code == exits.USAGE
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"] == "BAD_ARGUMENT"
    return str(doc["message"])


# --- SMARTCACHE_PORT_OFFSET ---


@pytest.mark.parametrize("text", ["abc", "99999", "-1", "56426", "1.5", " 7 7"])
def test_a_port_offset_that_is_not_a_number_or_moves_a_port_past_65535_is_refused(
    text: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(ports.PORT_OFFSET_VARIABLE, text)
    with pytest.raises(ports.PortOffsetError, match=re.escape(f"SMARTCACHE_PORT_OFFSET={text.strip()!r}")):
        ports.port_offset()
    message = _refused(["ping"], capsys)
    assert f"SMARTCACHE_PORT_OFFSET={text.strip()!r}: a whole number 0..56425 is expected" in message


@pytest.mark.parametrize(("text", "offset"), [("", 0), ("  ", 0), ("0", 0), (" 1000 ", 1000), ("56425", 56425)])
def test_a_port_offset_keeps_every_default_port_within_1_to_65535(
    text: str, offset: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ports.PORT_OFFSET_VARIABLE, text)
    assert ports.port_offset() == offset
    assert ports.default_endpoint() == f"tcp://127.0.0.1:{5555 + offset}"
    assert max(int(p.rpartition(":")[2]) for p in ports.default_etcd().split(",")) <= 65535


def test_the_console_refuses_a_bad_port_offset_as_bad_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(ports.PORT_OFFSET_VARIABLE, "99999")
    monkeypatch.setattr(serve, "configure_logs", lambda: None)  # structlog stays as the other tests set it
    assert serve.main(["--listen", "127.0.0.1:0"]) == 2
    assert "SMARTCACHE_PORT_OFFSET='99999'" in capsys.readouterr().err


# --- arguments that cannot be meant ---


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--timeout", "-1", "ping"], "argument --timeout: must be a number of seconds above 0, not -1"),
        (["--timeout", "0", "ping"], "argument --timeout: must be a number of seconds above 0, not 0"),
        (["--timeout", "nan", "ping"], "argument --timeout: must be a number of seconds above 0, not nan"),
        (["--timeout", "soon", "ping"], "argument --timeout: 'soon' is not a number of seconds"),
        (["events", "tail", "--idle", "-2"], "argument --idle: must be a number of seconds above 0, not -2"),
        (["session-create", ""], "argument client_id: the client id is empty: give one, e.g. client-42"),
        (["session-list", "  "], "argument client_id: the client id is blank"),
        (["products-get", "", "1"], "argument client_id: the client id is empty"),
        (["session-delete-client", ""], "argument client_id: the client id is empty"),
        (["device-bind", "dev-1", ""], "argument client_id: the client id is empty"),
        (["device-bind", "", "client-1"], "argument device_id: the device id is empty: give one, e.g. dev-1"),
        (["device-lookup", ""], "argument device_id: the device id is empty"),
    ],
)
def test_what_cannot_be_meant_is_refused_naming_the_argument(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in _refused(argv, capsys)


# --- the operator's credentials (SMARTCACHE_OPERATOR_USER, SMARTCACHE_OPERATOR_PASSWORD or _FILE) ---


def _status_as(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """cluster status answers healthy without asking anyone; the access it was given is recorded."""
    given: list[Any] = []
    monkeypatch.setattr(cluster, "status", lambda access: given.append(access) or {"healthy": True})
    return given


def test_the_operator_password_comes_from_its_file_stripped_as_the_console_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "operator_password").write_text("s3cret\n")
    monkeypatch.setenv("SMARTCACHE_OPERATOR_USER", " admin ")
    monkeypatch.setenv("SMARTCACHE_OPERATOR_PASSWORD", "")  # empty is unset (the secrets override sets it so)
    monkeypatch.setenv("SMARTCACHE_OPERATOR_PASSWORD_FILE", str(tmp_path / "operator_password"))
    given = _status_as(monkeypatch)
    assert main.main(["cluster", "--etcd", "", "status"]) == exits.OK
    assert (given[0].user, given[0].password) == ("admin", "s3cret")


@pytest.mark.parametrize(
    ("password", "file", "said"),
    [
        ("x", "/nonexistent", "SMARTCACHE_OPERATOR_PASSWORD and SMARTCACHE_OPERATOR_PASSWORD_FILE are both set"),
        ("", "/nonexistent", "SMARTCACHE_OPERATOR_PASSWORD_FILE='/nonexistent': cannot read it"),
    ],
)
def test_an_operator_password_set_twice_or_unreadable_is_a_bad_variable(
    password: str, file: str, said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SMARTCACHE_OPERATOR_PASSWORD", password)
    monkeypatch.setenv("SMARTCACHE_OPERATOR_PASSWORD_FILE", file)
    given = _status_as(monkeypatch)
    assert main.main(["cluster", "--etcd", "", "status"]) == exits.USAGE
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"] == "BAD_ARGUMENT"
    assert said in doc["message"]
    assert not given, "nobody was asked"


# --- did you mean ---


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["sesion-get", "x"], "invalid choice: 'sesion-get' (did you mean session-get"),
        (["cluster", "statsu"], "invalid choice: 'statsu' (did you mean status?"),
        (["cluster", "drian", "s1"], "invalid choice: 'drian' (did you mean drain?"),
        (["events", "tial"], "invalid choice: 'tial' (did you mean tail?"),
        (["ping", "--jsn"], "unrecognized arguments: --jsn (did you mean --json?)"),
        (["--jsn", "ping"], "unrecognized arguments: --jsn (did you mean --json?)"),
        (["cluster", "status", "--clustr", "x"], "--clustr (did you mean --cluster, given before status?) x"),
        (["ping", "--timout", "1"], "--timout (did you mean --timeout, given before ping?) 1"),
        (["events", "tail", "--fromat", "json"], "--fromat (did you mean --format or --from?) json"),
    ],
)
def test_a_mistyped_command_or_option_is_answered_with_the_closest_names(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert said in _refused(argv, capsys)


def test_nothing_close_gets_argparse_s_own_list_of_choices(capsys: pytest.CaptureFixture[str]) -> None:
    message = _refused(["xyzzy"], capsys)
    assert "invalid choice: 'xyzzy' (choose from 'ping', 'info'" in message
    assert "did you mean" not in message
    assert "did you mean" not in suggest.unrecognized(main._parser(), main._parser().parse_args(["ping"]), ["--zz"])


# --- exit codes ---


def test_every_kind_of_outcome_has_its_own_exit_code_and_help_lists_them(capsys: pytest.CaptureFixture[str]) -> None:
    codes = {name: value for name, value in vars(exits).items() if name.isupper() and isinstance(value, int)}
    assert sorted(codes.values()) == list(range(len(codes))), codes
    with pytest.raises(SystemExit) as exited:
        main.main(["--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    for name, code in codes.items():
        assert re.search(rf"^  {code}  \S", text, re.MULTILINE), f"--help does not list exit code {code} ({name})"
    for word in ("BAD_ARGUMENT", "TIMEOUT", "QUEUE_FULL", "CONNECTION_LOST", "MISSING_PACKAGE", "NOT_FOUND"):
        assert word in text


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (RequestTimeout("no reply"), exits.TIMEOUT),
        (RequestError("QUEUE_FULL", "full"), exits.UNAVAILABLE),
        (RequestError("STORAGE_UNAVAILABLE", "no leader"), exits.UNAVAILABLE),
    ],
)
def test_a_timeout_and_a_transport_error_exit_apart_from_a_usage_error(
    error: RequestError, code: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(*_: Any) -> None:
        raise error

    monkeypatch.setattr(main, "_run", fail)
    assert main.main(["--endpoint", "tcp://127.0.0.1:1", "ping"]) == code
    assert json.loads(capsys.readouterr().out)["error"] == error.transport_error
    assert code != exits.USAGE


# --- events tail prints JSON lines, on a terminal too ---

EVENT = {"seq": 7, "topic": "app.x", "key": "k", "time_ms": 1, "payload": {"n": 1}}


@pytest.mark.parametrize(
    ("flags", "json_line"),
    [
        ([], True),
        (["--format", "json"], True),
        (["--format", "columns"], False),
        (["--format", "columns", "--json"], True),
    ],
)
def test_events_tail_prints_json_lines_on_a_terminal_unless_asked_for_columns(
    flags: list[str], json_line: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(main.sys.stdout, "isatty", lambda: True)  # a terminal, as the README's example is typed

    def run(_client: Any, _args: Any, emit: Any) -> int:
        emit(dict(EVENT))
        return exits.OK

    monkeypatch.setattr(main.cli_events, "run", run)
    assert main.main(["--endpoint", "tcp://127.0.0.1:1", "events", "tail", *flags]) == exits.OK
    line = capsys.readouterr().out.strip()
    if json_line:
        assert json.loads(line) == EVENT
    else:
        assert line == '7  app.x  k  {"n":1}'
