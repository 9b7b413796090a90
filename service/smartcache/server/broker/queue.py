"""The broker's single fixed-capacity priority queue.

Messages wait here between arrival and a free worker. Order: priority (0 is
the most urgent), then arrival (FIFO). Each holder has a deadline; one past it
is taken out by ``expire`` and never dispatched. A full queue refuses a new
message, unless the new one is more urgent than the newest of the least
urgent ones, which is evicted instead.

Bulkheads: ``pop_ready`` skips a type while ``limits[type]`` of its messages
are running (between ``pop_ready`` and ``done``), so a slow type cannot take
every worker; messages of other types pass it.

Internally: one FIFO deque per message type (a type has one priority), and a
heap of deadlines with lazy deletion, rebuilt when it grows past a bound.
Only the broker thread touches it.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

QUEUED, RUNNING, FINISHED = 0, 1, 2
_HEAP_SLACK = 4  # rebuild the deadline heap when it holds this many times capacity


@dataclass(slots=True, eq=False)
class Holder:
    """One message in the service: where it came from, what it is, and until when it matters."""

    seq: int
    priority: int
    type_id: int
    arrived: float  # monotonic seconds
    deadline: float  # monotonic seconds
    envelope: list[bytes]  # ROUTER identity, after the proxy hop behind --processes (+ empty delimiter for REQ)
    header: bytes
    body: bytes
    no_reply: bool
    state: int = field(default=QUEUED)
    #: identity of the worker running it (set at dispatch)
    worker: bytes = b""
    #: who sent it, for the NOT_FOUND throttle (its CURVE key, else its connection); b"": an internal message
    peer: bytes = b""


class QueueFull(Exception):
    """No room, and nothing less urgent to evict."""


class PriorityQueue:
    def __init__(self, *, capacity: int, priorities: dict[int, int], limits: dict[int, int]) -> None:
        """priorities and limits: type id -> priority / most running at once."""
        self.capacity = capacity
        self.limits = limits
        self.running = dict.fromkeys(priorities, 0)
        self._fifo: dict[int, deque[Holder]] = {t: deque() for t in priorities}
        levels: dict[int, list[int]] = {}
        for type_id, prio in priorities.items():
            levels.setdefault(prio, []).append(type_id)
        #: [(priority, [type ids])], most urgent first
        self._levels = sorted(levels.items())
        #: queued holders per priority, so pop_ready skips empty levels without looking at their types
        self._level_depth = dict.fromkeys(levels, 0)
        self._heap: list[tuple[float, int, Holder]] = []
        self.depth = 0

    def __len__(self) -> int:
        return self.depth

    def push(self, h: Holder) -> Holder | None:
        """Queue h; returns an evicted holder, or raises QueueFull."""
        victim = None
        if self.depth >= self.capacity:
            victim = self._evict_for(h.priority)
            if victim is None:
                raise QueueFull
        self._fifo[h.type_id].append(h)
        heapq.heappush(self._heap, (h.deadline, h.seq, h))
        self.depth += 1
        self._level_depth[h.priority] += 1
        if len(self._heap) > _HEAP_SLACK * self.capacity:
            self._heap = [(x.deadline, x.seq, x) for _, _, x in self._heap if x.state == QUEUED]
            heapq.heapify(self._heap)
        return victim

    def _evict_for(self, priority: int) -> Holder | None:
        for prio, types in reversed(self._levels):
            if prio <= priority:
                return None
            newest: deque[Holder] | None = None
            for t in types:
                q = self._fifo[t]
                while q and q[-1].state != QUEUED:
                    q.pop()
                if q and (newest is None or q[-1].seq > newest[-1].seq):
                    newest = q
            if newest is not None:
                victim = newest.pop()
                self._take(victim, FINISHED)
                return victim
        return None

    def pop_ready(self) -> Holder | None:
        """The most urgent queued holder whose type is under its bulkhead limit, marked running."""
        for prio, types in self._levels:
            if not self._level_depth[prio]:
                continue
            best: deque[Holder] | None = None
            for t in types:
                q = self._fifo[t]
                while q and q[0].state != QUEUED:
                    q.popleft()
                if q and self.running[t] < self.limits[t] and (best is None or q[0].seq < best[0].seq):
                    best = q
            if best is not None:
                h = best.popleft()
                self._take(h, RUNNING)
                self.running[h.type_id] += 1
                return h
        return None

    def _take(self, h: Holder, state: int) -> None:
        """A queued holder leaves the queue."""
        h.state = state
        self.depth -= 1
        self._level_depth[h.priority] -= 1

    def done(self, h: Holder) -> None:
        """A running holder finished (answered, or given up on)."""
        if h.state == RUNNING:
            self.running[h.type_id] -= 1
        h.state = FINISHED

    def expire(self, now: float) -> Iterator[Holder]:
        """Take out and yield every queued holder whose deadline is not after now."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            h = heapq.heappop(heap)[2]
            if h.state == QUEUED:
                self._take(h, FINISHED)
                yield h

    def next_deadline(self) -> float | None:
        """The earliest deadline among queued holders (None when empty)."""
        heap = self._heap
        while heap and heap[0][2].state != QUEUED:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def drain(self) -> Iterable[Holder]:
        """Take out every queued holder (shutdown)."""
        out = [h for q in self._fifo.values() for h in q if h.state == QUEUED]
        for q in self._fifo.values():
            q.clear()
        self._heap.clear()
        for h in out:
            h.state = FINISHED
        self.depth = 0
        self._level_depth = dict.fromkeys(self._level_depth, 0)
        return sorted(out, key=lambda h: h.seq)
