"""The door in: every message a client sends is validated, then answered, refused or queued, and counted."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest

from smartcache.server.broker import intake as intake_module
from smartcache.server.broker.intake import Intake, RateLimit
from smartcache.server.broker.queue import Holder, PriorityQueue
from smartcache.server.config import Settings
from smartcache.server.metrics import Metrics
from smartcache.wire import (
    FLAG_DATA_ERROR,
    FLAG_NO_REPLY,
    HEADER_STRUCT,
    NO_SESSION,
    OFFSET,
    REGISTRY,
    STATUS,
    TRANSPORT_ERROR,
    Header,
    encode_header,
)
from tests.unit.stubs import (
    PEER,
    SESSION,
    RecordingReplies,
    StubKeyRing,
    body,
    frames,
    header,
    make_queue,
    sample,
    type_id,
)

NOW = 1000.0


@dataclass
class Door:
    settings: Settings
    metrics: Metrics
    queue: PriorityQueue
    replies: RecordingReplies
    intake: Intake

    def accept(self, message: list[bytes], user_id: str | None = None, now: float = NOW) -> None:
        self.intake.accept(message, now, user_id)

    def queued(self) -> list[Holder]:
        """Take out everything queued, in arrival order."""
        return list(self.queue.drain())

    def bad_input(self, error: str) -> float:
        return sample(self.metrics.bad_input, error=error.lower())

    def outcome(self, type_name: str, outcome: str) -> float:
        return sample(self.metrics.messages, type=type_name.lower(), outcome=outcome.lower())

    def rejections(self, reason: str) -> float:
        return sample(self.metrics.rejections, reason=reason)


def door(keyring: Any = None, **settings: Any) -> Door:
    s = Settings(**settings)
    metrics = Metrics()
    queue = make_queue(s)
    replies = RecordingReplies(metrics=metrics)
    return Door(
        s, metrics, queue, replies, Intake(settings=s, metrics=metrics, queue=queue, replies=replies, keyring=keyring)
    )


def patched(frame: bytes, field: str, value: int) -> bytes:
    """A header frame with one byte-wide field (version, system, flags, reserved) set to ``value``."""
    at = OFFSET[field]
    return frame[:at] + bytes((value,)) + frame[at + 1 :]


def assert_error_answer(d: Door, error: str, *, request_id: int, type_id: int) -> None:
    """One answer went out: transport error ``error``, DATA_ERROR, an error object body."""
    sent = d.replies.only()
    assert sent.envelope == [PEER]
    assert sent.header.transport_error == TRANSPORT_ERROR[error]
    assert sent.header.flags == FLAG_DATA_ERROR
    assert sent.header.request_id == request_id
    assert sent.header.type == type_id
    assert sent.body["status"] == STATUS["ERROR"]
    assert sent.body["error"] == error
    assert sent.body["message"]


# -- bad frames and headers -------------------------------------------------------


def test_a_message_with_only_a_header_frame_is_answered_bad_frames_and_counted() -> None:
    d = door()
    d.accept([PEER, header("DEVICE_LOOKUP", request_id=7)])
    assert_error_answer(d, "BAD_FRAMES", request_id=7, type_id=type_id("DEVICE_LOOKUP"))
    assert d.bad_input("BAD_FRAMES") == 1
    assert d.outcome("DEVICE_LOOKUP", "BAD_FRAMES") == 1
    assert d.queued() == []


def test_a_message_with_three_frames_after_the_identity_is_answered_bad_frames() -> None:
    d = door()
    d.accept([*frames("DEVICE_LOOKUP", request_id=8), b"extra"])
    assert_error_answer(d, "BAD_FRAMES", request_id=8, type_id=type_id("DEVICE_LOOKUP"))
    assert d.queued() == []


def test_an_identity_without_frames_is_answered_bad_frames_with_a_zero_header() -> None:
    d = door()
    d.accept([PEER])
    assert_error_answer(d, "BAD_FRAMES", request_id=0, type_id=0)
    assert d.replies.only().header.session_id == NO_SESSION
    assert d.outcome("UNKNOWN", "BAD_FRAMES") == 1


def test_a_req_client_is_answered_through_its_envelope_with_the_empty_delimiter() -> None:
    d = door()
    d.accept(frames("PING", req=True, request_id=3))
    sent = d.replies.only()
    assert sent.envelope == [PEER, b""]
    assert sent.header.request_id == 3


GOOD = header("DEVICE_LOOKUP", request_id=42, session_id=SESSION)
BAD_HEADERS = {
    "short": (GOOD[:-1], "BAD_HEADER"),
    "long": (GOOD + b"\0", "BAD_HEADER"),
    "version": (patched(GOOD, "version", REGISTRY.version + 1), "UNSUPPORTED_VERSION"),
    "system": (patched(GOOD, "system", 7), "UNKNOWN_SYSTEM"),
    "unknown flag": (patched(GOOD, "flags", 0x80), "BAD_HEADER"),
    "reserved byte": (patched(GOOD, "reserved", 1), "BAD_HEADER"),
    "unknown transport error": (
        encode_header(
            Header.request(type_id("DEVICE_LOOKUP"), request_id=42, session_id=SESSION)._replace(transport_error=999)
        ),
        "BAD_HEADER",
    ),
    "unknown type": (encode_header(Header.request(999, request_id=42, session_id=SESSION)), "UNKNOWN_TYPE"),
}


@pytest.mark.parametrize("name", list(BAD_HEADERS))
def test_a_header_the_decoder_refuses_is_answered_with_the_decoders_transport_error(name: str) -> None:
    frame, error = BAD_HEADERS[name]
    d = door()
    d.accept([PEER, frame, body({"device_id": "d-1"})])
    sent = d.replies.only()
    assert sent.header.transport_error == TRANSPORT_ERROR[error]
    assert sent.header.flags == FLAG_DATA_ERROR
    assert sent.header.version == REGISTRY.version  # the reply speaks our version whatever the request said
    assert sent.body["error"] == error
    assert sent.body["status"] == STATUS["ERROR"]
    if len(frame) == HEADER_STRUCT.size:  # a 36-byte frame is answered with its own request id and session
        assert (sent.header.request_id, sent.header.session_id) == (42, SESSION)
    else:  # any other size: request id 0 and a zero session (PROTOCOL.md 4)
        assert (sent.header.request_id, sent.header.session_id, sent.header.type) == (0, NO_SESSION, 0)
    assert d.bad_input(error) == 1
    assert d.queued() == []


def test_a_client_header_with_a_transport_error_set_is_answered_bad_header() -> None:
    d = door()
    frame = encode_header(
        Header.request(type_id("DEVICE_LOOKUP"), request_id=5)._replace(transport_error=TRANSPORT_ERROR["EXPIRED"])
    )
    d.accept([PEER, frame, body({"device_id": "d-1"})])
    assert_error_answer(d, "BAD_HEADER", request_id=5, type_id=type_id("DEVICE_LOOKUP"))
    assert d.bad_input("BAD_HEADER") == 1
    assert d.queued() == []


def test_an_internal_type_sent_by_a_client_is_answered_unknown_type() -> None:
    d = door()
    d.accept(frames("PREWARM_FETCH", request_id=6))
    assert_error_answer(d, "UNKNOWN_TYPE", request_id=6, type_id=type_id("PREWARM_FETCH"))
    assert d.bad_input("UNKNOWN_TYPE") == 1
    assert d.queued() == []


# -- refusals before the queue -------------------------------------------------------


KEYS = StubKeyRing({"reader-key": ("reader", ["PING", "DEVICE_LOOKUP"]), "writer-key": ("writer", ["SESSION_CREATE"])})


def test_a_type_the_clients_key_may_not_send_is_answered_forbidden_naming_the_key() -> None:
    d = door(keyring=KEYS)
    d.accept(frames("DEVICE_BIND", request_id=9), user_id="reader-key")
    assert_error_answer(d, "FORBIDDEN", request_id=9, type_id=type_id("DEVICE_BIND"))
    assert "'reader'" in d.replies.only().body["message"]
    assert d.outcome("DEVICE_BIND", "FORBIDDEN") == 1
    assert d.bad_input("FORBIDDEN") == 0  # not malformed: refused
    assert d.queued() == []


def test_a_type_the_clients_key_may_send_is_queued() -> None:
    d = door(keyring=KEYS)
    d.accept(frames("DEVICE_LOOKUP"), user_id="reader-key")
    assert d.replies.sent == []
    assert [h.type_id for h in d.queued()] == [type_id("DEVICE_LOOKUP")]


def test_a_key_the_keyring_does_not_know_is_forbidden_everything() -> None:
    d = door(keyring=KEYS)
    d.accept(frames("DEVICE_LOOKUP", request_id=2), user_id=None)
    assert_error_answer(d, "FORBIDDEN", request_id=2, type_id=type_id("DEVICE_LOOKUP"))
    assert "'unknown'" in d.replies.only().body["message"]


def test_a_forbidden_session_create_is_answered_with_a_zero_session_id() -> None:
    d = door(keyring=KEYS)
    d.accept(frames("SESSION_CREATE", session_id=SESSION), user_id="reader-key")
    assert d.replies.only().header.session_id == NO_SESSION


def test_a_body_over_the_limit_is_answered_body_too_large_and_counted() -> None:
    d = door(max_body_bytes=64)
    d.accept(frames("DEVICE_LOOKUP", {"device_id": "x" * 100}, request_id=11))
    assert_error_answer(d, "BODY_TOO_LARGE", request_id=11, type_id=type_id("DEVICE_LOOKUP"))
    assert d.bad_input("BODY_TOO_LARGE") == 1
    assert d.queued() == []


def test_a_body_at_the_limit_is_queued() -> None:
    d = door(max_body_bytes=64)
    fields = next(f for n in range(64) if len(body(f := {"device_id": "x" * n})) == 64)
    d.accept(frames("DEVICE_LOOKUP", fields))
    assert d.replies.sent == []
    assert len(d.queued()) == 1


def test_a_stopping_intake_answers_shutting_down_and_counts_a_rejection() -> None:
    d = door()
    d.intake.stopping = True
    d.accept(frames("DEVICE_LOOKUP", request_id=12))
    assert_error_answer(d, "SHUTTING_DOWN", request_id=12, type_id=type_id("DEVICE_LOOKUP"))
    assert d.rejections("shutting_down") == 1
    assert d.outcome("DEVICE_LOOKUP", "SHUTTING_DOWN") == 1
    assert d.queued() == []


def test_a_ping_to_a_stopping_intake_is_answered_shutting_down() -> None:
    d = door()
    d.intake.stopping = True
    d.accept(frames("PING", request_id=13))
    assert_error_answer(d, "SHUTTING_DOWN", request_id=13, type_id=type_id("PING"))


def test_bad_input_to_a_stopping_intake_is_still_answered_as_bad_input() -> None:
    d = door()
    d.intake.stopping = True
    d.accept([PEER, b"short", b""])
    assert d.replies.only().body["error"] == "BAD_HEADER"
    assert d.rejections("shutting_down") == 0


# -- PING ---------------------------------------------------------------------------


def test_ping_is_answered_ok_with_the_time_in_its_own_header_and_never_queued() -> None:
    d = door()
    before = int(time.time() * 1000)
    d.accept(frames("PING", request_id=21, lifetime_ms=500))
    after = int(time.time() * 1000)
    sent = d.replies.only()
    request = Header.request(type_id("PING"), request_id=21, lifetime_ms=500)
    assert sent.header == request.reply()
    assert sent.body["status"] == STATUS["OK"]
    assert before <= sent.body["time_ms"] <= after
    assert d.outcome("PING", "OK") == 1
    assert sample(d.metrics.duration, "_count", type="ping") == 1
    assert d.queued() == []


def test_ping_with_an_empty_body_frame_is_answered_ok() -> None:
    d = door()
    d.accept([PEER, header("PING"), b""])
    assert d.replies.only().body["status"] == STATUS["OK"]


def test_ping_with_a_body_that_is_not_a_map_is_answered_bad_body_and_counted() -> None:
    d = door()
    d.accept([PEER, header("PING", request_id=22), b"\x93\x01\x02\x03"])  # a msgpack array
    assert_error_answer(d, "BAD_BODY", request_id=22, type_id=type_id("PING"))
    assert d.bad_input("BAD_BODY") == 1
    assert d.outcome("PING", "OK") == 0


# -- the NO_REPLY rule ----------------------------------------------------------------


def _transport_error_set(flags: int) -> list[bytes]:
    h = Header.request(type_id("DEVICE_LOOKUP"), request_id=1, flags=flags)._replace(transport_error=1)
    return [PEER, encode_header(h), body({"device_id": "d-1"})]


NO_REPLY_CASES = {
    "ping": (frames("PING", flags=FLAG_NO_REPLY), {}, "PING", "OK"),
    "bad frames": ([PEER, header("DEVICE_LOOKUP", flags=FLAG_NO_REPLY)], {}, "DEVICE_LOOKUP", "BAD_FRAMES"),
    "bad header": (_transport_error_set(FLAG_NO_REPLY), {}, "DEVICE_LOOKUP", "BAD_HEADER"),
    "app start too large": (
        frames("APP_START", {"device_id": "x" * 100}),
        {"max_body_bytes": 64},
        "APP_START",
        "BODY_TOO_LARGE",
    ),
    "forbidden": (frames("DEVICE_BIND", flags=FLAG_NO_REPLY), {"keyring": KEYS}, "DEVICE_BIND", "FORBIDDEN"),
}


@pytest.mark.parametrize("name", list(NO_REPLY_CASES))
def test_a_no_reply_message_gets_no_answer_on_any_path_but_is_counted(name: str) -> None:
    message, options, type_name, outcome = NO_REPLY_CASES[name]
    d = door(**options)
    d.accept(message, user_id="reader-key")
    assert d.replies.sent == []
    assert d.outcome(type_name, outcome) == 1


def test_a_no_reply_message_to_a_stopping_intake_gets_no_answer() -> None:
    d = door()
    d.intake.stopping = True
    d.accept(frames("DEVICE_LOOKUP", flags=FLAG_NO_REPLY))
    d.accept(frames("APP_START"))
    assert d.replies.sent == []
    assert d.rejections("shutting_down") == 2


# -- into the queue -------------------------------------------------------------------


def test_a_valid_message_is_queued_with_its_types_priority_and_default_lifetime() -> None:
    d = door()
    message = frames("DEVICE_LOOKUP", request_id=31)
    d.accept(message)
    assert d.replies.sent == []
    [h] = d.queued()
    spec = REGISTRY.types["DEVICE_LOOKUP"]
    assert (h.type_id, h.priority) == (spec.id, spec.priority)
    assert (h.arrived, h.deadline) == (NOW, NOW + spec.lifetime_ms / 1000)
    assert (h.envelope, h.header, h.body) == ([PEER], message[1], message[2])
    assert h.no_reply is False


def test_the_header_lifetime_replaces_the_types_default() -> None:
    d = door()
    d.accept(frames("DEVICE_LOOKUP", lifetime_ms=250))
    assert d.queued()[0].deadline == NOW + 0.25


def test_a_lifetime_is_capped_at_the_registry_maximum() -> None:
    d = door()
    d.accept(frames("DEVICE_LOOKUP", lifetime_ms=REGISTRY.max_lifetime_ms * 10))
    assert d.queued()[0].deadline == NOW + REGISTRY.max_lifetime_ms / 1000


def test_a_no_reply_flag_or_a_never_answered_type_is_queued_as_no_reply() -> None:
    d = door()
    d.accept(frames("DEVICE_LOOKUP", flags=FLAG_NO_REPLY))
    d.accept(frames("APP_START"))
    assert [h.no_reply for h in d.queued()] == [True, True]


def test_queued_messages_are_numbered_in_arrival_order() -> None:
    d = door()
    for rid in (1, 2, 3):
        d.accept(frames("DEVICE_LOOKUP", request_id=rid))
    held = d.queued()
    assert [h.seq for h in held] == sorted(h.seq for h in held)
    assert len({h.seq for h in held}) == 3


def test_a_full_queue_refuses_a_new_message_with_queue_full_and_counts_it() -> None:
    d = door(queue_capacity=1)
    d.accept(frames("DEVICE_LOOKUP", request_id=1))
    d.accept(frames("DEVICE_LOOKUP", request_id=2))
    assert_error_answer(d, "QUEUE_FULL", request_id=2, type_id=type_id("DEVICE_LOOKUP"))
    assert d.rejections("full") == 1
    assert d.outcome("DEVICE_LOOKUP", "QUEUE_FULL") == 1
    assert len(d.queued()) == 1


def test_a_more_urgent_message_evicts_the_newest_least_urgent_which_is_answered_queue_full() -> None:
    d = door(queue_capacity=2)
    d.accept(frames("DEVICE_LOOKUP", request_id=1))
    d.accept(frames("DEVICE_LOOKUP", request_id=2))
    d.accept(frames("SESSION_GET", request_id=3))  # priority 1 beats DEVICE_LOOKUP's 2
    assert_error_answer(d, "QUEUE_FULL", request_id=2, type_id=type_id("DEVICE_LOOKUP"))
    assert "evicted" in d.replies.only().body["message"]
    assert d.rejections("evicted") == 1
    assert d.rejections("full") == 0
    assert sorted(h.type_id for h in d.queued()) == [type_id("SESSION_GET"), type_id("DEVICE_LOOKUP")]


def test_an_evicted_no_reply_message_is_counted_but_not_answered() -> None:
    d = door(queue_capacity=1)
    d.accept(frames("APP_START"))
    d.accept(frames("SESSION_GET"))
    assert d.replies.sent == []
    assert d.rejections("evicted") == 1
    assert d.outcome("APP_START", "QUEUE_FULL") == 1


# -- the bad-input rate ----------------------------------------------------------------


class Clock:
    """A monotonic clock the test moves, patched into the intake module (its PING and replies read it;
    the rate limit goes by each message's arrival time)."""

    def __init__(self) -> None:
        self.now = 500.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(intake_module, "time", c)
    return c


def garbage(identity: bytes = PEER) -> list[bytes]:
    return [identity, b"not a header", b""]


def test_bad_input_beyond_the_per_peer_rate_is_dropped_unanswered_and_counted(clock: Clock) -> None:
    d = door(bad_input_per_peer_per_s=2, bad_input_per_s=100)
    for _ in range(3):
        d.accept(garbage())
    assert len(d.replies.sent) == 2
    assert d.bad_input("BAD_HEADER") == 3  # every one is counted as bad input...
    assert sample(d.metrics.bad_input_throttled) == 1  # ...and the unanswered one as throttled
    d.accept(garbage(b"peer-2"))  # another connection has a budget of its own
    assert d.replies.sent[-1].envelope == [b"peer-2"]


def test_bad_input_beyond_the_total_rate_is_dropped_whatever_the_peer(clock: Clock) -> None:
    d = door(bad_input_per_peer_per_s=100, bad_input_per_s=2)
    for peer in (b"a", b"b", b"c"):
        d.accept(garbage(peer))
    assert [s.envelope for s in d.replies.sent] == [[b"a"], [b"b"]]
    assert sample(d.metrics.bad_input_throttled) == 1


def test_the_bad_input_budget_refills_with_time() -> None:
    d = door(bad_input_per_peer_per_s=1, bad_input_per_s=100)
    d.accept(garbage())
    d.accept(garbage())
    assert len(d.replies.sent) == 1
    d.accept(garbage(), now=NOW + 1.0)  # a second later: a token is back
    assert len(d.replies.sent) == 2


def test_valid_messages_are_never_throttled_by_the_bad_input_rate(clock: Clock) -> None:
    d = door(bad_input_per_peer_per_s=1, bad_input_per_s=1)
    d.accept(garbage())
    d.accept(garbage())
    d.accept(frames("PING"))
    d.accept(frames("DEVICE_LOOKUP"))
    assert [s.body["status"] for s in d.replies.sent] == [STATUS["ERROR"], STATUS["OK"]]
    assert len(d.queued()) == 1


def test_the_rate_limit_forgets_every_peer_rather_than_track_more_than_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(intake_module, "PEERS_TRACKED", 2)
    limit = RateLimit(per_key=1, total=100)
    now = time.monotonic()
    assert limit.allow(b"a", now)
    assert not limit.allow(b"a", now)
    assert limit.allow(b"b", now)
    assert limit.allow(b"c", now)  # a third peer: everyone forgotten...
    assert limit.allow(b"a", now)  # ...so a has a full budget again


# -- internal messages ------------------------------------------------------------------


def prewarm_fetch() -> tuple[bytes, bytes]:
    return header("PREWARM_FETCH", request_id=1), body({"client_id": "c-1", "data_type": 1})


def test_an_internal_message_is_queued_without_a_client_and_without_a_reply() -> None:
    d = door()
    d.intake.enqueue_internal(*prewarm_fetch(), NOW)
    [h] = d.queued()
    spec = REGISTRY.types["PREWARM_FETCH"]
    assert (h.type_id, h.priority, h.deadline) == (spec.id, spec.priority, NOW + spec.lifetime_ms / 1000)
    assert h.envelope == []
    assert h.no_reply is True
    assert d.replies.sent == []


def test_an_internal_message_at_stop_is_refused_and_counted_as_a_rejection() -> None:
    d = door()
    d.intake.stopping = True
    d.intake.enqueue_internal(*prewarm_fetch(), NOW)
    assert d.queued() == []
    assert d.replies.sent == []
    assert d.rejections("shutting_down") == 1


def test_an_internal_message_refused_by_a_full_queue_is_counted_and_not_answered() -> None:
    d = door(queue_capacity=1)
    d.accept(frames("DEVICE_LOOKUP"))
    d.intake.enqueue_internal(*prewarm_fetch(), NOW)  # the least urgent type evicts nothing
    assert d.replies.sent == []
    assert d.rejections("full") == 1
    assert d.outcome("PREWARM_FETCH", "QUEUE_FULL") == 1


def test_a_ping_with_a_session_id_breaks_its_session_rule_and_is_answered_bad_request() -> None:
    """PING's session rule is "none": a set session id is BAD_REQUEST, as execute answers every other type."""
    d = door()
    d.accept([PEER, header("PING", request_id=5, session_id=bytes(range(16))), b""])
    (sent,) = d.replies.sent
    assert sent.header.transport_error == 0
    assert sent.body["status"] == STATUS["BAD_REQUEST"]
    assert "session_id" in sent.body["message"]
    assert d.outcome("PING", "BAD_REQUEST") == 1


# -- behind the --processes proxy: one more routing frame (the proxy's hop) ------------------------

HOP = b"proxy-hop"


def test_behind_the_proxy_a_header_alone_is_answered_bad_frames_through_hop_and_client() -> None:
    d = door(routing_hops=2)
    d.accept([HOP, PEER, header("DEVICE_LOOKUP", request_id=7)])
    sent = d.replies.only()
    assert sent.envelope == [HOP, PEER]
    assert sent.header.transport_error == TRANSPORT_ERROR["BAD_FRAMES"]
    assert sent.header.request_id == 7
    assert d.bad_input("BAD_FRAMES") == 1


def test_behind_the_proxy_a_good_message_is_queued_with_hop_client_and_delimiter() -> None:
    d = door(routing_hops=2)
    d.accept([HOP, *frames("DEVICE_LOOKUP", req=True, request_id=9)])
    (h,) = d.queued()
    assert h.envelope == [HOP, PEER, b""]
    assert d.replies.sent == []


def test_behind_the_proxy_an_identity_without_frames_is_answered_bad_frames() -> None:
    d = door(routing_hops=2)
    d.accept([HOP, PEER])
    assert d.replies.only().envelope == [HOP, PEER]
    assert d.outcome("UNKNOWN", "BAD_FRAMES") == 1


def test_behind_the_proxy_less_than_the_routing_frames_is_counted_and_never_answered() -> None:
    d = door(routing_hops=2)
    d.accept([HOP])
    assert d.replies.sent == []
    assert d.bad_input("BAD_FRAMES") == 1


def test_behind_the_proxy_the_bad_input_rate_is_each_clients_not_the_hops(clock: Clock) -> None:
    d = door(routing_hops=2, bad_input_per_peer_per_s=2, bad_input_per_s=100)
    for _ in range(3):
        d.accept([HOP, *garbage()])
    assert len(d.replies.sent) == 2
    d.accept([HOP, *garbage(b"peer-2")])  # the same hop, another client: a budget of its own
    assert d.replies.sent[-1].envelope == [HOP, b"peer-2"]
