"""The client library and smartcache-cli against a running service."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from smartcache.client import AsyncClient, Client, RequestError, Status, TransportError
from smartcache.wire.errors import RequestTimeout
from tests.conftest import Running


def test_async_client_many_concurrent_calls(svc: Running) -> None:
    async def main() -> list[str]:
        c = AsyncClient(svc.endpoint)
        try:
            replies = await asyncio.gather(*(c.device_bind(f"ad{i}", f"ac{i}") for i in range(300)))
            looked = await asyncio.gather(*(c.device_lookup(f"ad{i}") for i in range(300)))
            assert [r.body["client_id"] for r in looked] == [f"ac{i}" for i in range(300)]
            return [r.status for r in replies]
        finally:
            c.close()

    assert set(asyncio.run(main())) == {"OK"}


def test_async_client_times_out_when_nobody_answers_and_says_which_request_to_whom() -> None:
    async def main() -> None:
        c = AsyncClient("tcp://127.0.0.1:9", timeout_s=0.2)  # nothing listens there
        try:
            with pytest.raises(RequestTimeout) as e:
                await c.session_get("6f1c2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b")
        finally:
            c.close()
        assert (e.value.type_name, e.value.endpoint) == ("SESSION_GET", "tcp://127.0.0.1:9")
        assert str(e.value) == "TIMEOUT: no reply within 0.2 s (SESSION_GET request 1 to tcp://127.0.0.1:9)"

    asyncio.run(main())


def test_the_blocking_client_times_out_naming_the_request_and_the_endpoint() -> None:
    with Client("tcp://127.0.0.1:9", timeout_s=0.2) as c, pytest.raises(RequestTimeout) as e:
        c.device_lookup("d-1")
    assert str(e.value) == "TIMEOUT: no reply within 0.2 s (DEVICE_LOOKUP request 1 to tcp://127.0.0.1:9)"
    assert e.value.transport_error == TransportError.TIMEOUT


def test_a_transport_error_names_the_request_and_the_endpoint(svc: Running) -> None:
    with Client(svc.endpoint) as c, pytest.raises(RequestError) as e:
        c.device_lookup("x" * (1024 * 1024 + 10))  # over the body limit, within its margin: answered, not cut off
    assert e.value.transport_error == TransportError.BODY_TOO_LARGE
    assert (e.value.type_name, e.value.request_id, e.value.endpoint) == ("DEVICE_LOOKUP", 1, svc.endpoint)
    assert f"(DEVICE_LOOKUP request 1 to {svc.endpoint})" in str(e.value)


def test_statuses_compare_as_enum_members_and_as_names(svc: Running) -> None:
    with Client(svc.endpoint) as c:
        missing = c.device_lookup("client-lib-nobody")
        assert missing.status is Status.NOT_FOUND
        assert missing.status == "NOT_FOUND"
        assert missing.body["status"] == Status.NOT_FOUND.code
        assert not missing.ok
        assert c.ping().status is Status.OK


def _cli(svc: Running, *args: str) -> tuple[int, dict]:
    p = subprocess.run(
        [sys.executable, "-m", "smartcache.cli", "--endpoint", svc.endpoint, *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return p.returncode, json.loads(p.stdout)


def test_cli_prints_json_and_exit_codes(svc: Running) -> None:
    code, created = _cli(svc, "session-create", "cli-client", "--data", '{"step": 2}', "--ttl", "60")
    assert (code, created["status"]) == (0, "OK")
    code, got = _cli(svc, "session-get", created["session_id"])
    assert (code, got["data"], got["client_id"]) == (0, {"step": 2}, "cli-client")
    code, missing = _cli(svc, "device-lookup", "cli-nobody")
    assert (code, missing["status"]) == (1, "NOT_FOUND")
    code, bad = _cli(svc, "session-get", "not-a-uuid")
    assert (code, bad["error"]) == (2, "BAD_ARGUMENT")


def test_the_cli_lays_its_answer_out_for_a_terminal_and_prints_json_with_json(svc: Running) -> None:
    """On a terminal (a pseudo-terminal here) `key: value` lines; --json, or a pipe, one JSON line."""
    import pty

    cmd = [sys.executable, "-m", "smartcache.cli", "--endpoint", svc.endpoint]
    out = bytearray()

    def read(fd: int) -> bytes:
        data = os.read(fd, 1024)
        out.extend(data)
        return data

    status = pty.spawn([*cmd, "ping"], read)
    assert os.waitstatus_to_exitcode(status) == 0
    text = out.decode().replace("\r\n", "\n")
    assert "status: OK" in text
    assert "{" not in text
    piped = subprocess.run([*cmd, "ping"], capture_output=True, text=True, timeout=30, check=False).stdout
    assert json.loads(piped)["status"] == "OK"
    out.clear()
    pty.spawn([*cmd, "--json", "ping"], read)
    assert json.loads(out.decode().strip())["status"] == "OK"
    out.clear()
    pty.spawn([*cmd, "ping", "--json"], read)  # after the command, as people type it
    assert json.loads(out.decode().strip())["status"] == "OK"
