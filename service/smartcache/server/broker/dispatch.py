"""Dispatch: the broker's worker-facing side.

Free worker slots are credits (one worker identity per free slot, announced
with READY). :meth:`Dispatcher.dispatch` hands the most urgent queued
messages to free slots, one inproc batch per worker (a direct call for a
worker on the broker's loop, :class:`smartcache.server.broker.inproc.Direct`); :meth:`take`
(behind :meth:`from_workers` for socket workers) takes their answers
(REPLY, DONE, FAIL: each frees its slot) and internal messages they queue
(ENQUEUE). Every ticket handed out comes back exactly once -- the worker
guarantees it; :meth:`reclaim_overdue` (the watchdog) answers and takes back
a slot whose answer is late by more than ``WATCHDOG_GRACE_S`` anyway, and
remembers the ticket so its late answer frees nothing twice.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import structlog
import zmq

from smartcache.server.broker import inproc
from smartcache.server.broker.queue import Holder, PriorityQueue
from smartcache.server.broker.replies import Replies
from smartcache.server.deadlines import WATCHDOG_GRACE_S
from smartcache.server.metrics import Metrics
from smartcache.server.zmqio import NOBLOCK, readable, send_frames
from smartcache.wire import REGISTRY

log = structlog.get_logger("broker")

_BAD_INPUT = REGISTRY.bad_input_errors
#: tickets reclaimed by the watchdog whose late answers may still come (bounded)
RECLAIMED_KEPT = 10_000


class Dispatcher:
    """Worker slots and the messages running in them (broker thread only)."""

    def __init__(
        self,
        *,
        queue: PriorityQueue,
        replies: Replies,
        enqueue_internal: Callable[[bytes, bytes, float], None],
        bad_input_allowed: Callable[[list[bytes], float], bool],
        metrics: Metrics,
        session_missed: Callable[[bytes, float], None] = lambda _peer, _now: None,
    ) -> None:
        """enqueue_internal: where a worker's internal messages go (the intake's door); bad_input_allowed:
        the intake's bad-input rate, which a worker's BAD_BODY answers keep too; session_missed: counts a
        reply saying a session is not live for its peer (the intake's NOT_FOUND throttle)."""
        self._session_missed = session_missed
        self.queue = queue
        self.free: deque[bytes] = deque()  # one worker identity per free slot
        self.inflight: dict[bytes, Holder] = {}  # ticket -> holder
        #: tickets the watchdog answered and took back: a late answer must not free the slot twice
        self._reclaimed: OrderedDict[bytes, None] = OrderedDict()
        self._replies = replies
        self._enqueue_internal = enqueue_internal
        self._bad_input_allowed = bad_input_allowed
        self._metrics = metrics
        self._type_names = {t.id: t.name for t in REGISTRY.types.values()}
        #: workers on the broker's loop: identity -> the function that takes a batch (no socket)
        self.direct: dict[bytes, Callable[[list[bytes]], None]] = {}

    def from_workers(self, sock: zmq.Socket[Any], now: float) -> None:
        """Take every batch the workers sent (the socket's FD is edge-triggered)."""
        while readable(sock):
            wid = sock.recv(NOBLOCK)  # workers send exactly [identity, batch]
            self.take(wid, inproc.unpack(sock.recv(0)), now)

    def take(self, wid: bytes, items: list[bytes], now: float) -> None:
        """One batch from worker ``wid``, off the socket or a direct link."""
        free, inflight, queue, replies = self.free, self.inflight, self.queue, self._replies
        for i in range(0, len(items) - 3, inproc.TO_BROKER):
            kind = items[i]
            if kind == inproc.READY:
                slots = inproc.CREDIT.unpack(items[i + 1])[0]
                free.extend([wid] * slots)
                log.info("worker_ready", worker=wid.decode(), slots=slots)
                continue
            if kind == inproc.ENQUEUE:
                self._enqueue_internal(items[i + 1], items[i + 2], now)
                continue
            ticket = items[i + 1]
            h = inflight.pop(ticket, None)
            if h is None:
                # The watchdog answered it and took the slot back already (or, past RECLAIMED_KEPT such late
                # answers, forgot the ticket): nothing to answer, and no slot to give back a second time.
                if ticket in self._reclaimed:
                    del self._reclaimed[ticket]
                else:
                    log.error("worker_answer_unknown_ticket", worker=wid.decode(), kind=kind.decode())
                continue
            free.append(wid)
            queue.done(h)
            if kind == inproc.REPLY:
                replies.reply(h, items[i + 2], items[i + 3], now)
            elif kind == inproc.MISS:
                replies.reply(h, items[i + 2], items[i + 3], now)
                if h.peer:
                    self._session_missed(h.peer, now)
            elif kind == inproc.FAIL:
                error = items[i + 2].decode()
                if error in _BAD_INPUT and h.envelope and not self._bad_input_allowed(h.envelope, now):
                    continue  # beyond the bad-input rate: no answer (counted as throttled)
                replies.refuse(h, error, items[i + 3].decode(), None, cache=False)
            elif kind == inproc.DONE:
                replies.observe(h.type_id, now - h.arrived)
            else:
                log.error("worker_protocol_error", kind=kind)
                replies.refuse(h, "INTERNAL", "internal error: unknown worker answer", None)

    def expire(self, now: float) -> None:
        """Answer every queued message whose lifetime is over (never executed)."""
        if self.queue.depth:
            for h in self.queue.expire(now):
                self._replies.refuse(h, "EXPIRED", "lifetime ended before a worker was free", "expired")

    def dispatch(self, sock: zmq.Socket[Any], now: float) -> None:
        """Hand the most urgent queued messages to free slots: one batch frame per worker."""
        free, queue, inflight = self.free, self.queue, self.inflight
        batches: dict[bytes, list[bytes]] = {}
        while free and queue.depth:
            h = queue.pop_ready()
            if h is None:
                break
            left_ms = int((h.deadline - now) * 1000)
            if left_ms <= 0:
                queue.done(h)
                self._replies.refuse(h, "EXPIRED", "lifetime ended before a worker was free", "expired")
                continue
            ticket = inproc.TICKET.pack(h.seq, left_ms)
            inflight[ticket] = h
            wid = h.worker = free.popleft()
            batch = batches.get(wid)
            if batch is None:
                batches[wid] = [ticket, h.header, h.body]
            else:
                batch += (ticket, h.header, h.body)
        direct = self.direct
        for wid, items in batches.items():
            deliver = direct.get(wid)
            if deliver is not None:
                deliver(items)
            else:
                send_frames(sock, [wid, inproc.pack(items)])

    def reclaim_overdue(self, now: float) -> int:
        """The watchdog: answer and take back every slot held past deadline + grace; returns how many."""
        overdue = [t for t, h in self.inflight.items() if h.deadline + WATCHDOG_GRACE_S < now]
        for ticket in overdue:
            h = self.inflight.pop(ticket)
            self.queue.done(h)
            self.free.append(h.worker)
            self._reclaimed[ticket] = None
            if len(self._reclaimed) > RECLAIMED_KEPT:
                self._reclaimed.popitem(last=False)
            self._metrics.watchdog_reclaimed.inc()
            log.error("watchdog_reclaimed", type=self._type_names[h.type_id], late_s=round(now - h.deadline, 3))
            self._replies.refuse(h, "OUTCOME_UNKNOWN", "the worker did not answer within the lifetime", None)
        return len(overdue)

    def finish(self) -> None:
        """The drain is over: answer what is left (queued: never executed; running: maybe)."""
        left = list(self.queue.drain())
        for h in left:
            self._replies.refuse(h, "SHUTTING_DOWN", "service stopped before this message ran", "shutting_down")
        running = list(self.inflight.values())
        for h in running:
            self.queue.done(h)
            self._replies.refuse(
                h, "OUTCOME_UNKNOWN", "service stopped while this message was executing", "shutting_down"
            )
        if left or running:
            log.warning("broker_drain_incomplete", queued=len(left), running=len(running))
        self.inflight.clear()
