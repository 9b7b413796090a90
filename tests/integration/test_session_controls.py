"""The session controls banks are audited on (issue 37), through the real service on a real Tarantool: a binding
that is checked, a rotation whose old id reads on for a grace window (and only for it), an absolute lifetime
that no read and no rotation extends."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from smartcache.client import Client, Event, Status, Subscription
from smartcache.devstack.stack import Tarantool
from tests.conftest import Running, running_service, service_settings
from tests.helpers import eventually


@pytest.fixture(scope="module")
def svc(storage: Tarantool) -> Iterator[Running]:
    with running_service(service_settings(storage, instance_id="controls")) as r:
        yield r


def _client() -> str:
    return f"ctl-{uuid.uuid4().hex[:10]}"


def _subscribe(r: Running, topics: list[str]) -> Subscription:
    assert r.service.events is not None
    eventually(lambda: r.service.events is not None and bool(r.service.events.cursors), what="the reader started")
    return r.client.subscribe(topics, publishers=r.service.events.endpoint)


def _events(sub: Subscription, keys: set[str], n: int, timeout_s: float = 10.0) -> list[Event]:
    """The next n events keyed by one of keys (others' skipped)."""
    out: list[Event] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n:
        e = sub.poll(max(0.0, deadline - time.monotonic()))
        assert e is not None, f"{len(out)} of {n} events within {timeout_s} s: {out}"
        if e.key in keys:
            out.append(e)
    return out


# -- binding ---------------------------------------------------------------------------------------------


def test_a_bound_session_answers_only_its_binding_and_each_mismatch_is_refused_with_an_event(svc: Running) -> None:
    c, client = svc.client, _client()
    with _subscribe(svc, ["session.binding_mismatch"]) as sub:
        time.sleep(0.3)  # the subscription reaches the publisher
        created = c.session_create(client, data={"n": 1}, binding="device-A")
        sid, handle = created.session_id, created.body["handle"]
        assert sid is not None
        assert c.session_get(sid, binding="device-A").body["data"] == {"n": 1}
        refused = [
            c.session_get(sid),  # no binding
            c.session_get(sid, binding="device-B"),
            c.session_touch(sid, binding="device-B"),
            c.session_update(sid, {"n": 2}, binding="device-B"),
            c.cache_put("k", 1, session_id=sid),
            c.cache_get("k", session_id=sid, binding="device-B"),
            c.session_rotate(sid, binding="device-B"),
            c.session_delete(sid),
        ]
        assert [r.status for r in refused] == [Status.BINDING_MISMATCH] * len(refused)
        assert all(set(r.body) == {"status"} for r in refused), "a refusal says nothing of the session"
        got = c.session_get(sid, binding="device-A")
        assert (got.body["rev"], got.body["data"]) == (1, {"n": 1})  # nothing was done
        assert c.cache_get("k", session_id=sid, binding="device-A").status is Status.NOT_FOUND
        events = _events(sub, {handle}, len(refused))
        assert {(e.topic, e.key) for e in events} == {("session.binding_mismatch", handle)}
        assert all(e.payload == {"client_id": client} for e in events)
        # A rotation keeps the binding: the new id asks for it too.
        rotated = c.session_rotate(sid, binding="device-A", grace_ms=0)
        new = rotated.session_id
        assert new is not None
        assert c.session_get(new).status is Status.BINDING_MISMATCH
        assert _events(sub, {rotated.body["handle"]}, 1)[0].topic == "session.binding_mismatch"
        assert c.session_get(new, binding="device-A").body["data"] == {"n": 1}
        assert c.session_delete(new, binding="device-A").ok


def test_a_session_created_without_a_binding_ignores_one_and_the_list_never_shows_a_binding(svc: Running) -> None:
    """Binding is opt-in per session (PROTOCOL.md 6, *Binding*); storage keeps only its SHA-256."""
    c, client = svc.client, _client()
    plain = c.session_create(client).session_id
    bound = c.session_create(client, binding="device-A")
    assert plain is not None
    assert c.session_get(plain, binding="whatever").ok
    assert c.session_get(plain).ok
    listed = c.session_list(client).body["sessions"]
    assert {s["handle"] for s in listed} >= {bound.body["handle"]}
    assert "device-A" not in repr(listed)  # the value is never shown, nor kept


# -- the grace window ------------------------------------------------------------------------------------------

GRACE_MS = 2000
READERS = 20
#: how far from the window's edges a read is not judged (the clocks of the test, the service and storage)
MARGIN_S = 0.15


@dataclass
class Read:
    sent: float
    answered: float
    status: str
    rotated: bool
    data: object


def _reader(endpoint: str, old: uuid.UUID, reads: list[Read], stop: threading.Event) -> None:
    """Read the old id until it is NOT_FOUND (or told to stop); a failure to answer is a read too."""
    with Client(endpoint, timeout_s=5) as c:
        while not stop.is_set():
            sent = time.monotonic()
            try:
                r = c.session_get(old)
                read = Read(sent, time.monotonic(), str(r.status), bool(r.body.get("rotated")), r.body.get("data"))
            except Exception as e:  # a read that failed is what this test counts
                read = Read(sent, time.monotonic(), f"error: {e}", False, None)
            reads.append(read)
            if read.status == "NOT_FOUND":
                return


def test_twenty_readers_of_the_old_id_read_it_through_the_grace_window_and_not_after(svc: Running) -> None:
    """SESSION_ROTATE with grace_ms: 20 concurrent readers of the old id, none fails inside the window (the
    rotated session's current data, rotated = true, nothing refreshed); a write by the old id is NOT_FOUND at
    once; after the window the old id is NOT_FOUND for every reader."""
    c = svc.client
    created = c.session_create(_client(), data={"v": 1}, ttl_s=600)
    old = created.session_id
    assert old is not None
    reads: list[list[Read]] = [[] for _ in range(READERS)]
    stop = threading.Event()
    threads = [threading.Thread(target=_reader, args=(svc.endpoint, old, reads[i], stop)) for i in range(READERS)]
    for t in threads:
        t.start()
    try:
        eventually(lambda: all(len(r) >= 3 for r in reads), what="every reader reads")
        rotate_sent = time.monotonic()
        rotated = c.session_rotate(old, grace_ms=GRACE_MS)
        rotate_answered = time.monotonic()
        assert rotated.ok
        new = rotated.session_id
        assert new is not None
        assert c.session_touch(old).status is Status.NOT_FOUND  # writes by the old id: gone at the commit
        assert c.session_update(old, {"v": 9}).status is Status.NOT_FOUND
        assert c.session_update(new, {"v": 2}).ok  # the readers of the old id see the session as it is now
        for t in threads:
            t.join(GRACE_MS / 1000 + 5)
    finally:
        stop.set()
        for t in threads:
            t.join(5)
    window_end = rotate_sent + GRACE_MS / 1000
    inside = [r for rs in reads for r in rs if r.answered < window_end - MARGIN_S]
    failed = [r for r in inside if r.status != "OK"]
    assert not failed, f"{len(failed)} of {len(inside)} reads inside the window failed: {failed[:3]}"
    after_commit = [r for r in inside if r.sent > rotate_answered]
    assert len(after_commit) >= READERS, "every reader read the old id inside the window, after the commit"
    assert all(r.rotated for r in after_commit)
    assert {repr(r.data) for r in after_commit} <= {repr({"v": 1}), repr({"v": 2})}
    # Storage's window opens at the commit (between rotate_sent and rotate_answered) and lasts GRACE_MS: a
    # NOT_FOUND answered before rotate_sent + GRACE_MS came too early; a read sent after rotate_answered +
    # GRACE_MS that still found the session came too late. Judged by what was sent and answered when, not
    # by how fast: a busy machine delays reads, never moves the window.
    for i, rs in enumerate(reads):
        last = rs[-1]
        assert last.status == "NOT_FOUND", f"reader {i} ended on {last}"
        assert last.answered >= window_end - MARGIN_S, f"reader {i}: NOT_FOUND before the window ended"
    late = rotate_answered + GRACE_MS / 1000 + MARGIN_S
    outlived = [r for rs in reads for r in rs if r.sent > late and r.status != "NOT_FOUND"]
    assert not outlived, f"the old id outlived its window: {outlived[:3]}"
    got = c.session_get(new)
    assert (got.body["data"], got.body.get("rotated")) == ({"v": 2}, None)
    print(f"{len(inside)} reads of the old id inside the {GRACE_MS} ms window, {len(after_commit)} after the commit")


def test_without_a_grace_window_the_old_id_is_gone_at_the_commit(svc: Running) -> None:
    c = svc.client
    old = c.session_create(_client(), data={"v": 1}).session_id
    assert old is not None
    assert c.session_rotate(old, grace_ms=0).ok
    assert c.session_get(old).status is Status.NOT_FOUND
    assert c.cache_get("k", session_id=old).status is Status.NOT_FOUND


# -- absolute lifetime -----------------------------------------------------------------------------------------

LIFETIME_S = 60  # the shortest max_lifetime_s (limits.max_lifetime_s)
IDLE_S = 20


@pytest.mark.slow
@pytest.mark.timeout(LIFETIME_S + 60)
def test_a_session_ends_at_its_absolute_lifetime_however_often_it_is_read_and_rotated(svc: Running) -> None:
    """Read every 2 s (each read slides the idle deadline) and rotated halfway: it ends at created + 60 s all the
    same, with session.expired {reason: absolute}, while a session with the default lifetime read alike lives."""
    c, client = svc.client, _client()
    with _subscribe(svc, ["session.expired"]) as sub:
        created_at = time.monotonic()
        created = c.session_create(client, data={"v": 1}, ttl_s=IDLE_S, max_lifetime_s=LIFETIME_S)
        created_answered = time.monotonic()
        other = c.session_create(client, ttl_s=IDLE_S)
        sid, control = created.session_id, other.session_id
        assert sid is not None
        assert control is not None
        assert LIFETIME_S * 1000 - 1000 < created.body["absolute_expires_in_ms"] <= LIFETIME_S * 1000
        assert created.body["expires_in_ms"] <= IDLE_S * 1000
        assert other.body["absolute_expires_in_ms"] > 3600 * 1000  # the cluster's default: 12 h
        rotated_handle, lefts = created.body["handle"], []
        reads: list[tuple[float, float, Status]] = []  # (sent, answered, status) of each read of the session
        while time.monotonic() - created_at < LIFETIME_S + 10:
            time.sleep(2)
            rotating = time.monotonic() - created_at > LIFETIME_S / 2 and rotated_handle == created.body["handle"]
            if rotating:
                rotated = c.session_rotate(sid, grace_ms=0)
                assert rotated.ok
                left = rotated.body["absolute_expires_in_ms"]
                assert left < (LIFETIME_S / 2) * 1000 + 1000, "a rotation keeps the absolute deadline"
                sid, rotated_handle = rotated.session_id, rotated.body["handle"]
                assert sid is not None
            sent = time.monotonic()
            got = c.session_get(sid)
            reads.append((sent, time.monotonic(), got.status))
            assert c.session_get(control).ok
            if got.status is Status.NOT_FOUND:
                break
            assert got.ok
            assert got.body["expires_in_ms"] <= got.body["absolute_expires_in_ms"]
            lefts.append(got.body["absolute_expires_in_ms"])
        # Storage stamps the creation between created_at and created_answered; the deadline is LIFETIME_S later.
        # A read answered before it must find the session, one sent after it must not (however late the
        # machine lets the reads go out).
        deadline_lo, deadline_hi = created_at + LIFETIME_S, created_answered + LIFETIME_S
        assert reads[-1][2] is Status.NOT_FOUND, f"the session outlived its absolute lifetime: {reads[-3:]}"
        assert all(status is Status.OK for _, answered, status in reads if answered < deadline_lo - 0.1)
        assert all(status is Status.NOT_FOUND for sent, _, status in reads if sent > deadline_hi + 0.1)
        assert any(answered > LIFETIME_S / 2 + created_at for _, answered, _ in reads[:-1]), "read after the rotation"
        assert lefts == sorted(lefts, reverse=True), "no read or rotation moves the absolute deadline"
        (expired,) = _events(sub, {rotated_handle}, 1, timeout_s=15)
        assert expired.payload == {"client_id": client, "reason": "absolute"}
        assert c.session_get(control).ok  # read alike, with the default lifetime: alive
