"""A subscription delivers every event once and in order: the stream, duplicates dropped, gaps read from storage.

A fake service answers EVENTS_READ from a list in memory; the test plays the
publisher on an inproc PUB socket (no network, no storage).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from smartcache.client import Event, Reply, Subscription
from smartcache.server.publisher import event_frames, heartbeat_frames
from smartcache.wire import REGISTRY, Header
from smartcache.wire.errors import CursorTooOld, RequestError

_ENDPOINTS = (f"inproc://events-{i}" for i in itertools.count())


class FakeService:
    """EVENTS_READ over an in-memory log; events up to `floor` are dropped; it can fail the next calls."""

    def __init__(self) -> None:
        self.log: list[dict[str, Any]] = []
        self.floor = 0
        self.reads: list[int | None] = []
        self.fail_next = 0

    def add(self, topic: str, key: str = "k") -> dict[str, Any]:
        event = {"seq": len(self.log) + 1, "time_ms": 1, "topic": topic, "key": key, "payload": {"n": len(self.log)}}
        self.log.append(event)
        return event

    def call(self, type_name: str, body: Any = None, **_: Any) -> Reply:
        assert type_name == "EVENTS_READ"
        if self.fail_next:
            self.fail_next -= 1
            raise RequestError("STORAGE_UNAVAILABLE", "no leader")
        after, topics, limit = body["after_seq"], body["topics"], body["limit"]
        self.reads.append(after)
        head = len(self.log)
        if after is None:
            return self._reply({"status": 0, "events": [], "last_seq": head, "head_seq": head})
        if after < self.floor:
            return self._reply({"status": REGISTRY.statuses["CURSOR_TOO_OLD"], "oldest_seq": self.floor + 1})
        after = min(after, head)  # PROTOCOL.md 11: a cursor beyond the head is read from the head
        out, last = [], after
        for e in self.log[after:]:
            last = e["seq"]
            if not topics or any(e["topic"].startswith(t) for t in topics):
                out.append(e)
                if len(out) >= limit:
                    break
        return self._reply({"status": 0, "events": out, "last_seq": last, "head_seq": head})

    @staticmethod
    def _reply(body: dict[str, Any]) -> Reply:
        return Reply(Header.request(REGISTRY.types["EVENTS_READ"].id, request_id=1), body)

    def close(self, linger_ms: int = 200) -> None:
        pass


@pytest.fixture
def pub() -> Iterator[tuple[zmq.Socket[Any], str]]:
    """The publisher's side: an XPUB, so a test can wait for the subscription to arrive (no slow joiner)."""
    sock = zmq.Context.instance().socket(zmq.XPUB)
    endpoint = next(_ENDPOINTS)
    sock.bind(endpoint)
    yield sock, endpoint
    sock.close(linger=0)


def _subscribed(sock: zmq.Socket[Any]) -> None:
    assert sock.poll(2000), "no subscription arrived"
    assert sock.recv() == b"\x01"  # subscribe to every topic


def _drain(sub: Subscription, n: int, timeout_s: float = 2.0) -> list[Event]:
    out = []
    for _ in range(n):
        e = sub.poll(timeout_s)
        assert e is not None, f"only {len(out)} of {n} events: {out}"
        out.append(e)
    return out


def test_the_stream_is_delivered_in_order_and_duplicates_from_a_second_publisher_are_dropped(pub: Any) -> None:
    sock, endpoint = pub
    svc = FakeService()
    with Subscription(svc, endpoint) as sub:
        _subscribed(sock)
        events = [svc.add("session.created", f"s{i}") for i in range(3)]
        for e in events + events:  # the same events twice: two publishers
            sock.send_multipart(event_frames(**e))
        got = _drain(sub, 3)
        assert sub.poll(0.05) is None
    assert [e.seq for e in got] == [1, 2, 3]
    assert [e.key for e in got] == ["s0", "s1", "s2"]
    assert sub.counts.duplicates == 3
    assert svc.reads == [None]  # no catch-up was needed


def test_a_gap_is_read_from_storage_and_each_event_comes_once(pub: Any) -> None:
    sock, endpoint = pub
    svc = FakeService()
    with Subscription(svc, endpoint) as sub:
        _subscribed(sock)
        events = [svc.add("app.x") for _ in range(5)]
        for e in (events[0], events[3], events[4]):  # 2 and 3 were lost (HWM, reconnect)
            sock.send_multipart(event_frames(**e))
        got = _drain(sub, 5)
        assert sub.poll(0.05) is None
    assert [e.seq for e in got] == [1, 2, 3, 4, 5]
    assert sub.counts.gaps == 1
    assert svc.reads == [None, 1]


