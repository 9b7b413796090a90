"""The linearizability checker accepts what a correct object may answer and rejects what it may not."""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import pytest

from tests.faults import linear
from tests.faults.history import FAIL, OK
from tests.faults.history import UNKNOWN as OUTCOME_UNKNOWN
from tests.faults.history import Op as FaultOp
from tests.faults.linear import check_linearizable
from tests.linearizability import (
    CONFLICT,
    UNKNOWN,
    Op,
    TooLargeError,
    _cut,
    check,
    counter_step,
    indeterminate,
    linearizable,
    register_step,
    session_step,
    synthetic,
)


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


# -- indeterminate operations (a fault history's timeouts) ----------------------------------------


def unknown(client: int, invoked: float, kind: str, args: tuple[Any, ...]) -> Op:
    return indeterminate(client, invoked, kind, args)


START = (1, None)  # a hot session: rev 1, empty log


def test_an_indeterminate_update_that_took_effect_is_accepted() -> None:
    h = [unknown(0, 0, "update", (1, 10)), op(1, 5, 6, "read", (), (2, 10)), op(1, 7, 8, "update", (2, 11), 3)]
    assert linearizable(h, START, session_step)


def test_an_indeterminate_update_that_never_took_effect_is_accepted() -> None:
    h = [unknown(0, 0, "update", (1, 10)), op(1, 5, 6, "read", (), START), op(1, 7, 8, "update", (1, 11), 2)]
    assert linearizable(h, START, session_step)
    assert linearizable([unknown(0, 0, "add", (1,)), op(1, 5, 6, "get", (), 0)], 0, counter_step)


def test_an_indeterminate_op_may_take_effect_long_after_it_was_invoked() -> None:
    h = [unknown(0, 0, "update", (1, 10)), op(1, 5, 6, "read", (), START), op(1, 50, 51, "read", (), (2, 10))]
    assert linearizable(h, START, session_step)
    c = [unknown(0, 0, "add", (1,)), op(1, 5, 6, "add", (1,), 1), op(1, 50, 51, "add", (1,), 3)]
    assert linearizable(c, 0, counter_step)


def test_an_indeterminate_op_cannot_take_effect_before_it_was_invoked() -> None:
    assert not linearizable([op(1, 0, 1, "read", (), (2, 10)), unknown(0, 2, "update", (1, 10))], START, session_step)


def test_a_conflict_is_accepted_only_at_another_revision() -> None:
    assert not linearizable([op(0, 0, 1, "update", (1, 10), CONFLICT)], START, session_step)
    h = [op(0, 0, 1, "update", (1, 10), 2), op(1, 2, 3, "update", (1, 11), CONFLICT)]
    assert linearizable(h, START, session_step)


def test_many_alike_indeterminate_adds_do_not_blow_up_the_search() -> None:
    """30 unknown adds pending together, 5 of them applied: 31 counts matter, not 2^30 sets."""
    h = [unknown(i, i * 0.1, "add", (1,)) for i in range(30)]
    h += [op(99, 10 + k, 10.5 + k, "get", (), 5) for k in range(20)]
    assert check(h, 0, counter_step).states < 1_000


def test_a_budget_of_states_stops_the_search() -> None:
    with pytest.raises(TooLargeError):
        check(synthetic("session", 400, 4, 0.05), START, session_step, max_states=100)


# -- what a failure says --------------------------------------------------------------------------


def sequential_updates(n: int) -> list[Op]:
    """n acknowledged updates, one after the other, each read back: the quiet history before a failure."""
    h = []
    for k in range(n):
        h += [
            op(9, 10 * k, 10 * k + 1, "update", (k + 1, k), k + 2),
            op(8, 10 * k + 2, 10 * k + 3, "read", (), (k + 2, k)),
        ]
    return h


def test_an_acknowledged_update_lost_is_rejected_and_its_window_names_both_updates() -> None:
    """The update to rev 7 was acknowledged; a later update from the same revision 6 succeeded too."""
    h = sequential_updates(5)  # ends at (6, 4), t=43
    h += [op("a", 50, 51, "update", (6, 100), 7), op("b", 52, 53, "update", (6, 200), 7)]
    h += [op("c", 54 + k, 54.5 + k, "read", (), (7, 200)) for k in range(10)]
    r = check(h, START, session_step)
    assert not r.ok
    assert r.failing == [h[-11]]
    assert r.window == [h[-12], h[-11]]
    assert r.prefix == len(h) - 10
    assert r.before == [(7, 100)]
    text = r.describe()
    assert "! b" in text
    assert "update(6, 100) -> 7" in text
    assert "update(6, 200) -> 7" in text
    assert "read()" not in text


