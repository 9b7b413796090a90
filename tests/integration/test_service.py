"""The service over real ZeroMQ sockets and a real Tarantool."""

from __future__ import annotations

import re
import signal
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import msgpack
import pytest
import zmq

from smartcache.devstack.stack import Tarantool
from smartcache.wire import (
    FLAG_DATA_ERROR,
    REGISTRY,
    STATUS,
    TRANSPORT_ERROR,
    Header,
    decode_body,
    decode_header,
    encode_body,
    encode_header,
)
from smartcache.wire.errors import RequestError
from tests.conftest import Running, SlowProbe, running_service, service_process, service_settings
from tests.helpers import eventually, metric


@pytest.fixture(scope="module", params=[0, 2], ids=["slots-on-the-broker-loop", "2-worker-threads"])
def svc(storage: Tarantool, request: pytest.FixtureRequest) -> Iterator[Running]:
    """The core cases run in both worker modes (SMARTCACHE_WORKER_THREADS=0, the default, and 2)."""
    with running_service(service_settings(storage, worker_threads=request.param)) as r:
        yield r


# -- every message type ---------------------------------------------------------


def test_ping_is_answered(svc: Running) -> None:
    reply = svc.client.ping()
    assert reply.ok
    assert reply.body["time_ms"] > 0


def test_session_lifecycle_happy_path_and_statuses(svc: Running) -> None:
    c = svc.client
    created = c.session_create("client-a", data={"step": 1}, version="5.2", ttl_s=60)
    assert created.ok
    assert created.body["rev"] == 1
    sid = created.session_id
    assert sid is not None
    got = c.session_get(sid)
    assert (got.status, got.body["client_id"], got.body["data"], got.body["version"]) == (
        "OK",
        "client-a",
        {"step": 1},
        "5.2",
    )
    assert got.header.session_id == sid.bytes
    assert c.session_touch(sid).ok
    assert c.session_update(sid, {"step": 2}, expected_rev=1).body["rev"] == 2
    assert c.session_update(sid, {"step": 3}, expected_rev=1).status == "CONFLICT"
    assert c.session_create("client-a", session_id=sid).status == "ALREADY_EXISTS"
    listed = c.session_list("client-a").body["sessions"]
    assert [s["handle"] for s in listed] == [created.body["handle"]]  # a handle, never the id (issue 37)
    assert "session_id" not in listed[0]
    c.cache_put("wizard", {"page": 3}, session_id=sid)
    deleted = c.session_delete(sid)
    assert (deleted.status, deleted.body["cache_deleted"]) == ("OK", 1)
    for reply in (c.session_get(sid), c.session_touch(sid), c.session_update(sid, 1), c.session_delete(sid)):
        assert reply.status == "NOT_FOUND"


def test_cache_happy_path_and_statuses(svc: Running) -> None:
    c = svc.client
    assert c.cache_put("rates", {"usd": 90}, data_type=7, ttl_s=60).ok
    got = c.cache_get("rates")
    assert (got.body["data"], got.body["data_type"]) == ({"usd": 90}, 7)
    assert c.cache_delete("rates").ok
    assert c.cache_get("rates").status == "NOT_FOUND"
    assert c.cache_delete("rates").status == "NOT_FOUND"
    assert c.cache_put("k", 1, session_id=uuid.uuid4()).status == "NOT_FOUND"  # no such session


def test_device_happy_path_and_statuses(svc: Running) -> None:
    c, device = svc.client, f"dev-{uuid.uuid4()}"
    assert c.device_lookup(device).status == "NOT_FOUND"
    assert c.device_bind(device, "client-x").ok
    assert c.device_lookup(device).body["client_id"] == "client-x"


def test_bad_fields_and_session_rules_are_bad_request(svc: Running) -> None:
    c = svc.client
    missing = c.call("SESSION_CREATE", {})
    assert (missing.status, missing.body["message"]) == ("BAD_REQUEST", "missing field 'client_id'")
    assert c.call("CACHE_PUT", {"key": 5, "data": 1}).status == "BAD_REQUEST"
    assert c.call("SESSION_GET").status == "BAD_REQUEST"  # session id required
    assert c.call("SESSION_LIST", {"client_id": "x"}, session_id=uuid.uuid4()).status == "BAD_REQUEST"
    assert c.call("SESSION_CREATE", {"client_id": "x", "ttl_s": -1}).status == "BAD_REQUEST"


def test_every_reply_carries_a_registered_status(svc: Running) -> None:
    reply = svc.client.device_lookup("nobody")
    assert reply.body["status"] in REGISTRY.status_names
    assert reply.status in REGISTRY.types["DEVICE_LOOKUP"].statuses