def test_a_heartbeat_ahead_of_the_cursor_is_a_gap_at_the_tail(pub: Any) -> None:
    sock, endpoint = pub
    svc = FakeService()
    with Subscription(svc, endpoint) as sub:
        _subscribed(sock)
        svc.add("app.x")
        sock.send_multipart(heartbeat_frames(1))  # event 1 never arrived on the stream
        assert [e.seq for e in _drain(sub, 1)] == [1]


def test_a_late_start_catches_up_from_from_seq_then_follows_the_stream(pub: Any) -> None:
    sock, endpoint = pub
    svc = FakeService()
    for _ in range(2500):
        svc.add("app.old")
    with Subscription(svc, endpoint, from_seq=2001) as sub:
        _subscribed(sock)
        got = _drain(sub, 500)
        live = svc.add("app.new")
        sock.send_multipart(event_frames(**live))
        got += _drain(sub, 1)
    assert [e.seq for e in got] == list(range(2001, 2502))


def test_topics_filter_here_and_the_cursor_moves_past_what_they_skip(pub: Any) -> None:
    sock, endpoint = pub
    svc = FakeService()
    with Subscription(svc, endpoint, topics=["session."]) as sub:
        _subscribed(sock)
        for topic in ("session.created", "app.noise", "session.deleted"):
            sock.send_multipart(event_frames(**svc.add(topic)))
        got = _drain(sub, 2)
        assert sub.poll(0.05) is None
    assert [(e.seq, e.topic) for e in got] == [(1, "session.created"), (3, "session.deleted")]
    assert sub.cursor == 3
    assert svc.reads == [None]


def test_transient_failures_of_a_catch_up_are_retried(pub: Any) -> None:
    _, endpoint = pub
    svc = FakeService()
    svc.add("app.x")
    svc.fail_next = 2
    with Subscription(svc, endpoint, from_seq=1) as sub:
        assert [e.seq for e in _drain(sub, 1)] == [1]


def test_events_dropped_by_retention_raise_cursor_too_old_never_a_silent_gap(pub: Any) -> None:
    _, endpoint = pub
    svc = FakeService()
    for _ in range(10):
        svc.add("app.x")
    svc.floor = 6
    with Subscription(svc, endpoint, from_seq=3) as sub, pytest.raises(CursorTooOld) as e:
        sub.poll(1)
    assert (e.value.cursor, e.value.oldest_seq) == (2, 7)


def test_a_cursor_beyond_the_head_follows_the_head_the_service_answers(pub: Any) -> None:
    """PROTOCOL.md 11: last_seq never passes head_seq, and the reader goes on from it: the events numbered
    up to its old cursor, when they come, are new ones (a restored log, a from_seq ahead), never skipped."""
    sock, endpoint = pub
    svc = FakeService()
    for _ in range(3):
        svc.add("app.old")
    with Subscription(svc, endpoint, from_seq=11) as sub:
        _subscribed(sock)
        assert sub.poll(0.1) is None
        assert sub.cursor == 3
        new = svc.add("app.new")  # seq 4: below the cursor the subscriber started with
        sock.send_multipart(event_frames(**new))
        (got,) = _drain(sub, 1)
    assert (got.seq, got.topic) == (4, "app.new")


def test_a_heartbeat_at_the_cursor_or_an_event_in_order_shows_the_shard_current_and_a_gap_is_told_at_once(
    pub: Any,
) -> None:
    """What a near cache reads of a subscription: `heard` (a publisher showed the cursor current), `on_gap`."""
    sock, endpoint = pub
    svc = FakeService()
    gaps: list[str] = []
    with Subscription(svc, endpoint) as sub:
        sub.on_gap = gaps.append
        _subscribed(sock)
        assert sub.heard == {}  # the head read from storage is no word of a publisher's
        sock.send_multipart(heartbeat_frames(0))
        assert sub.poll(0.1) is None
        first = sub.heard[""]
        e = svc.add("app.x")
        sock.send_multipart(event_frames(**e))
        _drain(sub, 1)
        assert sub.heard[""] >= first
        svc.add("app.x")
        sock.send_multipart(heartbeat_frames(2))  # event 2 was lost: a gap, told before it is read
        heard = sub.heard[""]
        assert [x.seq for x in _drain(sub, 1)] == [2]
        assert gaps == [""]
        assert sub.heard[""] == heard  # a heartbeat above the cursor proves nothing
        assert sub.behind == frozenset()
