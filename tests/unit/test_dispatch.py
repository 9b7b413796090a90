"""The broker's worker side: slots as credits, batches in priority order, one answer per ticket, the watchdog."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from smartcache.server.broker import inproc
from smartcache.server.broker.dispatch import Dispatcher
from smartcache.server.broker.intake import Intake
from smartcache.server.broker.queue import PriorityQueue
from smartcache.server.config import Settings
from smartcache.server.deadlines import WATCHDOG_GRACE_S
from smartcache.server.metrics import Metrics
from smartcache.wire import (
    FLAG_DATA_ERROR,
    FLAG_NO_REPLY,
    STATUS,
    TRANSPORT_ERROR,
    Header,
    encode_body,
    encode_header,
    frame_request_id,
)
from tests.unit.stubs import PEER, RecordingReplies, body, frames, header, make_queue, sample, type_id


@dataclass
class Room:
    """The broker's parts without its thread and sockets; workers are direct links that record batches."""

    metrics: Metrics
    queue: PriorityQueue
    replies: RecordingReplies
    intake: Intake
    dispatcher: Dispatcher
    #: worker identity -> the batches it was handed
    batches: dict[bytes, list[list[bytes]]] = field(default_factory=lambda: defaultdict(list))
    announced: int = 0

    def ready(self, wid: bytes, slots: int, now: float = 0.0) -> None:
        self.dispatcher.direct[wid] = self.batches[wid].append
        self.dispatcher.take(wid, [inproc.READY, inproc.CREDIT.pack(slots), b"", b""], now)
        self.announced += slots

    def accept(self, type_name: str, now: float = 0.0, **header_fields: Any) -> None:
        self.intake.accept(frames(type_name, **header_fields), now)

    def dispatch(self, now: float = 0.0) -> None:
        # Every worker here is direct: the socket is never used (dispatch still asks for one).
        self.dispatcher.dispatch(None, now)  # type: ignore[arg-type]

    def answer(
        self, wid: bytes, kind: bytes, ticket: bytes, a: bytes = b"", b: bytes = b"", *, now: float = 0.0
    ) -> None:
        self.dispatcher.take(wid, [kind, ticket, a, b], now)

    def handed(self, wid: bytes) -> list[tuple[bytes, bytes, bytes]]:
        """Every (ticket, header, body) the worker was handed, in order."""
        out = []
        for batch in self.batches[wid]:
            out += [tuple(batch[i : i + 3]) for i in range(0, len(batch), inproc.TO_WORKER)]
        return out  # type: ignore[return-value]

    def slots_add_up(self) -> bool:
        return len(self.dispatcher.free) + len(self.dispatcher.inflight) == self.announced


def room(**overrides: Any) -> Room:
    s = Settings(**overrides)
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
    )
    return Room(metrics, queue, replies, intake, dispatcher)


def reply_frames(request_id: int, status: str = "OK") -> tuple[bytes, bytes]:
    h = Header.request(type_id("DEVICE_LOOKUP"), request_id=request_id)
    return encode_header(h), encode_body({"status": STATUS[status], "client_id": "c-1"})


def one_running(r: Room, **header_fields: Any) -> bytes:
    """Worker w1 with one slot runs one DEVICE_LOOKUP; returns its ticket."""
    r.ready(b"w1", 1)
    r.accept("DEVICE_LOOKUP", **header_fields)
    r.dispatch()
    [(ticket, _, _)] = r.handed(b"w1")
    return ticket


# -- credit and dispatch ------------------------------------------------------------


def test_ready_announces_one_free_slot_per_credit_for_that_worker() -> None:
    r = room()
    r.ready(b"w1", 3)
    r.ready(b"w2", 2)
    assert list(r.dispatcher.free) == [b"w1"] * 3 + [b"w2"] * 2
    assert r.dispatcher.inflight == {}


def test_nothing_is_handed_out_without_a_free_slot() -> None:
    r = room()
    r.accept("DEVICE_LOOKUP")
    r.dispatch()
    assert r.batches == {}
    assert r.queue.depth == 1


def test_messages_are_handed_out_most_urgent_first_then_in_arrival_order() -> None:
    r = room()
    r.accept("DEVICE_LOOKUP", request_id=1)  # priority 2
    r.accept("SESSION_GET", request_id=2)  # priority 1
    r.accept("DEVICE_LOOKUP", request_id=3)  # priority 2
    r.accept("INFO", request_id=4)  # priority 0
    r.accept("SESSION_GET", request_id=5)  # priority 1
    r.ready(b"w1", 5)
    r.dispatch()
    assert [frame_request_id(h) for _, h, _ in r.handed(b"w1")] == [4, 2, 5, 1, 3]


