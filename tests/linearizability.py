"""A linearizability checker for histories of one object (Wing & Gong's search, Lowe's memoisation).

A history is the operations concurrent clients ran, each with the (monotonic)
times it was invoked and answered, its arguments and its result. It is
linearizable when there is one total order of its operations that (1)
respects real time: an operation answered before another was invoked comes
first, and (2) replays through the object's sequential model giving each
operation the result it really got. The search tries, at each step, every
operation that may come next (one whose invocation precedes every pending
answer), and backtracks; a cache of (operations done, model state) visited
keeps it polynomial in practice (porcupine, knossos do the same).

Indeterminate operations (a fault history's timeouts and OUTCOME_UNKNOWN) are
treated as Knossos and Porcupine treat them: ``answered = math.inf`` and
``result = UNKNOWN``. Such an operation may take effect at any point after
its invocation or never, and the model accepts any result for it (it is asked
only for the state after the operation takes effect). The search is done when
every *determinate* operation is in the order; an indeterminate one left out
never took effect. An operation known to have failed is left out of the
history, or given as a determinate one that changes nothing (a CAS that
answered CONFLICT).

What keeps indeterminate operations cheap, all three exact. (1) One is taken
only where it changes the state: one that changes nothing is the same as one
never taken. (2) Of those alike in kind and arguments only the earliest
invoked one not yet taken may be taken: once invoked they are
interchangeable, and k unknown COUNTER_ADDs pending together made 2^k sets of
operations done where k + 1 counts of them mean something. (3) Each
configuration tries the determinate operations that may come next before the
indeterminate ones: taking those first made a passing counter of 2,000 adds,
100 of them unknown, visit 104,000 states and take 0.45 s; it now visits
1,942 (one per operation, near enough).

When a history is not linearizable, ``check`` says where: the shortest prefix
(every event up to one answer; the operations still running then count as
indeterminate) that already has no order, found by galloping and bisection
from the latest point the whole search reached, since a prefix of a
linearizable history is linearizable; the operation whose answer ends it; the
states the object may have been in when that operation began; and the window
around it: the operations it overlapped, the last ones answered before it
began, and the indeterminate ones pending then that matter. Knossos reports
much the same (the last consistent configurations and the operation that
could not be added).

Measured with ``python -m tests.linearizability`` (``_bench``: synthetic
histories, each op taking effect at a random point of its interval; this
2-core machine shared, load 4): a session register of 400 reads and updates
from 4 clients, 5 % unknown, passes in 0.003 s (439 states); a counter of
2,000 adds from 2 clients, 5 % unknown, in 0.01 s. Failing takes longer,
since the search must try everything before it: the register with one stale
read at 90 %, 0.03 s with its window; the counter with one value answered
twice at 90 %, 1.0–1.3 s (85,000 states: with k unknown adds pending that
were never applied, each point of the history has up to k + 1 counts to try);
3,000 adds, 10 % unknown, 3.7–5.9 s (348,000 states, 80 MB at the peak). The fault suite's per-key histories
are of this size; tests/faults/linear.py gives each key a budget of states.
"""

from __future__ import annotations

import enum
import math
import random
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any


class _Unknown(enum.Enum):
    UNKNOWN = "?"

    def __repr__(self) -> str:
        return "?"


#: the result of an indeterminate operation (its answered time is math.inf)
UNKNOWN = _Unknown.UNKNOWN
#: a failure's window shows this many of the indeterminate ops pending then, the last invoked
UNKNOWN_SHOWN = 5
#: the result of a compare-and-set that found another revision: a definite answer that changed nothing
CONFLICT = "conflict"


@dataclass(frozen=True)
class Op:
    """One operation: what was asked (``kind``, ``args``), what came back, and when.

    Indeterminate (outcome unknown): ``answered = math.inf`` and ``result = UNKNOWN``."""

    client: Hashable
    invoked: float
    answered: float
    kind: str
    args: tuple[Any, ...]
    result: Any

    @property
    def indeterminate(self) -> bool:
        return self.result is UNKNOWN

    def line(self) -> str:
        """One readable line: client, times, kind(args) -> result."""
        end = "…never answered" if self.indeterminate else f"{self.answered:.3f}"
        args = ", ".join(repr(a) for a in self.args)
        return f"{self.client!s:<14} {self.invoked:10.3f} → {end:<15} {self.kind}({args}) -> {self.result!r}"