# -- clients ----------------------------------------------------------------------


def test_req_client_works_too(svc: Running) -> None:
    ctx = zmq.Context.instance()
    req = ctx.socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    req.connect(svc.endpoint)
    try:
        h = Header.request(REGISTRY.types["DEVICE_BIND"].id, request_id=77)
        req.send_multipart([encode_header(h), encode_body({"device_id": "req-dev", "client_id": "req-client"})])
        assert req.poll(10_000)
        frames = req.recv_multipart()
        assert len(frames) == 2
        assert decode_header(frames[0]).request_id == 77
        assert decode_body(frames[1])["status"] == STATUS["OK"]
    finally:
        req.close()


def test_many_requests_in_flight_on_one_dealer(svc: Running) -> None:
    c = svc.client
    ids = [c.send("DEVICE_BIND", {"device_id": f"d{i}", "client_id": f"c{i}"}) for i in range(200)]
    replies = [c.wait(rid) for rid in reversed(ids)]
    assert all(r.ok for r in replies)
    assert {r.header.request_id for r in replies} == set(ids)


# -- garbage ----------------------------------------------------------------------


def _raw(svc: Running, frames: list[bytes]) -> tuple[Header, dict]:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(svc.endpoint)
    try:
        sock.send_multipart(frames)
        assert sock.poll(10_000), "no answer"
        reply = sock.recv_multipart()
        return decode_header(reply[0], check_type=False), decode_body(reply[1])
    finally:
        sock.close()


GOOD_HEADER = encode_header(Header.request(REGISTRY.types["CACHE_GET"].id, request_id=5))


@pytest.mark.parametrize(
    ("frames", "error", "request_id"),
    [
        ([GOOD_HEADER], "BAD_FRAMES", 5),
        ([GOOD_HEADER, b"", b"extra"], "BAD_FRAMES", 5),
        ([GOOD_HEADER[:20], b""], "BAD_HEADER", 0),
        ([GOOD_HEADER[:6] + b"\x80" + GOOD_HEADER[7:], b""], "BAD_HEADER", 5),
        ([b"\x02" + GOOD_HEADER[1:], b""], "UNSUPPORTED_VERSION", 5),
        ([GOOD_HEADER[:2] + b"\x99\x99" + GOOD_HEADER[4:], b""], "UNKNOWN_TYPE", 5),
        ([GOOD_HEADER, b"\x81\xa3key\xc1"], "BAD_BODY", 5),
        ([GOOD_HEADER, msgpack.packb([1, 2])], "BAD_BODY", 5),
        ([GOOD_HEADER, msgpack.packb({"key": "k" * 1_050_000})], "BODY_TOO_LARGE", 5),
    ],
    ids=[
        "one-frame",
        "three-frames",
        "short-header",
        "reserved-flag",
        "version",
        "type",
        "bad-msgpack",
        "not-a-map",
        "huge-body",
    ],
)
def test_garbage_gets_its_transport_error_and_service_keeps_serving(
    svc: Running, frames: list[bytes], error: str, request_id: int
) -> None:
    header, body = _raw(svc, frames)
    assert header.transport_error == TRANSPORT_ERROR[error]
    assert header.flags & FLAG_DATA_ERROR
    assert header.request_id == request_id
    assert body["error"] == error
    assert svc.client.device_lookup("still-alive").status == "NOT_FOUND"


def test_absurdly_large_frame_disconnects_its_sender_and_service_keeps_serving(svc: Running) -> None:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(svc.endpoint)
    try:
        sock.send_multipart([GOOD_HEADER, b"\x00" * 8_000_000])
        assert sock.poll(1000) == 0  # never buffered, never answered
    finally:
        sock.close()
    assert svc.client.device_lookup("after-the-flood").status == "NOT_FOUND"


def test_client_raises_transport_errors(svc: Running) -> None:
    with pytest.raises(RequestError) as e:
        svc.client.call("CACHE_PUT", {"key": "k", "data": "x" * 1_050_000})
    assert e.value.transport_error == "BODY_TOO_LARGE"


# -- queue, expiry, eviction, bulkheads -------------------------------------------


def test_queue_full_is_answered_at_once(storage: Tarantool) -> None:
    probe = SlowProbe()
    with running_service(service_settings(storage, workers=1, queue_capacity=2), probe.handlers()) as r:
        c = r.client
        # Lifetimes far beyond the sleep: only the queue's capacity is under test, not a slow machine.
        busy = c.send("DEVICE_LOOKUP", {"device_id": "sleep:1500"}, lifetime_ms=20_000)
        probe.wait_running(1)
        queued = [c.send("CACHE_GET", {"key": f"q{i}"}, lifetime_ms=20_000) for i in range(2)]
        full = c.send("CACHE_GET", {"key": "one-too-many"})
        with pytest.raises(RequestError) as e:
            c.wait(full, timeout_s=1.0)  # well before the slow one ends
        assert e.value.transport_error == "QUEUE_FULL"
        assert [c.wait(q).status for q in queued] == ["NOT_FOUND", "NOT_FOUND"]
        assert c.wait(busy).ok


