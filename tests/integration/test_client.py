"""The client library and smartcache-cli against a running service."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from service.client import AsyncClient
from service.errors import RequestTimeout
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


def test_async_client_times_out_when_nobody_answers() -> None:
    async def main() -> None:
        c = AsyncClient("tcp://127.0.0.1:9", timeout_s=0.2)  # nothing listens there
        try:
            with pytest.raises(RequestTimeout):
                await c.ping()
        finally:
            c.close()

    asyncio.run(main())


def _cli(svc: Running, *args: str) -> tuple[int, dict]:
    p = subprocess.run(
        [sys.executable, "-m", "service.cli", "--endpoint", svc.endpoint, *args],
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