def indeterminate(client: Hashable, invoked: float, kind: str, args: tuple[Any, ...]) -> Op:
    """An operation that may have taken effect at any time after ``invoked``, or never."""
    return Op(client, invoked, math.inf, kind, args, UNKNOWN)


#: model: (state, op) -> the state after op, or None when op could not have given its result in that state;
#: for an indeterminate op, the state after it takes effect (None: it cannot take effect there). A model reads
#: only the op's kind, args and result.
Step = Callable[[Hashable, Op], Hashable | None]


class TooLargeError(Exception):
    """The search visited more states than its budget: the history was neither passed nor failed."""


@dataclass
class Result:
    """What ``check`` found; when not ok, where the history first has no order, small enough to read."""

    ok: bool
    states: int = 0  # (operations done, model state) pairs the search visited
    #: when not ok: the operation(s) whose answer first had no place in any order
    failing: list[Op] = field(default_factory=list)
    #: by invocation: the failing operations, those they overlapped, the last ones answered before they began,
    #: and the last UNKNOWN_SHOWN indeterminate ones pending then that matter (see _explain)
    window: list[Op] = field(default_factory=list)
    #: the states the object may have been in when the first failing operation was invoked
    before: list[Hashable] = field(default_factory=list)
    prefix: int = 0  # operations invoked in the shortest failing prefix
    total: int = 0
    other_unknown: int = 0  # indeterminate operations pending then that matter, not in the window

    def describe(self) -> str:
        if self.ok:
            return f"linearizable ({self.total} operations, {self.states} states)"
        t = self.failing[0].answered
        states = ", ".join(repr(s) for s in self.before[:5])
        states += f" … ({len(self.before)} in all)" if len(self.before) > 5 else ""
        lines = [
            f"not linearizable: the first {self.prefix} of {self.total} operations (those invoked by t={t:.3f})"
            " have no order already: the answer marked ! fits no order of those answered before it",
            f"  states possible when it began, after every operation answered before: {states or 'unknown'}",
        ]
        lines += [("! " if op in self.failing else "  ") + op.line() for op in self.window]
        if self.other_unknown:
            lines.append(f"  (and {self.other_unknown} earlier operations of unknown outcome still pending)")
        return "\n".join(lines)


class _Entry:
    __slots__ = ("is_call", "match", "next", "op", "prev")

    def __init__(self, op: int, is_call: bool) -> None:
        self.op, self.is_call = op, is_call
        self.prev: _Entry | None = None
        self.next: _Entry | None = None
        self.match: _Entry | None = None  # a call's return entry


def _entries(history: Sequence[Op]) -> _Entry:
    """A doubly linked list of the determinate ops' call and return events in time order, behind a sentinel
    head."""
    events = []
    for i, op in enumerate(history):
        if op.indeterminate != (op.answered == math.inf):
            raise ValueError(f"operation {i}: an indeterminate op has answered = math.inf and result = UNKNOWN")
        if op.answered < op.invoked:
            raise ValueError(f"operation {i} answered before it was invoked")
        if not op.indeterminate:
            events += [(op.invoked, 0, i), (op.answered, 1, i)]
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


def _alike(history: Sequence[Op]) -> list[list[int]]:
    """The indeterminate ops in classes of the same kind and args, each by invocation, the classes by their
    first."""
    classes: dict[tuple[str, tuple[Any, ...]], list[int]] = {}
    for i in sorted(range(len(history)), key=lambda i: history[i].invoked):
        if history[i].indeterminate:
            classes.setdefault((history[i].kind, history[i].args), []).append(i)
    return list(classes.values())


@dataclass
class _Found:
    ok: bool
    states: int
    #: when not ok: the latest first pending answer of any configuration, past which no order went
    reach: float = math.inf


def _bits(history: Sequence[Op]) -> list[int]:
    """Each op's bit in the search's sets of ops done: the determinate ones in one int and the indeterminate ones
    in another, each by invocation. The first int's low bits fill up as the search goes; the cache keeps it
    shifted past them, in a few words where 3,000 ops made 400 bytes a state."""
    out = [0] * len(history)
    for part in (False, True):
        ops = sorted((i for i, op in enumerate(history) if op.indeterminate == part), key=lambda i: history[i].invoked)
        for b, i in enumerate(ops):
            out[i] = 1 << b
    return out


