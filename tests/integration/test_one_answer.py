"""Exactly one truthful answer per message: no lost answers, no leaked slots, statuses that mean what they say."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import structlog
import zmq

from loadtest.backend import Backend
from smartcache.client import Client, Reply
from smartcache.devstack.stack import Tarantool, free_port
from smartcache.server import logs
from smartcache.server.handlers import Context, Request
from smartcache.server.handlers.routes import ALL_HANDLERS
from smartcache.wire import (
    FLAG_DATA_ERROR,
    FLAG_NO_REPLY,
    NO_SESSION,
    REGISTRY,
    TRANSPORT_ERROR,
    Header,
    decode_body,
    decode_header,
    encode_body,
    encode_header,
)
from smartcache.wire.errors import RequestError
from tests.conftest import Running, SlowProbe, call, connect, running_service, service_settings
from tests.helpers import eventually, metric
from tests.tcpproxy import DELAY_REPLIES, TcpProxy


@pytest.fixture(scope="module")
def backend() -> Iterator[Backend]:
    b = Backend(latency_ms=5).start()
    try:
        yield b
    finally:
        b.stop()


def _dealer(endpoint: str) -> zmq.Socket[bytes]:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def _request(type_name: str, body: dict, rid: int, *, session: bytes = NO_SESSION, lifetime_ms: int = 0) -> list[bytes]:
    h = Header.request(REGISTRY.types[type_name].id, request_id=rid, session_id=session, lifetime_ms=lifetime_ms)
    return [encode_header(h), encode_body(body)]


def _slots_all_free(r: Running) -> bool:
    return metric(r.metrics_url, "smartcache_workers_busy") == 0


# -- lost answers and leaked slots ----------------------------------------------------


@pytest.mark.parametrize("worker_threads", [0, 2], ids=["slots-on-the-broker-loop", "2-worker-threads"])
def test_short_lifetimes_under_mixed_load_answer_every_message_once_and_free_every_slot(
    storage: Tarantool, backend: Backend, worker_threads: int
) -> None:
    """Issue: with PRODUCTS_GET in the mix and 2-5 ms lifetimes, some requests got no answer and
    their worker slots stayed busy for good (a task cancelled before it started)."""
    rng = random.Random(7)
    settings = service_settings(
        storage, backend_url=backend.url, backend_retries=0, prewarm_types=(1, 2), worker_threads=worker_threads
    )
    with running_service(settings) as r:
        sock = _dealer(r.endpoint)
        answers: Counter[int] = Counter()
        total = 20_000
        try:
            for rid in range(1, total + 1):
                kind = rng.randrange(5)
                lifetime = rng.choice((2, 3, 4, 5, 0))
                if kind == 0:
                    frames = _request(
                        "PRODUCTS_GET",
                        {"client_id": f"c{rng.randrange(300)}", "data_type": 1 + rid % 2},
                        rid,
                        lifetime_ms=lifetime,
                    )
                elif kind == 1:
                    frames = _request(
                        "SESSION_CREATE", {"client_id": "c", "data": "x" * 100}, rid, lifetime_ms=lifetime
                    )
                elif kind == 2:
                    frames = _request("CACHE_PUT", {"key": f"k{rid % 50}", "data": rid}, rid, lifetime_ms=lifetime)
                elif kind == 3:
                    frames = _request("CACHE_GET", {"key": f"k{rid % 50}"}, rid, lifetime_ms=lifetime)
                else:
                    frames = _request("DEVICE_LOOKUP", {"device_id": f"d{rid % 10}"}, rid, lifetime_ms=lifetime)
                sock.send_multipart(frames)
                while sock.poll(0):
                    answers[decode_header(sock.recv_multipart()[0], check_type=False).request_id] += 1
            deadline = time.monotonic() + 60
            while len(answers) < total and time.monotonic() < deadline:
                if sock.poll(200):
                    answers[decode_header(sock.recv_multipart()[0], check_type=False).request_id] += 1
        finally:
            sock.close()
        assert len(answers) == total, f"{total - len(answers)} requests never answered"
        assert set(answers.values()) == {1}, "some request answered twice"
        eventually(lambda: _slots_all_free(r), what="every worker slot free again")
        assert metric(r.metrics_url, "smartcache_watchdog_reclaimed_total") == 0


def test_a_products_get_whose_lifetime_ends_after_storage_granted_its_lease_leaves_no_lease_behind(
    fresh_master: Tarantool, backend: Backend
) -> None:
    """Issue 35: a PRODUCTS_GET answered OUTCOME_UNKNOWN by the deadline sweep after prewarm_acquire had
    taken the lease in storage left the lease held by nobody until it ran out; every asker of that key
    meanwhile held a worker slot for its whole lifetime, waiting for it, and got TIMEOUT."""
    body = {"client_id": "client-lost-lease", "data_type": 1}
    with TcpProxy(fresh_master.port) as proxy:
        settings = service_settings(
            fresh_master,
            tarantool=(proxy.address,),
            backend_url=backend.url,
            backend_retries=0,
            backend_timeout_s=2.0,  # a lease of 4 s: longer than the second asker's lifetime
            prewarm_types=(1,),
        )
        with running_service(settings) as r:
            proxy.set_mode(DELAY_REPLIES, delay_s=0.5)  # storage takes the lease; its answer comes too late
            with pytest.raises(RequestError) as e:
                r.client.call("PRODUCTS_GET", body, lifetime_ms=100, timeout_s=10)
            assert e.value.transport_error == "OUTCOME_UNKNOWN"
            proxy.set_mode("pass")
            again = r.client.call("PRODUCTS_GET", body, lifetime_ms=3000, timeout_s=10)
            assert (again.status, again.body.get("source")) == ("OK", "fetched")
            eventually(lambda: _slots_all_free(r), what="every worker slot free again")
            assert metric(r.metrics_url, "smartcache_watchdog_reclaimed_total") == 0


class Broken:
    """Handlers that fail at each step of a message's life, one per device id."""

    async def lookup(self, req: Request, ctx: Context) -> dict:
        step = req.body["device_id"]
        if step == "raise-before-storage":
            raise RuntimeError("secret-customer-data")
        if step == "raise-after-storage":
            await ctx.storage.call("device_lookup", ["x"], job=req.job)
            raise KeyError("secret-customer-data")
        if step == "no-status":
            return {"data": 1}
        if step == "unknown-status":
            return {"status": "NO_SUCH_STATUS"}
        if step == "storage-only-status":
            return {"status": "NOT_LEADER"}
        if step == "unencodable":
            return {"status": "OK", "data": object()}
        if step == "hang-before-storage":
            await asyncio.Event().wait()
        if step == "hang-in-storage":
            return await ctx.storage.call("debug_sleep", [2000], job=req.job)
        return await ctx.storage.call("device_lookup", [step], job=req.job)


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        ("raise-before-storage", "INTERNAL"),
        ("raise-after-storage", "INTERNAL"),
        ("no-status", "INTERNAL"),
        ("unknown-status", "INTERNAL"),
        ("storage-only-status", "INTERNAL"),
        ("unencodable", "INTERNAL"),
        ("hang-before-storage", "EXPIRED"),
        ("hang-in-storage", "OUTCOME_UNKNOWN"),
        ("fine", "NONE"),
    ],
)
def test_a_failure_at_any_step_still_gets_exactly_one_answer_and_frees_the_slot(
    storage: Tarantool, step: str, expected: str
) -> None:
    with running_service(service_settings(storage, workers=2), {**ALL_HANDLERS, "DEVICE_LOOKUP": Broken().lookup}) as r:
        sock = _dealer(r.endpoint)
        got = []
        try:
            # Two messages fill both slots; once both are answered, a third must find a free slot.
            for batch in ((1, 2), (3,)):
                for rid in batch:
                    sock.send_multipart(_request("DEVICE_LOOKUP", {"device_id": step}, rid, lifetime_ms=300))
                deadline = time.monotonic() + 10
                while len(got) < batch[-1] and time.monotonic() < deadline:
                    if sock.poll(100):
                        got.append(sock.recv_multipart())
            assert not sock.poll(500), "a second answer arrived"
        finally:
            sock.close()
        headers = [decode_header(f[0], check_type=False) for f in got]
        assert sorted(h.request_id for h in headers) == [1, 2, 3]
        for h, frames in zip(headers, got, strict=True):
            assert REGISTRY.transport_error_names[h.transport_error] == expected
            if expected != "NONE":
                body = decode_body(frames[1])
                assert h.flags & FLAG_DATA_ERROR
                assert "secret-customer-data" not in body["message"]
        eventually(lambda: _slots_all_free(r), what="every worker slot free again")
        assert metric(r.metrics_url, "smartcache_watchdog_reclaimed_total") == 0