def test_urgent_message_evicts_the_newest_least_urgent(storage: Tarantool) -> None:
    probe = SlowProbe()
    with running_service(service_settings(storage, workers=1, queue_capacity=2), probe.handlers()) as r:
        c = r.client
        busy = c.send("DEVICE_LOOKUP", {"device_id": "sleep:800"})
        probe.wait_running(1)
        old_low = c.send("CACHE_GET", {"key": "old"})  # priority 2
        new_low = c.send("CACHE_GET", {"key": "new"})
        urgent = c.send("SESSION_TOUCH", session_id=uuid.uuid4())  # priority 1
        with pytest.raises(RequestError) as e:
            c.wait(new_low)
        assert e.value.transport_error == "QUEUE_FULL"
        assert e.value.body["message"] == "evicted by a more urgent message"
        assert c.wait(urgent).status == "NOT_FOUND"
        assert c.wait(old_low).status == "NOT_FOUND"
        assert c.wait(busy).ok


def test_message_expired_in_queue_is_never_executed(storage: Tarantool) -> None:
    probe = SlowProbe()
    with running_service(service_settings(storage, workers=1), probe.handlers()) as r:
        c = r.client
        busy = c.send("DEVICE_LOOKUP", {"device_id": "sleep:600"})
        probe.wait_running(1)
        doomed = c.send("CACHE_PUT", {"key": "never-written", "data": 1}, lifetime_ms=100)
        with pytest.raises(RequestError) as e:
            c.wait(doomed)
        assert e.value.transport_error == "EXPIRED"
        assert c.wait(busy).ok
        assert c.cache_get("never-written").status == "NOT_FOUND"  # the procedure never ran


def test_bulkhead_limits_a_slow_type_and_lets_others_pass(storage: Tarantool) -> None:
    probe = SlowProbe()
    settings = service_settings(storage, workers=4, bulkheads={"DEVICE_LOOKUP": 2})
    with running_service(settings, probe.handlers()) as r:
        c = r.client
        slow = [c.send("DEVICE_LOOKUP", {"device_id": "sleep:400"}) for _ in range(6)]
        fast = c.send("CACHE_GET", {"key": "fast"})
        assert c.wait(fast).status == "NOT_FOUND"
        assert probe.running == 2  # the fast one passed while two slow ones ran
        assert all(c.wait(s).ok for s in slow)
        assert probe.max_running == 2
        assert probe.calls == 6


# -- storage outage ---------------------------------------------------------------


def test_storage_down_gives_storage_unavailable_and_service_recovers(fresh_master: Tarantool) -> None:
    with running_service(service_settings(fresh_master)) as r:
        c = r.client
        assert c.device_bind("outage-dev", "c").ok
        fresh_master.stop()
        with pytest.raises(RequestError) as e:
            c.call("DEVICE_LOOKUP", {"device_id": "outage-dev"}, lifetime_ms=1500)
        assert e.value.transport_error == "STORAGE_UNAVAILABLE"
        fresh_master.start()
        fresh_master.wait_ready()
        eventually(lambda: _lookup_or_none(c, "outage-dev") == "c", timeout_s=15, what="service reconnected")


def _lookup_or_none(c, device: str) -> str | None:
    try:
        return c.device_lookup(device).body.get("client_id")
    except RequestError:
        return None


# -- graceful stop ----------------------------------------------------------------


def test_sigterm_under_load_answers_every_request_once_and_exits_0(storage: Tarantool, tmp_path) -> None:
    with service_process(storage, tmp_path, SMARTCACHE_DRAIN_TIMEOUT_S="5") as sp:
        replies: dict[int, int] = {}
        sent: list[int] = []
        stop_sending = threading.Event()
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(sp.endpoint)
        rid = 0
        sig_at = time.monotonic() + 1.0
        while not stop_sending.is_set():
            for _ in range(50):
                rid += 1
                h = Header.request(REGISTRY.types["DEVICE_BIND"].id, request_id=rid)
                sock.send_multipart([encode_header(h), encode_body({"device_id": f"t{rid}", "client_id": "c"})])
                sent.append(rid)
            while sock.poll(0):
                r = decode_header(sock.recv_multipart()[0], check_type=False)
                replies[r.request_id] = replies.get(r.request_id, 0) + 1
            if time.monotonic() >= sig_at:
                sp.proc.send_signal(signal.SIGTERM)
                stop_sending.set()
        deadline = time.monotonic() + 20
        while len(replies) < len(sent) and time.monotonic() < deadline:
            if sock.poll(200):
                r = decode_header(sock.recv_multipart()[0], check_type=False)
                replies[r.request_id] = replies.get(r.request_id, 0) + 1
        sock.close()
        ctx.term()
        assert sp.proc.wait(30) == 0
        assert len(sent) > 100
        assert set(replies) == set(sent), f"{len(set(sent) - set(replies))} requests got no reply"
        assert set(replies.values()) == {1}