def _visit(seen: set[tuple[int, int, int, Hashable]], key: tuple[int, int, int, Hashable], budget: int | None) -> bool:
    """Whether the search has not been here yet; it now has."""
    if key in seen:
        return False
    seen.add(key)
    if budget is not None and len(seen) > budget:
        raise TooLargeError(f"more than {budget} states")
    return True


def _key(done: int, unk: int, state: Hashable) -> tuple[int, int, int, Hashable]:
    """The cache's key: done without its low run of ones, their count, unk, the state."""
    ones = ((done + 1) & ~done).bit_length() - 1
    return done >> ones, ones, unk, state


def _search(
    history: Sequence[Op],
    initial: Hashable,
    step: Step,
    max_states: int | None = None,
    collect: set[Hashable] | None = None,
) -> _Found:
    """Wing & Gong's search. With ``collect``: gather the state at the end of every order instead of stopping at
    the first. Raises TooLargeError past ``max_states``.

    Each configuration first tries the determinate ops that may come next (in the list before the first
    pending answer), then the first untaken op of each class of alike indeterminate ops invoked by then."""
    head, classes, bit = _entries(history), _alike(history), _bits(history)
    taken = [0] * len(classes)  # how many of each class are in the order (always its first ones)
    invoked = [op.invoked for op in history]
    left = sum(1 for op in history if not op.indeterminate)  # determinate ops not yet in the order
    state: Hashable = initial
    done = unk = 0  # the ops in the order (see _bits)
    seen: set[tuple[int, int, int, Hashable]] = set()
    stack: list[tuple[_Entry | None, int, Hashable, float]] = []  # (entry or None, class, state, bound) before
    entry: _Entry | None = head.next  # None: trying the indeterminate ops, class c next
    c, bound, reach = 0, -math.inf, -math.inf
    while True:
        if not left:
            if collect is None:
                return _Found(True, len(seen))
            collect.add(state)
            bound = math.inf  # and on with the indeterminate ops: their states are ends too
        elif entry is not None and entry.is_call:
            after = step(state, history[i := entry.op])
            if after is not None and _visit(seen, _key(done | bit[i], unk, after), max_states):
                stack.append((entry, -1, state, bound))
                state, done, left = after, done | bit[i], left - 1
                _lift(entry)
                entry, c = head.next, 0
            else:
                entry = entry.next
            continue
        elif entry is not None:  # the first pending answer: an indeterminate op invoked after it cannot come next
            bound, entry, c = history[entry.op].answered, None, 0
            reach = max(reach, bound)
        moved = False
        while c < len(classes) and not moved:
            if taken[c] < len(classes[c]) and invoked[i := classes[c][taken[c]]] <= bound:
                after = step(state, history[i])
                # one that changes nothing is the same as one never taken
                if after is not None and after != state and _visit(seen, _key(done, unk | bit[i], after), max_states):
                    stack.append((None, c, state, bound))
                    state, unk, moved = after, unk | bit[i], True
                    taken[c] += 1
                    entry, c = head.next, 0
                    continue
            c += 1
        if moved:
            continue
        # nothing may come next (or an order is complete, collecting): undo the last choice
        if not stack:
            return _Found(bool(collect), len(seen), reach)
        e, c, state, bound = stack.pop()
        if e is not None:
            _unlift(e)
            done, left, entry = done & ~bit[e.op], left + 1, e.next
        else:
            taken[c] -= 1
            unk, c = unk & ~bit[classes[c][taken[c]]], c + 1


def linearizable(history: Sequence[Op], initial: Hashable, step: Step) -> bool:
    """Whether some total order of ``history`` respects real time and the model ``step`` from ``initial``."""
    return _search(history, initial, step).ok


def check(history: Sequence[Op], initial: Hashable, step: Step, *, max_states: int | None = None) -> Result:
    """``linearizable``, and when not, where: see Result. Raises TooLargeError when the whole history's search
    passes ``max_states`` (the window's searches that do count as passing: the window may come out later)."""
    found = _search(history, initial, step, max_states)
    if found.ok:
        return Result(True, found.states, total=len(history))
    return _explain(history, initial, step, found, max_states)


def _cut(history: Sequence[Op], t: float) -> list[Op]:
    """The history as known at time t: ops invoked by then; those not answered by then are indeterminate."""
    return [
        op if op.answered <= t else replace(op, answered=math.inf, result=UNKNOWN) for op in history if op.invoked <= t
    ]