# -- statuses that mean what they say --------------------------------------------------


def test_a_write_whose_answer_is_late_is_outcome_unknown_and_a_keyed_retry_applies_it_once(
    fresh_master: Tarantool,
) -> None:
    """The write happens in storage but its answer arrives after the lifetime: OUTCOME_UNKNOWN, not
    STORAGE_UNAVAILABLE; repeating it with the same idempotency key changes nothing more."""
    with TcpProxy(fresh_master.port) as proxy:
        settings = service_settings(fresh_master, tarantool=(proxy.address,))
        with running_service(settings) as r:
            c = r.client
            sid = c.session_create("client-late", data={"n": 0}).session_id
            proxy.set_mode(DELAY_REPLIES, delay_s=1.0)
            key = uuid.uuid4().hex
            with pytest.raises(RequestError) as e:
                c.call(
                    "SESSION_UPDATE",
                    {"data": {"n": 1}, "idempotency_key": key},
                    session_id=sid,
                    lifetime_ms=300,
                    timeout_s=5,
                )
            assert e.value.transport_error == "OUTCOME_UNKNOWN"
            proxy.set_mode("pass")
            with connect(fresh_master) as m:
                stored = r.service.sessions.stored(sid.bytes)  # storage knows the session by its stored id
                eventually(lambda: call(m, "session_get", stored)["rev"] == 2, what="the late write was applied")
            again = eventually(lambda: _ok_or_none(lambda: c.session_update(sid, {"n": 1}, idempotency_key=key)))
            assert again.body["rev"] == 2
            assert again.body["replayed"] is True
            assert c.session_get(sid).body["rev"] == 2  # applied once