# -- metrics ----------------------------------------------------------------------


def test_metrics_show_every_metric_and_move_under_load(svc: Running) -> None:
    url = svc.metrics_url
    ok_binds = {"outcome": "ok", "type": "device_bind"}
    before = metric(url, "smartcache_messages_total", ok_binds)
    for i in range(50):
        svc.client.device_bind(f"m{i}", "c")
    svc.client.call("CACHE_GET", {"key": 1})
    after = httpx.get(url, timeout=5).text
    for name in (
        "smartcache_messages_total",
        "smartcache_request_duration_seconds_bucket",
        "smartcache_queue_depth",
        "smartcache_queue_capacity",
        "smartcache_queue_rejections_total",
        "smartcache_workers_busy",
        "smartcache_workers ",
        "smartcache_workers_busy_by_type",
        "smartcache_storage_calls_total",
        "smartcache_storage_call_duration_seconds_bucket",
        "smartcache_bad_input_total",
        "smartcache_build_info",
        "smartcache_storage_leader",
        "smartcache_bulkhead_limit",
    ):
        assert name in after, name
    assert metric(url, "smartcache_messages_total", ok_binds) - before == 50
    assert metric(url, "smartcache_storage_calls_total", {"outcome": "ok", "procedure": "device_bind"}) >= 50
    assert metric(url, "smartcache_queue_capacity") == 3000
    assert metric(url, "smartcache_request_duration_seconds_count", {"type": "device_bind"}) >= 50


# -- logs -------------------------------------------------------------------------


def test_log_lines_of_a_request_carry_its_request_id(storage: Tarantool) -> None:
    import io
    import json

    import structlog

    from smartcache.server import logs
    from smartcache.server.handlers.routes import ALL_HANDLERS

    async def broken(req, ctx):
        raise RuntimeError("boom")

    out = io.StringIO()
    logs.configure("info", out, cache=False)
    with running_service(service_settings(storage), {**ALL_HANDLERS, "DEVICE_LOOKUP": broken}) as r:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(r.endpoint)
        try:
            h = Header.request(REGISTRY.types["DEVICE_LOOKUP"].id, request_id=424242)
            sock.send_multipart([encode_header(h), encode_body({"device_id": "x"})])
            assert sock.poll(10_000)
            reply = decode_header(sock.recv_multipart()[0])
        finally:
            sock.close()
    structlog.reset_defaults()
    assert reply.transport_error == TRANSPORT_ERROR["INTERNAL"]
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    failed = [line for line in lines if line["event"] == "handler_failed"]
    assert len(failed) == 1
    assert failed[0]["request_id"] == 424242
    assert failed[0]["level"] == "error"
    assert "RuntimeError" in json.dumps(failed[0]["exception"])


def test_reply_to_a_vanished_client_is_counted_not_lost_silently(storage: Tarantool) -> None:
    probe = SlowProbe()
    with running_service(service_settings(storage, workers=2), probe.handlers()) as r:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(r.endpoint)
        h = Header.request(REGISTRY.types["DEVICE_LOOKUP"].id, request_id=1)
        sock.send_multipart([encode_header(h), encode_body({"device_id": "sleep:300"})])
        probe.wait_running(1)
        sock.close()  # gone before its reply
        eventually(
            lambda: metric(r.metrics_url, "smartcache_dropped_replies_total", {"reason": "client_gone"}) == 1,
            what="drop counted",
        )
        assert r.client.device_lookup("sleep:1").ok  # and it keeps serving


def test_every_label_value_is_lower_case_and_no_created_series(svc: Running) -> None:
    svc.client.device_lookup("case")
    text = httpx.get(svc.metrics_url, timeout=5).text
    values = [v for line in text.splitlines() if not line.startswith("#") for v in re.findall(r'="([^"]*)"', line)]
    upper = {v for v in values if v != v.lower() and v != "+Inf"}  # +Inf: the histogram bucket bound
    assert not upper, sorted(upper)[:10]
    assert "_created" not in text
