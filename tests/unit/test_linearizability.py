"""The linearizability checker accepts what a correct object may answer and rejects what it may not."""

from __future__ import annotations

from typing import Any

from tests.linearizability import Op, counter_step, linearizable, register_step


def op(*fields: Any) -> Op:
    """Op(client, invoked, answered, kind, args, result)."""
    return Op(*fields)


def test_sequential_adds_and_a_get_are_linearizable() -> None:
    h = [op(0, 0, 1, "add", (1,), 1), op(0, 2, 3, "add", (1,), 2), op(1, 4, 5, "get", (), 2)]
    assert linearizable(h, 0, counter_step)


def test_concurrent_adds_may_come_back_in_either_order() -> None:
    h = [op(0, 0, 10, "add", (1,), 2), op(1, 1, 9, "add", (1,), 1)]
    assert linearizable(h, 0, counter_step)


def test_a_read_of_a_value_never_written_is_rejected() -> None:
    assert not linearizable([op(0, 0, 1, "add", (1,), 1), op(1, 2, 3, "get", (), 5)], 0, counter_step)


def test_a_stale_read_after_the_write_answered_is_rejected() -> None:
    """The write was answered before the read began: reading the old value breaks real-time order."""
    h = [op(0, 0, 1, "add", (1,), 1), op(1, 2, 3, "get", (), 0)]
    assert not linearizable(h, 0, counter_step)


def test_a_read_concurrent_with_the_write_may_see_either_value() -> None:
    assert linearizable([op(0, 0, 5, "add", (1,), 1), op(1, 1, 2, "get", (), 0)], 0, counter_step)
    assert linearizable([op(0, 0, 5, "add", (1,), 1), op(1, 1, 2, "get", (), 1)], 0, counter_step)


def test_two_successful_cas_from_the_same_value_are_rejected() -> None:
    h = [op(0, 0, 5, "cas", (0, 1), (True, 1)), op(1, 0, 5, "cas", (0, 2), (True, 2))]
    assert not linearizable(h, 0, counter_step)


def test_a_failed_cas_must_report_the_current_value() -> None:
    good = [op(0, 0, 1, "add", (3,), 3), op(1, 2, 3, "cas", (0, 9), (False, 3))]
    bad = [op(0, 0, 1, "add", (3,), 3), op(1, 2, 3, "cas", (0, 9), (False, 7))]
    assert linearizable(good, 0, counter_step)
    assert not linearizable(bad, 0, counter_step)


def test_register_revisions_must_follow_one_order() -> None:
    ok = [op(0, 0, 4, "write", ("a",), 1), op(1, 1, 3, "write", ("b",), 2), op(2, 5, 6, "get", (), (2, "b"))]
    assert linearizable(ok, (0, None), register_step)
    lost_write = [op(0, 0, 1, "write", ("a",), 1), op(1, 2, 3, "write", ("b",), 1)]
    assert not linearizable(lost_write, (0, None), register_step)
    wrong_value = [op(0, 0, 1, "write", ("a",), 1), op(1, 2, 3, "get", (), (1, "b"))]
    assert not linearizable(wrong_value, (0, None), register_step)


def test_a_long_concurrent_history_is_checked_quickly() -> None:
    """8 clients, 400 overlapping adds, each neighbouring pair answered in swapped order: the cache keeps the
    search small."""
    h = [op(i % 8, i, i + 7.5, "add", (1,), i + 2 if i % 2 == 0 else i) for i in range(400)]
    assert linearizable(h, 0, counter_step)
    h[-1] = op(399 % 8, 399, 406.5, "add", (1,), 401)  # one value too many: no order gives it
    assert not linearizable(h, 0, counter_step)