def _ok_or_none(fn) -> Reply | None:
    try:
        return fn()
    except RequestError:
        return None


def test_client_retries_send_one_key_so_a_write_is_applied_once(fresh_master: Tarantool) -> None:
    with TcpProxy(fresh_master.port) as proxy:
        settings = service_settings(fresh_master, tarantool=(proxy.address,))
        with running_service(settings) as r:
            sid = r.client.session_create("client-retry", data=0).session_id
            proxy.set_mode(DELAY_REPLIES, delay_s=0.4)
            # The first attempt is answered OUTCOME_UNKNOWN (storage applied it, the answer came late);
            # replies flow normally again for the retries.
            threading.Timer(0.1, proxy.set_mode, ("pass",)).start()
            with Client(r.endpoint, timeout_s=5, retries=5) as c:
                reply = c.call("SESSION_UPDATE", {"data": 1}, session_id=sid, lifetime_ms=200)
            assert reply.ok
            assert reply.body["replayed"] is True  # a retry got the stored answer
            assert reply.body["rev"] == 2
            assert r.client.session_get(sid).body["rev"] == 2


def test_a_stalled_storage_executes_nothing_the_service_gave_up_on(fresh_master: Tarantool) -> None:
    """Deadlines reach storage: requests answered at their deadline during a stall are not executed after it."""
    with running_service(service_settings(fresh_master)) as r:
        sids = [uuid.uuid4() for _ in range(20)]
        fresh_master.send_signal(signal.SIGSTOP)
        try:
            rids = [
                r.client.send("SESSION_CREATE", {"client_id": "c-stall"}, session_id=sid, lifetime_ms=300)
                for sid in sids
            ]
            outcomes = set()
            for rid in rids:
                with pytest.raises(RequestError) as e:
                    r.client.wait(rid, timeout_s=5)
                outcomes.add(e.value.transport_error)
            assert outcomes <= {"OUTCOME_UNKNOWN", "STORAGE_UNAVAILABLE"}
            # Once the pings notice the stall, requests are refused at once (not sent: not executed).
            eventually(
                lambda: (
                    _error_of(lambda: r.client.call("DEVICE_LOOKUP", {"device_id": "d"}, lifetime_ms=5000, timeout_s=1))
                    == "STORAGE_UNAVAILABLE"
                ),
                what="stall detected",
            )
        finally:
            fresh_master.send_signal(signal.SIGCONT)
        eventually(lambda: _ok_or_none(lambda: r.client.device_lookup("d")), what="storage back")
        for sid in sids:
            assert r.client.session_get(sid).status == "NOT_FOUND"
        assert metric(r.metrics_url, "smartcache_storage_state_changes_total", {"state": "stalled"}) >= 1