def test_each_worker_is_handed_one_batch_per_dispatch_holding_all_its_messages() -> None:
    r = room()
    r.ready(b"w1", 2)
    r.ready(b"w2", 2)
    for rid in (1, 2, 3):
        r.accept("DEVICE_LOOKUP", request_id=rid)
    r.dispatch()
    assert [len(b) for b in r.batches[b"w1"]] == [2 * inproc.TO_WORKER]
    assert [len(b) for b in r.batches[b"w2"]] == [1 * inproc.TO_WORKER]
    assert list(r.dispatcher.free) == [b"w2"]
    assert r.slots_add_up()


def test_a_ticket_carries_the_holders_sequence_and_the_milliseconds_left_with_its_frames() -> None:
    r = room()
    message = frames("DEVICE_LOOKUP", lifetime_ms=1500)
    r.intake.accept(message, 10.0)
    r.ready(b"w1", 1)
    r.dispatch(now=10.5)
    [(ticket, h, b)] = r.handed(b"w1")
    holder = r.dispatcher.inflight[ticket]
    assert inproc.TICKET.unpack(ticket) == (holder.seq, 1000)
    assert (h, b) == (message[1], message[2])
    assert holder.worker == b"w1"


def test_a_message_whose_lifetime_ended_in_the_queue_is_answered_expired_at_dispatch() -> None:
    r = room()
    r.accept("DEVICE_LOOKUP", now=0.0, lifetime_ms=100, request_id=7)
    r.ready(b"w1", 1)
    r.dispatch(now=0.2)
    assert r.batches[b"w1"] == []
    sent = r.replies.only()
    assert sent.header.transport_error == TRANSPORT_ERROR["EXPIRED"]
    assert sent.header.request_id == 7
    assert sample(r.metrics.rejections, reason="expired") == 1
    assert list(r.dispatcher.free) == [b"w1"]  # the slot was never taken
    assert r.queue.running[type_id("DEVICE_LOOKUP")] == 0


def test_expire_answers_every_queued_message_past_its_deadline_and_keeps_the_others() -> None:
    r = room()
    r.accept("DEVICE_LOOKUP", lifetime_ms=100, request_id=1)
    r.accept("DEVICE_LOOKUP", lifetime_ms=5000, request_id=2)
    r.dispatcher.expire(now=1.0)
    assert [(s.header.request_id, s.body["error"]) for s in r.replies.sent] == [(1, "EXPIRED")]
    assert r.queue.depth == 1


# -- answers ------------------------------------------------------------------------------


def test_a_reply_is_sent_to_the_client_and_frees_its_slot_once() -> None:
    r = room()
    ticket = one_running(r, request_id=9)
    h, b = reply_frames(9)
    r.answer(b"w1", inproc.REPLY, ticket, h, b, now=0.3)
    sent = r.replies.only()
    assert (sent.envelope, sent.header_frame, sent.body_frame) == ([PEER], h, b)
    assert list(r.dispatcher.free) == [b"w1"]
    assert r.dispatcher.inflight == {}
    assert sample(r.metrics.duration, "_count", type="device_lookup") == 1
    assert r.slots_add_up()


def test_a_reply_to_a_no_reply_message_frees_its_slot_and_sends_nothing() -> None:
    r = room()
    ticket = one_running(r, flags=FLAG_NO_REPLY)
    r.answer(b"w1", inproc.REPLY, ticket, *reply_frames(1))
    assert r.replies.sent == []
    assert list(r.dispatcher.free) == [b"w1"]


def test_done_frees_its_slot_sends_nothing_and_observes_the_duration() -> None:
    r = room()
    ticket = one_running(r, flags=FLAG_NO_REPLY)
    r.answer(b"w1", inproc.DONE, ticket)
    assert r.replies.sent == []
    assert list(r.dispatcher.free) == [b"w1"]
    assert r.dispatcher.inflight == {}
    assert sample(r.metrics.duration, "_count", type="device_lookup") == 1


def test_fail_answers_the_workers_transport_error_and_frees_its_slot() -> None:
    r = room()
    ticket = one_running(r, request_id=4)
    r.answer(b"w1", inproc.FAIL, ticket, b"STORAGE_UNAVAILABLE", b"no leader")
    sent = r.replies.only()
    assert sent.header.transport_error == TRANSPORT_ERROR["STORAGE_UNAVAILABLE"]
    assert sent.header.flags == FLAG_DATA_ERROR
    assert sent.header.request_id == 4
    assert sent.body == {"status": STATUS["ERROR"], "error": "STORAGE_UNAVAILABLE", "message": "no leader"}
    assert sample(r.metrics.messages, type="device_lookup", outcome="storage_unavailable") == 1
    assert list(r.dispatcher.free) == [b"w1"]
    assert r.slots_add_up()