def test_a_read_of_an_update_later_rolled_back_is_rejected() -> None:
    """A read saw the indeterminate update; a later one saw the revision before it again."""
    h = [
        *sequential_updates(3),  # (4, 2) at t=23
        unknown("a", 30, "update", (4, 100)),
        op("b", 31, 32, "read", (), (5, 100)),
        op("c", 33, 34, "read", (), (4, 2)),
        op("a", 40, 41, "update", (4, 101), 5),
    ]
    r = check(h, START, session_step)
    assert not r.ok
    assert r.failing == [h[-2]]
    assert r.window == [h[-4], h[-3], h[-2]]
    assert r.before == [(5, 100)]
    assert "update(4, 100) -> ?" in r.describe()


def test_a_counter_value_answered_twice_is_rejected() -> None:
    h = [op(0, 2 * k, 2 * k + 1, "add", (1,), k + 1) for k in range(10)]
    h += [op(1, 20, 23, "add", (1,), 11), op(2, 21, 22, "add", (1,), 11), op(0, 24, 25, "add", (1,), 12)]
    r = check(h, 0, counter_step)
    assert not r.ok
    assert r.failing == [h[10]]
    assert set(r.window) == {h[9], h[10], h[11]}  # the last before (10), and the two that answered 11
    assert r.before == [10]
    assert r.describe().count("add(1) -> 11") == 2


def test_a_linearizable_history_says_so() -> None:
    r = check(sequential_updates(3), START, session_step)
    assert r.ok
    assert r.window == []
    assert r.describe().startswith("linearizable")


# -- the search against brute force --------------------------------------------------------------


def brute_force(history: list[Op], initial: Any, step: Any, *, every: bool = False) -> set[Any]:
    """The end states of orders of every determinate op and any subset of the indeterminate ones, in every order
    real time allows (only the first found unless ``every``)."""
    sure = [o for o in history if not o.indeterminate]
    maybe = [o for o in history if o.indeterminate]
    ends = set()
    for r in range(len(maybe) + 1):
        for extra in itertools.combinations(maybe, r):
            for order in itertools.permutations([*sure, *extra]):
                if any(b.answered < a.invoked for i, a in enumerate(order) for b in order[i + 1 :]):
                    continue
                state = initial
                for o in order:
                    state = step(state, o)
                    if state is None:
                        break
                else:
                    ends.add(state)
                    if not every:
                        return ends
    return ends


def random_history(rng: random.Random, model: str) -> list[Op]:
    """Up to 6 ops on a small grid of times (ties included), results plausible enough that some pass."""
    h: list[Op] = []
    for k in range(rng.randint(1, 6)):
        t = rng.randint(0, 6)
        end = t + rng.randint(0, 4)
        if model == "counter":
            kind, args, result = rng.choice([("add", (1,), rng.choice([UNKNOWN, 1, 2, 3])), ("get", (), 1)])
        elif rng.random() < 0.4:
            rev = rng.randint(1, 3)
            written = [o.args[1] for o in h if o.kind == "update"]
            kind, args, result = "read", (), (rev, None if rev == 1 or not written else rng.choice(written))
        else:
            expected = rng.randint(1, 3)
            kind, args, result = "update", (expected, k), rng.choice([UNKNOWN, CONFLICT, expected + 1])
        h.append(unknown(k, t, kind, args) if result is UNKNOWN else op(k, t, end, kind, args, result))
    return h


@pytest.mark.parametrize("model", ["session", "counter"])
def test_the_search_and_its_failing_prefix_agree_with_brute_force(model: str) -> None:
    rng = random.Random(35)
    initial, step = (START, session_step) if model == "session" else (0, counter_step)
    verdicts = []
    for _ in range(400):
        h = random_history(rng, model)
        r = check(h, initial, step)
        assert r.ok == bool(brute_force(h, initial, step)), h
        verdicts.append(r.ok)
        if not r.ok:  # the prefix ending at the failing answer has no order, the one before it has
            t = r.failing[0].answered
            earlier = [o.answered for o in h if not o.indeterminate and o.answered < t]
            assert not brute_force(_cut(h, t), initial, step)
            assert not earlier or brute_force(_cut(h, max(earlier)), initial, step)
            began = min(o.invoked for o in r.failing)
            assert set(r.before) == brute_force(_cut(h, math.nextafter(began, -math.inf)), initial, step, every=True)
    assert 40 < sum(verdicts) < 360, sum(verdicts)  # both kinds were tried