def _error_of(fn) -> str:
    try:
        fn()
    except RequestError as e:
        return e.transport_error
    return "NONE"


def test_storage_down_answers_storage_unavailable_at_once(tmp_path) -> None:
    """Not after the whole lifetime: the client's 2 s timeout is far below the 10 s lifetime."""
    nowhere = f"127.0.0.1:{free_port()}"
    settings = service_settings(Tarantool.create("none", tmp_path), tarantool=(nowhere,))
    from smartcache.server.app import Service

    service = Service(settings)
    service.start()
    try:
        with Client(service.broker.endpoint, timeout_s=2) as c:
            for _ in range(3):
                with pytest.raises(RequestError) as e:
                    c.call("DEVICE_LOOKUP", {"device_id": "d"}, lifetime_ms=10_000)
                assert e.value.transport_error == "STORAGE_UNAVAILABLE"
    finally:
        service.stop()


def test_sigterm_stops_the_service_even_when_storage_was_never_reachable(tmp_path) -> None:
    env = {
        **os.environ,
        "SMARTCACHE_LISTEN": f"tcp://127.0.0.1:{free_port()}",
        "SMARTCACHE_TARANTOOL": f"127.0.0.1:{free_port()}",
        "SMARTCACHE_METRICS_PORT": "0",
        "SMARTCACHE_DRAIN_TIMEOUT_S": "2",
    }
    log_path = tmp_path / "service.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "smartcache.server"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        eventually(lambda: b"service_started" in log_path.read_bytes(), timeout_s=20, what="service started")
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 0  # drain timeout + grace, whatever storage does
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_internal_errors_show_an_error_id_not_exception_text_and_log_no_request_data(storage: Tarantool) -> None:
    out = io.StringIO()
    logs.configure("info", out, cache=False)
    try:
        with (
            running_service(service_settings(storage), {**ALL_HANDLERS, "DEVICE_LOOKUP": Broken().lookup}) as r,
            pytest.raises(RequestError) as e,
        ):
            r.client.call("DEVICE_LOOKUP", {"device_id": "raise-before-storage", "note": "secret-body-field"})
    finally:
        structlog.reset_defaults()
    assert e.value.transport_error == "INTERNAL"
    message = e.value.body["message"]
    assert "secret" not in message
    assert "RuntimeError" not in message
    error_id = message.rsplit(" ", 1)[-1]
    failed = [json.loads(line) for line in out.getvalue().splitlines() if "handler_failed" in line]
    assert [line["error_id"] for line in failed] == [error_id]
    assert "secret-body-field" not in out.getvalue()