def test_a_workers_bad_body_answers_keep_the_intakes_bad_input_rate() -> None:
    """PROTOCOL.md 4: bad input is answered at most bad_input_per_peer_per_s a second per connection,
    whether the broker or a worker found it (COUNTER_GET's body is decoded by its worker)."""
    r = room(bad_input_per_peer_per_s=2, bad_input_per_s=100, workers=4)
    r.ready(b"w1", 4)
    for rid in range(1, 5):
        r.accept("DEVICE_LOOKUP", request_id=rid)
    r.dispatch()
    for ticket, _, _ in r.handed(b"w1"):
        r.answer(b"w1", inproc.FAIL, ticket, b"BAD_BODY", b"invalid msgpack")
    assert [s.header.transport_error for s in r.replies.sent] == [TRANSPORT_ERROR["BAD_BODY"]] * 2
    assert sample(r.metrics.bad_input_throttled) == 2
    assert r.slots_add_up()  # the unanswered ones gave their slots back too


def test_a_workers_other_failures_are_never_throttled() -> None:
    r = room(bad_input_per_peer_per_s=1, bad_input_per_s=1, workers=3)
    r.ready(b"w1", 3)
    for rid in range(1, 4):
        r.accept("DEVICE_LOOKUP", request_id=rid)
    r.dispatch()
    for ticket, _, _ in r.handed(b"w1"):
        r.answer(b"w1", inproc.FAIL, ticket, b"STORAGE_UNAVAILABLE", b"no leader")
    assert len(r.replies.sent) == 3


def test_an_answer_of_an_unknown_kind_is_answered_internal_and_frees_its_slot() -> None:
    r = room()
    ticket = one_running(r, request_id=5)
    r.answer(b"w1", b"?", ticket, b"x", b"y")
    sent = r.replies.only()
    assert sent.header.transport_error == TRANSPORT_ERROR["INTERNAL"]
    assert sent.header.request_id == 5
    assert list(r.dispatcher.free) == [b"w1"]
    assert r.dispatcher.inflight == {}


def test_a_batch_of_answers_frees_one_slot_per_ticket() -> None:
    r = room()
    r.ready(b"w1", 3)
    for rid in (1, 2, 3):
        r.accept("DEVICE_LOOKUP", request_id=rid)
    r.dispatch()
    t1, t2, t3 = (t for t, _, _ in r.handed(b"w1"))
    items = [inproc.REPLY, t1, *reply_frames(1), inproc.DONE, t2, b"", b"", inproc.FAIL, t3, b"EXPIRED", b"late"]
    r.dispatcher.take(b"w1", items, 0.1)
    assert list(r.dispatcher.free) == [b"w1"] * 3
    assert [s.header.request_id for s in r.replies.sent] == [1, 3]


def test_enqueue_from_a_worker_goes_through_the_intakes_door_into_the_queue() -> None:
    r = room()
    r.ready(b"w1", 1)
    internal = header("PREWARM_FETCH", request_id=1)
    r.dispatcher.take(b"w1", [inproc.ENQUEUE, internal, body({"client_id": "c-1", "data_type": 1}), b""], 0.0)
    [h] = r.queue.drain()
    assert (h.type_id, h.header, h.no_reply, h.envelope) == (type_id("PREWARM_FETCH"), internal, True, [])
    assert list(r.dispatcher.free) == [b"w1"]  # queueing takes no slot


def test_enqueue_from_a_worker_while_stopping_is_refused_by_the_intake() -> None:
    r = room()
    r.intake.stopping = True
    r.dispatcher.take(b"w1", [inproc.ENQUEUE, header("PREWARM_FETCH"), body(), b""], 0.0)
    assert r.queue.depth == 0
    assert sample(r.metrics.rejections, reason="shutting_down") == 1


# -- the watchdog -------------------------------------------------------------------------


def test_the_watchdog_leaves_a_slot_alone_until_its_deadline_plus_grace() -> None:
    r = room()
    one_running(r, lifetime_ms=2000)
    assert r.dispatcher.reclaim_overdue(now=2.0 + WATCHDOG_GRACE_S - 0.01) == 0
    assert r.replies.sent == []
    assert len(r.dispatcher.inflight) == 1


