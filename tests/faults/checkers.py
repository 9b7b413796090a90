"""Checkers: a history and the final state in, what was lost or impossible out. Pure functions.

"Lost" is always about acknowledged writes (outcome ok): an unknown write may
or may not be in the final state, a failed one must not be.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tests.faults.history import FAIL, OK, UNKNOWN, Op

#: workloads on synchronous spaces: what "0 acknowledged writes lost" is about
SYNC_WORKLOADS = ("set", "register", "counter")
SAMPLE = 5  # how many offending ids a report shows
#: a pause between acknowledged writes shorter than this is not an outage (about 100 times the usual spacing)
NO_OUTAGE_S = 0.5


@dataclass
class Verdict:
    """One workload's result: acknowledged writes lost, and anomalies (things that cannot happen)."""

    workload: str
    acked: int = 0
    lost: list[Any] = field(default_factory=list)
    anomalies: dict[str, list[Any]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def anomaly(self, name: str, items: Iterable[Any]) -> None:
        items = list(items)
        if items:
            self.anomalies[name] = items

    def as_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "acked": self.acked,
            "lost": len(self.lost),
            "lost_sample": self.lost[:SAMPLE],
            "anomalies": {k: {"count": len(v), "sample": v[:SAMPLE]} for k, v in self.anomalies.items()},
            **self.info,
        }


def counts(ops: Iterable[Op], workloads: tuple[str, ...] = SYNC_WORKLOADS) -> dict[str, int]:
    """ok / fail / unknown over the writes of these workloads."""
    c = Counter(op.outcome for op in ops if op.workload in workloads)
    return {OK: c[OK], FAIL: c[FAIL], UNKNOWN: c[UNKNOWN]}


def _by_outcome(ops: Iterable[Op], workload: str) -> dict[str, list[Op]]:
    out: dict[str, list[Op]] = {OK: [], FAIL: [], UNKNOWN: []}
    for op in ops:
        if op.workload == workload:
            out[op.outcome].append(op)
    return out


def check_set(ops: Iterable[Op], present: set[str], workload: str = "set") -> Verdict:
    """Every acknowledged element is present; no failed one is."""
    by = _by_outcome(ops, workload)
    v = Verdict(workload, acked=len(by[OK]))
    v.lost = sorted(op.value for op in by[OK] if op.value not in present)
    v.anomaly("failed_but_present", sorted(op.value for op in by[FAIL] if op.value in present))
    v.info["unknown_present"] = sum(1 for op in by[UNKNOWN] if op.value in present)
    v.info["unknown_absent"] = sum(1 for op in by[UNKNOWN] if op.value not in present)
    return v


def check_register(ops: Iterable[Op], finals: dict[str, tuple[int, list[int]] | None]) -> Verdict:
    """Each hot session's final log is the chain of applied updates: rev r holds the op at log[r - 2].

    finals: session id -> (final rev, final log), None for a session that is gone.
    Lost: an acknowledged update not at its position. Anomalies: two acknowledged
    updates with the same rev, a failed update in the log, an op twice in a log,
    a rev that does not match the log's length.
    """
    by = _by_outcome(ops, "register")
    v = Verdict("register", acked=len(by[OK]))
    revs: Counter[tuple[str, int]] = Counter((op.key, op.result) for op in by[OK])
    v.anomaly("same_rev_acknowledged_twice", sorted(f"{sid}@{rev}" for (sid, rev), n in revs.items() if n > 1))
    for op in by[OK]:
        final = finals.get(op.key)
        if final is None:
            v.lost.append(op.value)
            continue
        _, log = final
        i = int(op.result) - 2
        if not 0 <= i < len(log) or log[i] != op.value:
            v.lost.append(op.value)
    # Why an acknowledged update is missing: the acknowledged update of the next revision read another
    # value at this revision (the revision was reused: the value it read was rolled back, an ABA).
    by_rev = {(op.key, op.result): op for op in by[OK]}
    v.anomaly(
        "cas_matched_a_reused_revision",
        sorted(
            f"{op.value}@{op.result} overwritten by {nxt.value}, which read {nxt.meta.get('prev')}"
            for op in by[OK]
            if op.value in v.lost
            and (nxt := by_rev.get((op.key, int(op.result) + 1))) is not None
            and "prev" in nxt.meta
            and nxt.meta["prev"] != op.value
        ),
    )
    in_logs = {x for f in finals.values() if f is not None for x in f[1]}
    v.anomaly("failed_but_in_chain", sorted(op.value for op in by[FAIL] if op.value in in_logs))
    for sid, final in finals.items():
        if final is None:
            continue
        rev, log = final
        v.anomaly(f"op_twice_in_chain:{sid}", [x for x, n in Counter(log).items() if n > 1])
        if rev != len(log) + 1:
            v.anomalies.setdefault("rev_is_not_chain_length", []).append(f"{sid}: rev {rev}, log {len(log)}")
    v.info["chain_lengths"] = [len(f[1]) if f else None for f in finals.values()]
    v.info["unknown_in_chain"] = sum(1 for op in by[UNKNOWN] if op.value in in_logs)
    return v


def check_counter(ops: Iterable[Op], final: int | None) -> Verdict:
    """acknowledged <= final <= acknowledged + unknown; acknowledged adds returned distinct values <= final."""
    by = _by_outcome(ops, "counter")
    v = Verdict("counter", acked=len(by[OK]))
    value = final or 0
    values = [int(op.result) for op in by[OK]]
    seen = Counter(values)
    dups = sorted(x for x, n in seen.items() if n > 1)
    above = sorted(x for x in values if x > value)
    # each of these says acknowledged adds are missing from the final value
    lost_n = max(len(values) - value, len(above), sum(n - 1 for n in seen.values()), 0)
    v.lost = [*above, *(["an acknowledged add"] * (lost_n - len(above)))]
    v.anomaly("acknowledged_same_value_twice", dups)
    v.anomaly("more_applied_than_sent", [value] if value > len(values) + len(by[UNKNOWN]) else [])
    v.info["final"] = final
    v.info["unknown"] = len(by[UNKNOWN])
    return v


def ok_write_times(ops: Iterable[Op], workloads: tuple[str, ...] = SYNC_WORKLOADS) -> list[tuple[float, float]]:
    """(invoked, completed) of acknowledged writes, by completion."""
    done = [(op.invoked, op.completed) for op in ops if op.workload in workloads and op.outcome == OK]
    return sorted(done, key=lambda x: x[1])


def longest_write_gap(ops: Iterable[Op], t0: float, t1: float) -> tuple[float, float]:
    """The longest time between t0 and t1 with no acknowledged write completing (t0 and t1 count as ends):
    (its length, when it ended)."""
    points = [t0, *(c for _, c in ok_write_times(ops) if t0 < c < t1), t1]
    gap, end = max((b - a, b) for a, b in itertools.pairwise(points))
    return gap, end


def recovery_s(ops: Iterable[Op], fault: float, since: float, end: float) -> float:
    """From `since` (the fault, or the repair the cluster needed) to the end of the longest write outage
    after the fault; 0 when writes never paused for NO_OUTAGE_S."""
    gap, gap_end = longest_write_gap(ops, fault, end)
    return 0.0 if gap < NO_OUTAGE_S else max(0.0, gap_end - since)