def _first_failing(history: Sequence[Op], initial: Hashable, step: Step, max_states: int | None, reach: float) -> float:
    """The first answer whose cut has no order. Every cut before ``reach`` has one (the whole search got past
    it), and the failure is usually soon after: gallop from there, then bisect."""

    def fails(k: int) -> bool:
        try:
            return not _search(_cut(history, times[k]), initial, step, max_states).ok
        except TooLargeError:
            return False

    times = sorted({op.answered for op in history if not op.indeterminate and op.answered >= reach})
    lo, hi, gap = 0, len(times) - 1, 1  # the whole history fails: so does its cut at the last answer
    while lo < hi and not fails(k := min(lo + gap - 1, hi)):
        lo, gap = min(k + 1, hi), gap * 2  # (past hi only when hi's search passed its budget)
    hi = min(lo + gap - 1, hi)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fails(mid) else (mid + 1, hi)
    return times[lo]


def _explain(history: Sequence[Op], initial: Hashable, step: Step, found: _Found, max_states: int | None) -> Result:
    out = Result(False, found.states, total=len(history))
    t = _first_failing(history, initial, step, max_states, found.reach)
    out.failing = [op for op in history if op.answered == t]
    out.prefix = sum(1 for op in history if op.invoked <= t)
    f0 = min(op.invoked for op in out.failing)
    out.before = _states_at(history, initial, step, f0, max_states)
    answered_before = [op for op in history if op.answered < f0]
    # the last answered before the failing op began: those no other op answered before it began follows
    last = max((op.invoked for op in answered_before), default=-math.inf)
    frontier = [op for op in answered_before if op.answered >= last]
    overlapping = [op for op in history if op.invoked <= t and op.answered >= f0]
    # of the indeterminate ops pending then, those that matter: invoked since the answers before the frontier,
    # or able to take effect in a state possible then (not an update of a revision long gone)
    begun = min((op.invoked for op in frontier), default=f0)
    since = max((op.answered for op in answered_before if op.answered < begun), default=-math.inf)
    unknown = [
        op
        for op in overlapping
        if op.indeterminate and (op.invoked >= since or any(step(s, op) not in (None, s) for s in out.before))
    ]
    shown = sorted(unknown, key=lambda op: op.invoked)[-UNKNOWN_SHOWN:]
    out.other_unknown = len(unknown) - len(shown)
    window = {id(op): op for op in frontier + overlapping if not op.indeterminate} | {id(op): op for op in shown}
    out.window = sorted(window.values(), key=lambda op: (op.invoked, op.answered))
    return out


def _states_at(
    history: Sequence[Op], initial: Hashable, step: Step, t: float, max_states: int | None
) -> list[Hashable]:
    """The states the object may be in once every op answered before t is in the order (and any of those
    pending then); [] when that search passes its budget."""
    ends: set[Hashable] = set()
    try:
        _search(_cut(history, math.nextafter(t, -math.inf)), initial, step, max_states, ends)
    except TooLargeError:
        return []
    try:
        return sorted(ends)  # type: ignore[type-var]
    except TypeError:  # (rev, None) and (rev, 7)
        return sorted(ends, key=repr)


# -- models -------------------------------------------------------------------------------------


def counter_step(state: Hashable, op: Op) -> Hashable | None:
    """A counter: ``add`` (delta) -> new value; ``get`` -> value (0 when absent); ``cas`` (expected, value) ->
    (True, value) or (False, current)."""
    assert isinstance(state, int)
    if op.kind == "add":
        return state + op.args[0] if op.result in (UNKNOWN, state + op.args[0]) else None
    if op.kind == "get":
        return state if op.result in (UNKNOWN, state) else None
    if op.kind == "cas":
        if op.result is UNKNOWN:
            return op.args[1] if state == op.args[0] else None
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
        return (rev + 1, op.args[0]) if op.result in (UNKNOWN, rev + 1) else None
    if op.kind == "cas":
        if op.result is UNKNOWN:
            return (rev + 1, op.args[1]) if rev == op.args[0] else None
        swapped, got_rev = op.result
        if swapped:
            return (rev + 1, op.args[1]) if rev == op.args[0] and got_rev == rev + 1 else None
        return state if rev != op.args[0] and got_rev == rev else None
    if op.kind == "get":
        return state if op.result is UNKNOWN or tuple(op.result) == state else None
    raise ValueError(op.kind)


