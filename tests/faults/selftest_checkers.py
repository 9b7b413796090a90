"""The checkers find what they are for: a checker that never finds anything proves nothing.

Run by `make test-faults` before the scenarios (pytest -o python_files=selftest_*.py);
`make test` does not collect this directory.
"""

from __future__ import annotations

from typing import Any

from tests.faults.checkers import (
    check_counter,
    check_register,
    check_set,
    counts,
    longest_write_gap,
    recovery_s,
)
from tests.faults.history import FAIL, OK, UNKNOWN, Op
from tests.faults.report import line, table


def op(workload: str, value: Any, outcome: str, *, key: str = "k", result: Any = None, t: float = 0.0) -> Op:
    return Op("p", "s1", workload, key, value, invoked=t, completed=t + 0.01, outcome=outcome, result=result)


def test_set_every_acknowledged_element_present_passes() -> None:
    ops = [op("set", "a", OK), op("set", "b", UNKNOWN), op("set", "c", FAIL)]
    v = check_set(ops, {"a", "b"})
    assert (v.acked, v.lost, v.anomalies) == (1, [], {})
    assert v.info == {"unknown_present": 1, "unknown_absent": 0}


def test_set_finds_a_lost_acknowledged_element_and_a_failed_one_that_is_there() -> None:
    v = check_set([op("set", "a", OK), op("set", "c", FAIL)], {"c"})
    assert v.lost == ["a"]
    assert v.anomalies == {"failed_but_present": ["c"]}


def _chain(*acked: tuple[int, int], failed: tuple[int, ...] = (), unknown: tuple[int, ...] = ()) -> list[Op]:
    ops = [op("register", value, OK, key="s", result=rev) for value, rev in acked]
    ops += [op("register", value, FAIL, key="s") for value in failed]
    ops += [op("register", value, UNKNOWN, key="s") for value in unknown]
    return ops


def test_register_a_whole_chain_passes() -> None:
    # rev 1 is the create (empty log); op 10 made rev 2, op 11 (unknown to its client) rev 3, op 12 rev 4
    v = check_register(_chain((10, 2), (12, 4), failed=(13,), unknown=(11,)), {"s": (4, [10, 11, 12])})
    assert (v.acked, v.lost, v.anomalies) == (2, [], {})
    assert v.info["unknown_in_chain"] == 1


def test_register_finds_an_acknowledged_write_overwritten_at_its_revision() -> None:
    # op 11 was acknowledged at rev 3, but the chain has op 12 there: 11 was lost (and 12 took its rev)
    v = check_register(_chain((10, 2), (11, 3)), {"s": (3, [10, 12])})
    assert v.lost == [11]


def test_register_explains_a_loss_by_a_revision_reused_after_a_rollback() -> None:
    # 10 acknowledged at rev 2; 12 acknowledged at rev 3 had read 11 at rev 2 (a write rolled back later)
    ops = _chain((10, 2), (12, 3), failed=(11,))
    ops[1].meta["prev"] = 11
    v = check_register(ops, {"s": (3, [11, 12])})
    assert v.lost == [10]
    assert v.anomalies["cas_matched_a_reused_revision"] == ["10@2 overwritten by 12, which read 11"]
    assert v.anomalies["failed_but_in_chain"] == [11]


def test_register_finds_two_acknowledged_writes_with_one_revision() -> None:
    v = check_register(_chain((10, 2), (11, 2)), {"s": (2, [11])})
    assert v.lost == [10]
    assert "same_rev_acknowledged_twice" in v.anomalies


def test_register_finds_a_failed_write_in_the_chain_and_a_chain_longer_than_its_revision() -> None:
    v = check_register(_chain((10, 2), failed=(11,)), {"s": (2, [10, 11])})
    assert v.anomalies["failed_but_in_chain"] == [11]
    assert v.anomalies["rev_is_not_chain_length"] == ["s: rev 2, log 2"]


def test_register_a_session_that_is_gone_loses_every_acknowledged_write() -> None:
    v = check_register(_chain((10, 2), (11, 3)), {"s": None})
    assert sorted(v.lost) == [10, 11]


def test_counter_between_acknowledged_and_acknowledged_plus_unknown_passes() -> None:
    ops = [op("counter", 1, OK, result=1), op("counter", 1, OK, result=3), op("counter", 1, UNKNOWN)]
    v = check_counter(ops, 3)
    assert (v.lost, v.anomalies) == ([], {})


def test_counter_below_the_acknowledged_count_has_lost_adds() -> None:
    ops = [op("counter", 1, OK, result=1), op("counter", 1, OK, result=2), op("counter", 1, OK, result=3)]
    assert len(check_counter(ops, 2).lost) == 1


def test_counter_two_adds_acknowledged_with_one_value_lost_one() -> None:
    # final 2 = two adds, but the acknowledged ones returned 2, 2: one of them is not in the value
    ops = [op("counter", 1, OK, result=1), op("counter", 1, OK, result=2), op("counter", 1, OK, result=2)]
    v = check_counter(ops, 3)
    assert len(v.lost) == 1
    assert v.anomalies == {"acknowledged_same_value_twice": [2]}


def test_counter_above_what_was_sent_is_an_anomaly() -> None:
    v = check_counter([op("counter", 1, OK, result=1), op("counter", 1, FAIL)], 2)
    assert v.anomalies == {"more_applied_than_sent": [2]}


def test_counts_and_gaps_are_about_acknowledged_writes() -> None:
    ops = [op("set", "a", OK, t=1.0), op("set", "b", OK, t=5.0), op("read", "x", OK, t=2.0), op("set", "c", FAIL)]
    assert counts(ops) == {"ok": 2, "fail": 1, "unknown": 0}
    gap, ended = longest_write_gap(ops, 0.0, 6.0)
    assert (round(gap, 2), ended) == (4.0, 5.01)  # 1.01 -> 5.01
    assert round(recovery_s(ops, 0.5, 0.5, 6.0), 2) == 4.51  # from the fault to the end of the outage
    assert round(recovery_s(ops, 0.5, 3.0, 6.0), 2) == 2.01  # from a repair
    steady = [op("set", str(i), OK, t=1.0 + i * 0.2) for i in range(4)]
    assert recovery_s(steady, 1.0, 1.0, 1.7) == 0.0  # never 0.5 s without an acknowledged write: no outage


def test_report_line_and_table_show_a_failure() -> None:
    r = {
        "scenario": "x",
        "ops": {"ok": 1, "fail": 2, "unknown": 3},
        "acknowledged_lost": 4,
        "max_writable": 2,
        "write_gap_s": 1.5,
        "recovery_s": None,
        "recovery_from": "repair",
        "passed": False,
        "checks": [{"name": "c", "ok": False, "detail": ""}],
    }
    assert "ops ok 1 / failed 2 / unknown 3, acknowledged lost 4, max writable at once 2" in line(r)
    assert line(r).endswith("FAIL (1)")
    assert table([r]).splitlines()[2] == "| x | 1 / 2 / 3 | 4 | 2 | 1.5 | — (from repair) | **FAIL** |"