# -- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize("type_name", ["CACHE_PUT", "SESSION_CREATE", "SESSION_UPDATE"])
def test_a_msgpack_timestamp_inside_data_is_bad_body(svc: Running, type_name: str) -> None:
    sid = svc.client.session_create("client-ts").session_id if type_name == "SESSION_UPDATE" else None
    body = {"key": "k", "client_id": "c", "data": {"when": msgpack.Timestamp(1_700_000_000, 0)}}
    h = Header.request(REGISTRY.types[type_name].id, request_id=77, session_id=sid.bytes if sid else NO_SESSION)
    sock = _dealer(svc.endpoint)
    try:
        sock.send_multipart([encode_header(h), msgpack.packb(body)])
        assert sock.poll(5000)
        reply = decode_header(sock.recv_multipart()[0], check_type=False)
    finally:
        sock.close()
    assert reply.transport_error == TRANSPORT_ERROR["BAD_BODY"]


def test_ping_validates_its_body(svc: Running) -> None:
    sock = _dealer(svc.endpoint)
    try:
        h = Header.request(REGISTRY.types["PING"].id, request_id=5)
        sock.send_multipart([encode_header(h), b"\x93\x01\x02\x03"])  # an array, not a map
        assert sock.poll(5000)
        reply = decode_header(sock.recv_multipart()[0], check_type=False)
    finally:
        sock.close()
    assert reply.transport_error == TRANSPORT_ERROR["BAD_BODY"]


def _no_reply_header(**fields: int) -> bytes:
    h = Header.request(REGISTRY.types["CACHE_GET"].id, request_id=900, flags=FLAG_NO_REPLY)
    return encode_header(h._replace(**fields))


@pytest.mark.parametrize(
    ("name", "frames"),
    [
        ("BAD_FRAMES", [_no_reply_header()]),
        ("BAD_FRAMES", [_no_reply_header(), b"", b""]),
        (
            "BAD_HEADER",
            [encode_header(Header.request(21, request_id=900, flags=FLAG_NO_REPLY))[:6] + b"\x06" + bytes(29), b""],
        ),
        ("UNSUPPORTED_VERSION", [_no_reply_header(version=9), b""]),
        ("UNKNOWN_SYSTEM", [_no_reply_header(system=9), b""]),
        ("UNKNOWN_TYPE", [_no_reply_header(type=999), b""]),
        ("BODY_TOO_LARGE", [_no_reply_header(), b"\x80" * (REGISTRY.max_body_bytes + 1)]),
        ("BAD_BODY", [_no_reply_header(), b"\xc1"]),
        ("APP_START", [encode_header(Header.request(REGISTRY.types["APP_START"].id, request_id=900)), b"\xc1"]),
    ],
)
def test_no_reply_is_honoured_for_every_error_when_the_header_is_readable(svc: Running, name: str, frames) -> None:
    sock = _dealer(svc.endpoint)
    try:
        sock.send_multipart(frames)
        sock.send_multipart(_request("PING", {}, 901))
        assert sock.poll(5000)
        first = decode_header(sock.recv_multipart()[0], check_type=False)
    finally:
        sock.close()
    assert first.request_id == 901, f"{name} with NO_REPLY was answered"


@pytest.mark.parametrize(
    "body",
    [{"client_id": "c", "ttl_s": 0}, {"ttl_s": 60}, {"client_id": "c", "ttl_s": 2_592_001}],
    ids=["ttl 0", "no client_id", "ttl over the maximum"],
)
def test_a_refused_session_create_carries_the_zero_session_id(svc: Running, body: dict) -> None:
    reply = svc.client.call("SESSION_CREATE", body)
    assert reply.status == "BAD_REQUEST"
    assert reply.header.session_id == NO_SESSION


