"""A linearizability checker for histories of one object (Wing & Gong's search, Lowe's memoisation).

A history is the operations concurrent clients ran, each with the (monotonic)
times it was invoked and answered, its arguments and its result. It is
linearizable when there is one total order of all operations that (1)
respects real time: an operation answered before another was invoked comes
first, and (2) replays through the object's sequential model giving each
operation the result it really got. The search tries, at each step, every
operation that may come next (one whose invocation precedes every pending
answer), and backtracks; a cache of (operations done, model state) visited
keeps it polynomial in practice (porcupine, knossos do the same).

Every operation must have been answered: a test that saw a transport error
fails before it checks.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Op:
    """One answered operation: what was asked (``kind``, ``args``), what came back, and when."""

    client: int
    invoked: float
    answered: float
    kind: str
    args: tuple[Any, ...]
    result: Any


#: model: (state, op) -> the state after op, or None when op could not have given its result in that state
Step = Callable[[Hashable, Op], Hashable | None]


class _Entry:
    __slots__ = ("is_call", "match", "next", "op", "prev")

    def __init__(self, op: int, is_call: bool) -> None:
        self.op, self.is_call = op, is_call
        self.prev: _Entry | None = None
        self.next: _Entry | None = None
        self.match: _Entry | None = None  # a call's return entry


def _entries(history: Sequence[Op]) -> _Entry:
    """A doubly linked list of call and return events in time order, behind a sentinel head."""
    events = []
    for i, op in enumerate(history):
        if op.answered < op.invoked:
            raise ValueError(f"operation {i} answered before it was invoked")
        events.append((op.invoked, 0, i))
        events.append((op.answered, 1, i))
    events.sort()  # at equal times calls come first: touching operations count as concurrent
    head = _Entry(-1, False)
    calls: dict[int, _Entry] = {}
    prev = head
    for _, kind, i in events:
        e = _Entry(i, kind == 0)
        if kind == 0:
            calls[i] = e
        else:
            calls[i].match = e
        prev.next, e.prev, prev = e, prev, e
    return head


def _lift(e: _Entry) -> None:
    """Take a call and its return out of the list."""
    for x in (e, e.match):
        assert x is not None
        assert x.prev is not None
        x.prev.next = x.next
        if x.next is not None:
            x.next.prev = x.prev


def _unlift(e: _Entry) -> None:
    for x in (e.match, e):
        assert x is not None
        assert x.prev is not None
        x.prev.next = x
        if x.next is not None:
            x.next.prev = x


def linearizable(history: Sequence[Op], initial: Hashable, step: Step) -> bool:
    """Whether some total order of ``history`` respects real time and the model ``step`` from ``initial``."""
    head = _entries(history)
    state: Hashable = initial
    done = 0  # bit i: operation i is in the order
    seen: set[tuple[int, Hashable]] = set()
    stack: list[tuple[_Entry, Hashable]] = []
    entry = head.next
    while head.next is not None:
        assert entry is not None
        if entry.is_call:
            after = step(state, history[entry.op])
            bit = 1 << entry.op
            if after is not None and (done | bit, after) not in seen:
                seen.add((done | bit, after))
                stack.append((entry, state))
                state, done = after, done | bit
                _lift(entry)
                entry = head.next
            else:
                entry = entry.next
        else:  # an answer before any order could take its operation: undo the last choice
            if not stack:
                return False
            entry, state = stack.pop()
            done &= ~(1 << entry.op)
            _unlift(entry)
            entry = entry.next
    return True


# -- models -------------------------------------------------------------------------------------


def counter_step(state: Hashable, op: Op) -> Hashable | None:
    """A counter: ``add`` (delta) -> new value; ``get`` -> value (0 when absent); ``cas`` (expected, value) ->
    (True, value) or (False, current)."""
    assert isinstance(state, int)
    if op.kind == "add":
        return state + op.args[0] if op.result == state + op.args[0] else None
    if op.kind == "get":
        return state if op.result == state else None
    if op.kind == "cas":
        swapped, value = op.result
        if swapped:
            return value if state == op.args[0] and value == op.args[1] else None
        return state if state != op.args[0] and value == state else None
    raise ValueError(op.kind)


def register_step(state: Hashable, op: Op) -> Hashable | None:
    """A register as (revision, value), (0, None) when absent: ``write`` (value) -> new rev; ``cas``
    (expected_rev, value) -> (True, new rev) or (False, current rev); ``get`` -> (rev, value)."""
    assert isinstance(state, tuple)
    rev, _ = state
    if op.kind == "write":
        return (rev + 1, op.args[0]) if op.result == rev + 1 else None
    if op.kind == "cas":
        swapped, got_rev = op.result
        if swapped:
            return (rev + 1, op.args[1]) if rev == op.args[0] and got_rev == rev + 1 else None
        return state if rev != op.args[0] and got_rev == rev else None
    if op.kind == "get":
        return state if tuple(op.result) == state else None
    raise ValueError(op.kind)
