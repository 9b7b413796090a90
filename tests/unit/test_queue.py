"""The priority queue: order, capacity, eviction, expiry, bulkheads."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smartcache.server.broker.queue import Holder, PriorityQueue, QueueFull

URGENT, NORMAL, LOW = 1, 2, 3  # type ids
PRIORITIES = {URGENT: 0, NORMAL: 1, LOW: 3}


def make_queue(capacity: int = 10, limits: dict[int, int] | None = None) -> PriorityQueue:
    return PriorityQueue(capacity=capacity, priorities=PRIORITIES, limits=limits or dict.fromkeys(PRIORITIES, 100))


_seq = iter(range(10**9))


def holder(type_id: int, deadline: float = 100.0) -> Holder:
    seq = next(_seq)
    return Holder(
        seq=seq,
        priority=PRIORITIES[type_id],
        type_id=type_id,
        arrived=0.0,
        deadline=deadline,
        envelope=[b"id"],
        header=b"",
        body=b"",
        no_reply=False,
    )


def test_most_urgent_first_then_fifo() -> None:
    q = make_queue()
    low1, norm1, low2, urg, norm2 = holder(LOW), holder(NORMAL), holder(LOW), holder(URGENT), holder(NORMAL)
    for h in (low1, norm1, low2, urg, norm2):
        q.push(h)
    assert [q.pop_ready() for _ in range(5)] == [urg, norm1, norm2, low1, low2]
    assert q.pop_ready() is None


def test_full_queue_refuses_equal_or_more_urgent_is_not_evicted() -> None:
    q = make_queue(capacity=2)
    q.push(holder(URGENT))
    q.push(holder(URGENT))
    with pytest.raises(QueueFull):
        q.push(holder(URGENT))
    assert len(q) == 2


def test_more_urgent_message_evicts_the_newest_least_urgent() -> None:
    q = make_queue(capacity=3)
    old_low, norm, new_low = holder(LOW), holder(NORMAL), holder(LOW)
    for h in (old_low, norm, new_low):
        q.push(h)
    urgent = holder(URGENT)
    assert q.push(urgent) is new_low
    assert len(q) == 3
    assert [q.pop_ready() for _ in range(3)] == [urgent, norm, old_low]


def test_expired_holders_leave_and_are_never_dispatched() -> None:
    q = make_queue()
    soon, later = holder(NORMAL, deadline=1.0), holder(NORMAL, deadline=5.0)
    q.push(soon)
    q.push(later)
    assert q.next_deadline() == 1.0
    assert list(q.expire(2.0)) == [soon]
    assert len(q) == 1
    assert q.pop_ready() is later
    assert q.next_deadline() is None


def test_bulkhead_holds_a_type_back_but_lets_others_pass() -> None:
    q = make_queue(limits={URGENT: 1, NORMAL: 100, LOW: 100})
    u1, u2, n = holder(URGENT), holder(URGENT), holder(NORMAL)
    for h in (u1, u2, n):
        q.push(h)
    assert q.pop_ready() is u1
    assert q.pop_ready() is n  # u2 waits: one URGENT already running
    assert q.pop_ready() is None
    q.done(u1)
    assert q.pop_ready() is u2


def test_drain_returns_everything_queued_in_arrival_order() -> None:
    q = make_queue()
    hs = [holder(t) for t in (LOW, URGENT, NORMAL)]
    for h in hs:
        q.push(h)
    assert list(q.drain()) == hs
    assert len(q) == 0
    assert q.pop_ready() is None


@given(
    st.lists(st.tuples(st.sampled_from([URGENT, NORMAL, LOW]), st.floats(0, 10)), max_size=60),
    st.integers(1, 20),
    st.floats(0, 10),
)
def test_depth_never_exceeds_capacity_and_every_holder_leaves_once(
    ops: list[tuple[int, float]], capacity: int, now: float
) -> None:
    q = make_queue(capacity=capacity)
    out: list[Holder] = []
    for type_id, deadline in ops:
        h = holder(type_id, deadline)
        try:
            victim = q.push(h)
        except QueueFull:
            out.append(h)
            continue
        if victim is not None:
            out.append(victim)
        assert len(q) <= capacity
    out.extend(q.expire(now))
    while (h := q.pop_ready()) is not None:
        assert h.deadline > now
        out.append(h)
    assert len(q) == 0
    assert sorted(h.seq for h in out) == sorted({h.seq for h in out})
    assert len(out) == len(ops)