def session_step(state: Hashable, op: Op) -> Hashable | None:
    """The fault suite's session register: data {"log": [...]} under a revision, as (rev, the log's last element
    or None), (1, None) when created empty. ``read`` -> (rev, last); ``update`` (expected_rev, op_id) appends
    op_id -> the new rev, or CONFLICT when the rev is another (nothing applied)."""
    assert isinstance(state, tuple)
    rev, _ = state
    if op.kind == "read":
        return state if op.result is UNKNOWN or tuple(op.result) == state else None
    if op.kind == "update":
        expected, op_id = op.args
        if op.result == CONFLICT:
            return state if rev != expected else None
        return (rev + 1, op_id) if rev == expected and op.result in (UNKNOWN, rev + 1) else None
    raise ValueError(op.kind)


# -- synthetic histories (the unit tests, and the measurement above) ----------------------------


def synthetic(model: str, n: int, clients: int, unknown: float, seed: int = 1) -> list[Op]:
    """A linearizable history of n ops: ``session`` (each client reads, then updates what it read) or ``counter``
    (adds of 1). Each op takes effect at a random point of its interval; a fraction ``unknown`` of the writes
    are indeterminate, half of them applied."""
    rng = random.Random(seed)
    ops: list[tuple[float, float, float, int, int]] = []  # (effect, invoked, answered, client, k)
    for c in range(clients):
        t = rng.random()
        for k in range(n // clients):
            d = rng.uniform(0.5, 3.0)
            ops.append((t + rng.uniform(0, d), t, t + d, c, k))
            t += d + rng.uniform(0, 0.5)
    state: Any = (1, None) if model == "session" else 0
    read: dict[int, int] = {}  # client -> the rev it last read
    args: tuple[Any, ...]
    out = []
    for _effect, invoked, answered, c, k in sorted(ops):
        write = model == "counter" or k % 2 == 1
        lost = write and rng.random() < unknown
        applied = not lost or rng.random() < 0.5
        if model == "counter":
            kind, args, result = "add", (1,), state + 1
            state = state + 1 if applied else state
        elif not write:
            kind, args, result = "read", (), state
            read[c] = state[0]
        else:
            kind, args = "update", (read[c], c * 1_000_000 + k)
            result = state[0] + 1 if state[0] == read[c] else CONFLICT
            state = (state[0] + 1, args[1]) if applied and result != CONFLICT else state
        out.append(indeterminate(c, invoked, kind, args) if lost else Op(c, invoked, answered, kind, args, result))
    return sorted(out, key=lambda op: op.invoked)


def _broken(history: list[Op], kind: str, result: Callable[[Op], Any], at: float) -> list[Op]:
    """history with the first determinate op of this kind from the fraction ``at`` on given another result."""
    i = next(i for i, op in enumerate(history) if i >= at * len(history) and op.kind == kind and not op.indeterminate)
    return [*history[:i], replace(history[i], result=result(history[i])), *history[i + 1 :]]


def _bench() -> None:
    """python -m tests.linearizability: the numbers in the module's docstring."""
    session, counter = synthetic("session", 400, 4, 0.05), synthetic("counter", 2000, 2, 0.05)
    cases = {
        "session, 400 ops from 4 clients, 5 % unknown": (session, (1, None), session_step),
        "counter, 2,000 adds from 2 clients, 5 % unknown": (counter, 0, counter_step),
        "the session, a stale read at 90 %": (
            _broken(session, "read", lambda _: (1, None), 0.9),
            (1, None),
            session_step,
        ),
        "the counter, a value twice at 90 %": (_broken(counter, "add", lambda op: op.result - 2, 0.9), 0, counter_step),
        "counter, 3,000 adds, 10 % unknown, a value twice at 95 %": (
            _broken(synthetic("counter", 3000, 2, 0.1), "add", lambda op: op.result - 2, 0.95),
            0,
            counter_step,
        ),
    }
    for name, (history, initial, step) in cases.items():
        t0 = time.perf_counter()
        r = check(history, initial, step)
        print(f"{name}: ok={r.ok}, {r.states} states, {time.perf_counter() - t0:.3f} s")
        if not r.ok:
            print(r.describe())


if __name__ == "__main__":
    _bench()