def test_synthetic_fault_sized_histories_pass() -> None:
    assert check(synthetic("session", 400, 4, 0.05), START, session_step).ok
    assert check(synthetic("counter", 2000, 2, 0.05), 0, counter_step).ok


# -- the fault suite's histories (tests/faults/linear.py) -----------------------------------------


def fault_op(process: str, workload: str, key: str, t: tuple[float, float], outcome: str, **kw: Any) -> FaultOp:
    """A fault-suite op; ``expected`` goes to meta["expected_rev"]."""
    meta = {"expected_rev": kw.pop("expected")} if "expected" in kw else {}
    value = kw.pop("value", 1 if workload == "counter" else None)
    return FaultOp(process, "s1", workload, key, value, t[0], t[1], outcome, meta=meta, **kw)


def fault_history() -> list[FaultOp]:
    """Session "a" and counter "n", with answers ok, refused (left out), CONFLICT and unknown."""
    return [
        fault_op("r1", "read", "a", (0, 1), OK, result=(1, None)),
        fault_op("r1", "register", "a", (2, 3), OK, result=2, expected=1, value=101),
        fault_op("r2", "read", "a", (4, 5), OK, result=(2, 101)),
        fault_op("r2", "register", "a", (6, 9), OUTCOME_UNKNOWN, error="TIMEOUT", expected=2, value=201),
        fault_op("r3", "register", "a", (7, 8), FAIL, error="STORAGE_UNAVAILABLE", expected=2, value=301),
        fault_op("r1", "read", "a", (10, 11), FAIL, error="TIMEOUT"),
        fault_op("r1", "read", "a", (12, 13), OK, result=[2, 101]),  # as read back from history.jsonl
        fault_op("r3", "register", "a", (14, 15), FAIL, error="CONFLICT", expected=1, value=302),
        fault_op("r3", "read", "a", (16, 17), OK, result=(3, 201)),  # the unknown update, applied late
        fault_op("c1", "counter", "n", (0, 1), OK, result=1),
        fault_op("c1", "counter", "n", (2, 5), OUTCOME_UNKNOWN, error="OUTCOME_UNKNOWN"),
        fault_op("c2", "counter", "n", (3, 4), FAIL, error="STORAGE_UNAVAILABLE"),
        fault_op("c2", "counter", "n", (6, 7), OK, result=3),
    ]


def test_a_fault_history_with_unknown_and_refused_ops_is_linearizable() -> None:
    v = check_linearizable(fault_history(), "n")
    assert v.workload == "linearizable"
    assert v.anomalies == {}
    assert v.info["not_checked"] == []
    assert {k: v.info["checked"]["session a"][k] for k in ("ops", "unknown", "ok")} == {
        "ops": 7,
        "unknown": 1,
        "ok": True,
    }
    assert v.info["checked"]["counter n"]["ops"] == 3
    assert v.acked == 3  # two adds and one update acknowledged


def test_a_fault_history_that_reads_a_lost_update_is_not_linearizable() -> None:
    """An acknowledged update, then a read of the revision before it, and a counter value answered twice."""
    h = [
        *fault_history(),
        fault_op("r2", "read", "a", (20, 21), OK, result=(2, 101)),
        fault_op("c1", "counter", "n", (8, 9), OK, result=3),
    ]
    v = check_linearizable(h, "n")
    session, counter = v.anomalies["not_linearizable"]
    assert session.startswith("session a: not linearizable")
    assert "! r2" in session
    assert "read() -> (2, 101)" in session
    assert "read() -> (3, 201)" in session
    assert counter.startswith("counter n: not linearizable")
    assert "! c1" in counter


def test_a_key_too_large_to_search_is_reported_as_not_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear, "MAX_STATES", 2)
    v = check_linearizable(fault_history(), "n")
    assert v.anomalies == {}
    assert len(v.info["not_checked"]) == 2
    assert "session a: not checked: too large" in v.info["not_checked"][0]
