"""Health for orchestrators and process metrics, on the metrics port: real service, real HTTP."""

from __future__ import annotations

import httpx

from smartcache.devstack.stack import Tarantool
from tests.conftest import Running, running_service, service_settings
from tests.helpers import eventually


def _get(r: Running, path: str) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{r.service.metrics_port}{path}", timeout=5)


def test_live_and_ready_answer_200_with_their_checks(storage: Tarantool) -> None:
    with running_service(service_settings(storage)) as r:
        live, ready = _get(r, "/health/live"), _get(r, "/health/ready")
    assert (live.status_code, live.json()) == (200, {"status": "pass", "checks": {"broker": True}, "failing": []})
    assert ready.status_code == 200
    assert ready.json()["checks"] == {
        "broker": True,
        "accepting": True,
        "workers": True,
        "storage": True,
        "session_key": True,
    }
    assert ready.headers["content-type"] == "application/json"


def test_ready_turns_503_naming_storage_when_tarantool_goes_away(fresh_master: Tarantool) -> None:
    with running_service(service_settings(fresh_master)) as r:
        assert _get(r, "/health/ready").status_code == 200
        fresh_master.stop()
        ready = eventually(
            lambda: (got := _get(r, "/health/ready")).status_code == 503 and got,
            timeout_s=20,
            what="not ready with Tarantool stopped",
        )
        assert ready.json()["failing"] == ["storage"]
        assert _get(r, "/health/live").status_code == 200  # alive: restarting would not bring Tarantool back


def test_metrics_have_process_series_and_no_created_series(storage: Tarantool) -> None:
    with running_service(service_settings(storage)) as r:
        assert r.client.ping().ok
        text = _get(r, "/metrics").text
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")}
    assert {"process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"} <= names
    assert not [n for n in names if n.endswith("_created")]
    assert "smartcache_messages_total" in names


def test_the_http_port_is_freed_when_the_service_stops(storage: Tarantool) -> None:
    with running_service(service_settings(storage)) as r:
        port = r.service.metrics_port
    try:
        httpx.get(f"http://127.0.0.1:{port}/health/live", timeout=2)
    except httpx.ConnectError:
        return
    raise AssertionError("metrics port still answers after stop")
