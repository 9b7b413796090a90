"""Logs: JSON lines for machines, colours for a terminal, and never a local variable's value."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest
import structlog

from smartcache.server import logs


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    yield
    structlog.reset_defaults()


def _fail_with_customer_data() -> None:
    card_number = "4111-1111-1111-1111"  # a local variable holding customer data
    raise ValueError(f"bad input of length {len(card_number)}")


def test_json_traceback_names_the_exception_but_not_local_values() -> None:
    out = io.StringIO()
    logs.configure("info", out, cache=False)
    try:
        _fail_with_customer_data()
    except ValueError:
        structlog.get_logger().exception("handler_failed", request_id=7)
    (line,) = out.getvalue().splitlines()
    doc = json.loads(line)
    assert (doc["event"], doc["level"], doc["request_id"]) == ("handler_failed", "error", 7)
    assert "ValueError" in json.dumps(doc["exception"])
    assert "_fail_with_customer_data" in json.dumps(doc["exception"])
    assert "4111" not in line
    assert "card_number" not in line


def test_a_terminal_gets_coloured_readable_lines() -> None:
    out = Terminal()
    logs.configure("info", out, cache=False)
    structlog.get_logger().info("service_started", workers=100)
    line = out.getvalue()
    assert "\x1b[" in line  # ANSI colour
    assert "service_started" in line
    assert "workers" in line
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)


def test_a_terminal_traceback_has_no_local_values() -> None:
    out = Terminal()
    logs.configure("info", out, cache=False)
    try:
        _fail_with_customer_data()
    except ValueError:
        structlog.get_logger().exception("handler_failed")
    assert "ValueError" in out.getvalue()
    assert "4111" not in out.getvalue()


def test_a_pipe_or_file_gets_json() -> None:
    out = io.StringIO()
    logs.configure("debug", out, cache=False)
    structlog.get_logger().debug("request", type="PING")
    assert json.loads(out.getvalue())["type"] == "PING"


def test_library_logs_come_out_as_our_json_lines_rate_limited() -> None:
    """asynctnt logs through the standard library: same keys as ours, and a repeated line once per 10 s."""
    import logging

    out = io.StringIO()
    logs.configure("info", out, console=False, cache=False)
    try:
        for _ in range(5):
            logging.getLogger("asynctnt").warning("Connect to %s failed", "127.0.0.1:3301")
        logging.getLogger("asynctnt").warning("another message")
    finally:
        structlog.reset_defaults()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["event"] for line in lines] == ["Connect to 127.0.0.1:3301 failed", "another message"]
    assert {(line["level"], line["logger"]) for line in lines} == {("warning", "asynctnt")}
    assert all("timestamp" in line for line in lines)
