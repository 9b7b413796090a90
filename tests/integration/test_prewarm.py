"""Prewarm across two service instances on one Tarantool, with the simulated backend."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator

import pytest
import zmq

from loadtest.backend import Backend
from smartcache.devstack.stack import Tarantool
from tests.conftest import Running, call, connect, running_service, service_settings
from tests.helpers import eventually, metric

TYPES = (1, 2)


@pytest.fixture
def backend() -> Iterator[Backend]:
    b = Backend(latency_ms=50).start()
    try:
        yield b
    finally:
        b.stop()


@contextlib.contextmanager
def two_instances(storage: Tarantool, backend: Backend, **overrides: object) -> Iterator[tuple[Running, Running]]:
    common = {
        "backend_url": backend.url,
        "prewarm_types": TYPES,
        "backend_timeout_s": 2.0,
        "backend_retries": 0,
        **overrides,
    }
    with (
        running_service(service_settings(storage, instance_id="svc-a", **common)) as a,
        running_service(service_settings(storage, instance_id="svc-b", **common)) as b,
    ):
        yield a, b


def _metric(r: Running, name: str, **labels: str) -> float:
    return metric(r.metrics_url, name, labels)


def test_app_start_from_unknown_device_calls_nothing_and_answers_nothing(storage: Tarantool, backend: Backend) -> None:
    with two_instances(storage, backend) as (a, _):
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(a.endpoint)
        try:
            from smartcache.wire import REGISTRY, Header, encode_body, encode_header

            h = Header.request(REGISTRY.types["APP_START"].id, request_id=1)
            sock.send_multipart([encode_header(h), encode_body({"device_id": "never-seen"})])
            eventually(lambda: _metric(a, "smartcache_messages_total", outcome="not_found", type="app_start") == 1)
            assert sock.poll(200) == 0  # processed, and nothing came back
        finally:
            sock.close()
        assert backend.state.stats()["calls"] == 0


def test_app_start_on_both_instances_calls_backend_once_per_type(storage: Tarantool, backend: Backend) -> None:
    with two_instances(storage, backend) as (a, b):
        assert a.client.device_bind("dev-both", "client-both").ok
        a.client.app_start("dev-both")
        b.client.app_start("dev-both")

        def settled() -> bool:
            outcomes = ("completed", "skipped_busy", "skipped_fresh")
            total = sum(_metric(r, "smartcache_prewarm_total", outcome=o) for r in (a, b) for o in outcomes)
            return total == 2 * len(TYPES)

        eventually(settled)
        by_key = backend.state.stats()["by_key"]
        assert by_key == {f"client-both/{t}": 1 for t in TYPES}
        got = b.client.products_get("client-both", 1)
        assert (got.status, got.body["source"]) == ("OK", "cache")
        assert got.body["data"]["client_id"] == "client-both"
        assert backend.state.stats()["calls"] == len(TYPES)  # answered from the cache


def test_a_prewarm_record_notes_the_session_and_front_version_that_asked(storage: Tarantool, backend: Backend) -> None:
    sid = uuid.uuid4()
    with two_instances(storage, backend) as (a, _):
        assert a.client.device_bind("dev-noted", "client-noted").ok
        a.client.app_start("dev-noted", session_id=sid, version="7.1.0")
        with connect(storage) as conn:
            record = eventually(
                lambda: (
                    (r := call(conn, "prewarm_wait", "client-noted", 1, 1000))["status"] == "OK"
                    and r.get("updated_at_ms", 0) > 0
                    and r
                )
            )
    # the session's stored id: storage never sees the raw one (issue 37)
    assert (record["session_id"], record["version"]) == (a.service.sessions.stored(sid.bytes), "7.1.0")
    assert record["session_id"] != str(sid)


def test_products_get_during_update_answers_as_soon_as_the_fetch_completes(
    storage: Tarantool, backend: Backend
) -> None:
    backend.state.config["latency_ms"] = 800
    with two_instances(storage, backend) as (a, b):
        a.client.device_bind("dev-wait", "client-wait")
        a.client.app_start("dev-wait")
        eventually(lambda: backend.state.stats()["calls"] == len(TYPES))  # fetches are in the backend now
        started = time.monotonic()
        got = b.client.products_get("client-wait", 2)
        waited = time.monotonic() - started
        assert (got.status, got.body["source"]) == ("OK", "waited")
        assert got.body["data"]["data_type"] == 2
        # Woken by the completion (0.8 s fetch), well before the lease would run out (4 s here).
        assert waited < 3.0
        assert backend.state.stats()["calls"] == len(TYPES)


def test_crashed_fetch_is_taken_over_after_its_lease(storage: Tarantool, backend: Backend) -> None:
    with connect(storage) as conn:
        acquired = call(conn, "prewarm_acquire", "client-crash", 1, "crashed-instance", 700, 60_000)
    assert acquired["status"] == "ACQUIRED"
    with two_instances(storage, backend) as (a, _):
        got = a.client.products_get("client-crash", 1)
        assert (got.status, got.body["source"]) == ("OK", "fetched")
        assert backend.state.stats()["by_key"] == {"client-crash/1": 1}


@pytest.mark.parametrize(
    ("setting", "status"), [("error_rate", "BACKEND_ERROR"), ("bad_reply_rate", "BACKEND_BAD_REPLY")]
)
def test_backend_failure_is_an_error_status_with_data_error(
    storage: Tarantool, backend: Backend, setting: str, status: str
) -> None:
    backend.state.config[setting] = 1.0
    with two_instances(storage, backend) as (a, _):
        got = a.client.products_get(f"client-{setting}", 1)
        assert got.status == status
        assert got.data_error
        assert got.body["error"] == status
        assert got.body["message"]
        backend.state.config[setting] = 0.0
        again = a.client.products_get(f"client-{setting}", 1)  # the lease was released: the next asker fetches
        assert (again.status, again.body["source"]) == ("OK", "fetched")


def test_internal_type_is_refused_from_clients(svc: Running) -> None:
    from smartcache.wire.errors import RequestError

    with pytest.raises(RequestError) as e:
        svc.client.call("PREWARM_FETCH", {"client_id": "x", "data_type": 1})
    assert e.value.transport_error == "UNKNOWN_TYPE"
