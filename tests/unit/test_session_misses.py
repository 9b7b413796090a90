"""Guessing a session id, slowed: a peer's NOT_FOUND answers about sessions are counted, and beyond the limit in
its second its requests naming a session are refused QUEUE_FULL, not executed, until the second ends."""

from __future__ import annotations

from smartcache.server.broker import inproc
from smartcache.server.broker.dispatch import Dispatcher
from smartcache.server.broker.intake import Intake
from smartcache.server.config import Settings
from smartcache.server.metrics import Metrics
from smartcache.wire import NO_SESSION, STATUS, TRANSPORT_ERROR, Header, encode_body, encode_header
from tests.unit.stubs import PEER, SESSION, RecordingReplies, body, header, make_queue, sample, type_id
from tests.unit.test_dispatch import Room

LIMIT = 3


def room() -> Room:
    s = Settings(not_found_per_peer_per_s=LIMIT)
    metrics = Metrics()
    queue = make_queue(s)
    replies = RecordingReplies(metrics=metrics)
    intake = Intake(settings=s, metrics=metrics, queue=queue, replies=replies)
    dispatcher = Dispatcher(
        queue=queue,
        replies=replies,
        enqueue_internal=intake.enqueue_internal,
        bad_input_allowed=intake.allow_bad_input,
        metrics=metrics,
        session_missed=intake.misses.missed,
    )
    r = Room(metrics, queue, replies, intake, dispatcher)
    r.ready(b"w1", 100)
    return r


NOT_FOUND = (
    encode_header(Header.request(type_id("SESSION_GET"), request_id=1, session_id=SESSION)),
    encode_body({"status": STATUS["NOT_FOUND"]}),
)


def send(r: Room, now: float, type_name: str = "SESSION_GET", *, conn: bytes = PEER, key: str | None = None) -> None:
    fields = {"handle": "h" + "a" * 26, "client_id": "c"} if type_name == "SESSION_DELETE" else {}
    sid = SESSION if type_name == "SESSION_GET" else NO_SESSION
    body_fields = {"device_id": "d"} if type_name == "DEVICE_LOOKUP" else fields
    r.intake.accept([conn, header(type_name, session_id=sid), body(body_fields)], now, key)


def answered(r: Room, kind: bytes, now: float) -> None:
    """The message just queued runs and is answered with a NOT_FOUND, as ``kind`` (MISS or REPLY)."""
    r.dispatch(now)
    r.answer(b"w1", kind, r.handed(b"w1")[-1][0], *NOT_FOUND, now=now)


def refused(r: Room) -> bool:
    return r.replies.sent[-1].header.transport_error == TRANSPORT_ERROR["QUEUE_FULL"]


def test_beyond_the_limit_a_peers_session_requests_are_refused_queue_full_until_its_second_ends() -> None:
    r = room()
    for i in range(LIMIT):
        send(r, 10.0 + i * 0.1)
        answered(r, inproc.MISS, 10.0 + i * 0.1)
    assert sample(r.metrics.session_not_found) == LIMIT
    send(r, 10.5)
    assert refused(r)
    assert r.queue.depth == 0  # not executed
    send(r, 10.6, "SESSION_DELETE")  # by handle: names a session too
    assert refused(r)
    assert sample(r.metrics.session_not_found_throttled) == 2
    send(r, 10.7, "DEVICE_LOOKUP")  # names no session: queued
    send(r, 11.01)  # the second is over: queued
    assert r.queue.depth == 2


def test_a_not_found_that_is_no_miss_counts_for_nothing_and_other_peers_keep_their_allowance() -> None:
    r = room()
    for _ in range(LIMIT):
        send(r, 1.0)
        answered(r, inproc.REPLY, 1.0)  # e.g. a live session's missing cache key
    send(r, 1.0)
    assert r.queue.depth == 1
    r.queue.drain()
    for _ in range(LIMIT):
        send(r, 2.0, conn=b"guesser")
        answered(r, inproc.MISS, 2.0)
    send(r, 2.1, conn=b"guesser")
    assert refused(r)
    send(r, 2.1)
    assert r.queue.depth == 1


def test_with_curve_the_peer_is_the_clients_key_so_a_reconnect_gets_no_new_allowance() -> None:
    r = room()
    for _ in range(LIMIT):
        send(r, 5.0, conn=b"conn-1", key="key-A")
        answered(r, inproc.MISS, 5.0)
    send(r, 5.1, conn=b"conn-2", key="key-A")
    assert refused(r)
    assert r.replies.sent[-1].envelope == [b"conn-2"]