def test_session_create_already_existing_carries_the_zero_session_id(svc: Running) -> None:
    sid = uuid.uuid4()
    assert svc.client.session_create("c", session_id=sid).session_id == sid
    again = svc.client.session_create("c", session_id=sid)
    assert again.status == "ALREADY_EXISTS"
    assert again.header.session_id == NO_SESSION


# -- spec clarifications -------------------------------------------------------------------


def test_a_violated_session_rule_is_bad_request(svc: Running) -> None:
    assert svc.client.call("SESSION_GET").status == "BAD_REQUEST"  # required, got zero
    assert svc.client.call("DEVICE_LOOKUP", {"device_id": "d"}, session_id=uuid.uuid4()).status == "BAD_REQUEST"


@pytest.mark.parametrize("rev", [0, -1])
def test_expected_rev_below_one_is_bad_request(svc: Running, rev: int) -> None:
    sid = svc.client.session_create("client-rev").session_id
    assert svc.client.session_update(sid, 1, expected_rev=rev).status == "BAD_REQUEST"


def test_conflict_carries_the_current_revision(svc: Running) -> None:
    sid = svc.client.session_create("client-rev").session_id
    assert svc.client.session_update(sid, 1).body["rev"] == 2
    conflict = svc.client.session_update(sid, 2, expected_rev=1)
    assert conflict.status == "CONFLICT"
    assert conflict.body["rev"] == 2


def test_unsupported_version_is_answered_with_the_version_the_service_speaks(svc: Running) -> None:
    sock = _dealer(svc.endpoint)
    try:
        h = Header.request(REGISTRY.types["PING"].id, request_id=3)._replace(version=7)
        sock.send_multipart([encode_header(h), b""])
        assert sock.poll(5000)
        reply = decode_header(sock.recv_multipart()[0], check_type=False)
    finally:
        sock.close()
    assert reply.transport_error == TRANSPORT_ERROR["UNSUPPORTED_VERSION"]
    assert reply.version == REGISTRY.version
    assert reply.request_id == 3


def test_a_lifetime_of_1_ms_always_expires(svc: Running) -> None:
    for _ in range(5):
        with pytest.raises(RequestError) as e:
            svc.client.call("CACHE_GET", {"key": "k"}, lifetime_ms=1)
        assert e.value.transport_error == "EXPIRED"


def test_products_timeout_is_an_error_object_with_data_error(storage: Tarantool, svc: Running) -> None:
    """TIMEOUT, like BACKEND_ERROR and BACKEND_BAD_REPLY, carries DATA_ERROR and an error object."""
    client_id = f"client-busy-{uuid.uuid4().hex[:8]}"
    with connect(storage) as m:  # someone else holds the lease for a minute
        assert call(m, "prewarm_acquire", client_id, 1, "another-instance", 60_000, 1000)["status"] == "ACQUIRED"
    reply = svc.client.call("PRODUCTS_GET", {"client_id": client_id, "data_type": 1}, lifetime_ms=300)
    assert reply.status == "TIMEOUT"
    assert reply.data_error
    assert reply.body["error"] == "TIMEOUT"
    assert "TIMEOUT" in REGISTRY.data_error_statuses


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root (CI runs as root)")
def test_a_full_disk_refuses_writes_as_storage_unavailable_reads_go_on_and_logs_once(tmp_path: Path) -> None:
    out = io.StringIO()
    with _tmpfs(tmp_path / "disk", "16m") as disk:
        master = Tarantool.create("full", tmp_path, extra_env={"SC_DATA_DIR": str(disk / "data")})
        master.start()
        try:
            master.wait_ready()
            logs.configure("info", out, cache=False)
            with running_service(service_settings(master)) as r:
                c = r.client
                sid = c.session_create("client-disk", data={"kept": True}).session_id
                (disk / "filler").write_bytes(b"")
                subprocess.run(
                    ["dd", "if=/dev/zero", f"of={disk / 'filler'}", "bs=64k"], capture_output=True, check=False
                )
                # Tarantool preallocates its xlog; writes fail once that room is used up.
                errors: Counter[str] = Counter()
                for i in range(2000):
                    error = _error_of(lambda i=i: c.cache_put(f"k{i}", os.urandom(8000).hex() + "secret-data"))
                    errors[error] += 1
                    if errors["STORAGE_UNAVAILABLE"] >= 50:
                        break
                assert errors["STORAGE_UNAVAILABLE"] >= 50
                assert set(errors) <= {"NONE", "STORAGE_UNAVAILABLE"}, errors
                got = c.session_get(sid)
                assert got.ok
                assert got.body["data"] == {"kept": True}
                assert metric(r.metrics_url, "smartcache_storage_write_failures_total", {"reason": "disk"}) >= 50
                (disk / "filler").unlink()
                eventually(lambda: _ok_or_none(lambda: c.cache_put("after", 1)), what="writes work again")
        finally:
            structlog.reset_defaults()
            master.stop()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    events = Counter(line["event"] for line in lines)
    assert events["storage_writes_failing"] == 1  # once per streak, not once per request
    assert events["storage_writes_recovered"] == 1
    assert "secret-data" not in out.getvalue()
    assert len(out.getvalue()) < 20_000