def test_the_watchdog_answers_outcome_unknown_and_takes_the_slot_back_once() -> None:
    r = room()
    one_running(r, lifetime_ms=2000, request_id=6)
    assert r.dispatcher.reclaim_overdue(now=2.0 + WATCHDOG_GRACE_S + 0.01) == 1
    sent = r.replies.only()
    assert sent.header.transport_error == TRANSPORT_ERROR["OUTCOME_UNKNOWN"]
    assert sent.header.request_id == 6
    assert sample(r.metrics.watchdog_reclaimed) == 1
    assert list(r.dispatcher.free) == [b"w1"]
    assert r.queue.running[type_id("DEVICE_LOOKUP")] == 0
    assert r.dispatcher.reclaim_overdue(now=10.0) == 0  # nothing left to reclaim
    assert r.slots_add_up()


def test_a_late_answer_to_a_reclaimed_ticket_frees_nothing_and_sends_nothing() -> None:
    r = room()
    ticket = one_running(r, lifetime_ms=2000)
    r.dispatcher.reclaim_overdue(now=5.0)
    r.answer(b"w1", inproc.REPLY, ticket, *reply_frames(1), now=5.1)
    assert len(r.replies.sent) == 1  # the watchdog's OUTCOME_UNKNOWN only
    assert list(r.dispatcher.free) == [b"w1"]
    assert r.slots_add_up()


def test_a_slot_the_watchdog_took_back_runs_the_next_message() -> None:
    r = room()
    one_running(r, lifetime_ms=2000)
    r.dispatcher.reclaim_overdue(now=5.0)
    r.accept("DEVICE_LOOKUP", now=5.0, request_id=2)
    r.dispatch(now=5.0)
    assert [frame_request_id(h) for _, h, _ in r.handed(b"w1")] == [1, 2]
    assert r.slots_add_up()


# -- the end of the drain ----------------------------------------------------------------


def test_finish_answers_queued_messages_shutting_down_and_running_ones_outcome_unknown() -> None:
    r = room()
    one_running(r, request_id=1)
    r.accept("DEVICE_LOOKUP", request_id=2)
    r.accept("DEVICE_LOOKUP", request_id=3, flags=FLAG_NO_REPLY)
    r.dispatcher.finish()
    answers = {s.header.request_id: s.body["error"] for s in r.replies.sent}
    assert answers == {1: "OUTCOME_UNKNOWN", 2: "SHUTTING_DOWN"}  # 3 wants no answer
    assert sample(r.metrics.rejections, reason="shutting_down") == 3
    assert r.queue.depth == 0
    assert r.dispatcher.inflight == {}


# -- slot accounting on every path ----------------------------------------------------------

#: what can happen next: a message arrives (DEVICE_LOOKUP or the more urgent SESSION_GET), the broker
#: dispatches, expires or runs its watchdog, time passes, or a worker answers one of its messages
#: (REPLY, DONE, FAIL or a kind the broker does not know); repeats weigh the draw
STEPS = st.tuples(
    st.sampled_from(["message", "urgent", "dispatch", "dispatch", "expire", "reclaim", "wait", "wait", "answer"]),
    st.sampled_from([inproc.REPLY, inproc.DONE, inproc.FAIL, b"?"]),
    st.integers(0, 3),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(STEPS, min_size=10, max_size=80))
def test_free_and_running_slots_always_add_up_to_the_slots_announced(steps: list[tuple[str, bytes, int]]) -> None:
    """Whatever happens (answers of every kind, expiry, the watchdog, late answers), no slot is lost or made
    up, and no message is answered twice."""
    r = room(queue_capacity=4)
    r.ready(b"w1", 2)
    r.ready(b"w2", 1)
    outstanding: list[tuple[bytes, bytes, int]] = []  # (worker, ticket, request id) not answered by the worker yet
    seen = {b"w1": 0, b"w2": 0}
    now, rid = 0.0, 0
    for step, kind, which in steps:
        now += 1.5 if step == "wait" else 0.05  # a message lives 2 s; the watchdog gives it 1 s more
        if step in ("message", "urgent"):
            rid += 1
            r.accept("DEVICE_LOOKUP" if step == "message" else "SESSION_GET", now=now, request_id=rid)
        elif step == "dispatch":
            r.dispatch(now)
            for wid in seen:
                handed = r.handed(wid)
                outstanding += [(wid, t, frame_request_id(h)) for t, h, _ in handed[seen[wid] :]]
                seen[wid] = len(handed)
        elif step == "expire":
            r.dispatcher.expire(now)
        elif step == "reclaim":
            r.dispatcher.reclaim_overdue(now)
        elif step == "answer" and outstanding:  # perhaps after the watchdog answered it
            wid, ticket, request_id = outstanding.pop(which % len(outstanding))
            a, b = reply_frames(request_id) if kind == inproc.REPLY else (b"EXPIRED", b"late")
            r.answer(wid, kind, ticket, a, b, now=now)
        assert r.slots_add_up(), step
    answered = [s.header.request_id for s in r.replies.sent]
    assert len(answered) == len(set(answered))