def test_the_watchdog_answers_and_takes_back_a_slot_whose_worker_never_answers(storage: Tarantool) -> None:
    """A worker thread whose loop is blocked cannot answer: the broker does, once, and the late
    answer neither reaches the client nor frees the slot twice."""

    running = {"now": 0, "max": 0}
    blocked_done = threading.Event()

    async def blocking(req: Request, ctx: Context) -> dict:
        if req.body["device_id"] == "block":
            try:
                time.sleep(2.5)  # blocks this worker thread's whole event loop
                return await ctx.storage.call("debug_sleep", [100], job=req.job)
            finally:
                blocked_done.set()
        running["now"] += 1
        running["max"] = max(running["max"], running["now"])
        try:
            return await ctx.storage.call("debug_sleep", [100], job=req.job)
        finally:
            running["now"] -= 1

    settings = service_settings(storage, workers=1, worker_threads=1)
    with running_service(settings, {**ALL_HANDLERS, "DEVICE_LOOKUP": blocking}) as r:
        with pytest.raises(RequestError) as e:
            r.client.call("DEVICE_LOOKUP", {"device_id": "block"}, lifetime_ms=300, timeout_s=5)
        assert e.value.transport_error == "OUTCOME_UNKNOWN"
        assert metric(r.metrics_url, "smartcache_watchdog_reclaimed_total") == 1
        assert blocked_done.wait(10)
        # The one slot works again, and is not counted twice: two at once still run one at a time.
        rids = [r.client.send("DEVICE_LOOKUP", {"device_id": "after"}, lifetime_ms=5000) for _ in range(2)]
        assert all(r.client.wait(rid).ok for rid in rids)
        assert running["max"] == 1
        eventually(lambda: _slots_all_free(r), what="slot free")
        assert metric(r.metrics_url, "smartcache_workers_busy") == 0


def test_a_message_still_running_at_the_drain_deadline_is_answered_outcome_unknown(storage: Tarantool) -> None:
    probe = SlowProbe()
    with running_service(service_settings(storage, drain_timeout_s=0.3), probe.handlers()) as r:
        slow = r.client.send("DEVICE_LOOKUP", {"device_id": "sleep:3000"}, lifetime_ms=10_000)
        probe.wait_running(1)
        r.service.stop()
        with pytest.raises(RequestError) as e:
            r.client.wait(slow, timeout_s=5)
    assert e.value.transport_error == "OUTCOME_UNKNOWN"
