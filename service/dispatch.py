"""Dispatch: the broker's worker-facing side.

Free worker slots are credits (one worker identity per free slot, announced
with READY). :meth:`Dispatcher.dispatch` hands the most urgent queued
messages to free slots, one inproc batch per worker (a direct call for a
worker on the broker's loop, :class:`service.inproc.Direct`); :meth:`take`
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

from service import inproc
from service.admission import Admission
from service.metrics import Metrics
from service.protocol import REGISTRY, decode_header
from service.queue import Holder, PriorityQueue
from service.zmqio import NOBLOCK, readable, send_frames

log = structlog.get_logger("broker")

#: a worker answers at its message's deadline; past deadline + this, the watchdog answers and takes the slot back
WATCHDOG_GRACE_S = 1.0
#: tickets reclaimed by the watchdog whose late answers may still come (bounded)
RECLAIMED_KEPT = 10_000


class Dispatcher:
    """Worker slots and the messages running in them (broker thread only)."""

    def __init__(self, *, queue: PriorityQueue, admission: Admission, metrics: Metrics) -> None:
        self.queue = queue
        self.free: deque[bytes] = deque()  # one worker identity per free slot
        self.inflight: dict[bytes, Holder] = {}  # ticket -> holder
        #: tickets the watchdog answered and took back: a late answer must not free the slot twice
        self._reclaimed: OrderedDict[bytes, None] = OrderedDict()
        self._admission = admission
        self._metrics = metrics
        self._type_names = {t.id: t.name for t in REGISTRY.types.values()}
        #: workers on the broker's loop: identity -> the function that takes a batch (no socket)
        self.direct: dict[bytes, Callable[[list[bytes]], None]] = {}

    def from_workers(self, backend: zmq.Socket[Any], now: float) -> None:
        """Take every batch the workers sent (the socket's FD is edge-triggered)."""
        while readable(backend):
            wid = backend.recv(NOBLOCK)  # workers send exactly [identity, batch]
            self.take(wid, inproc.unpack(backend.recv(0)), now)

    def take(self, wid: bytes, items: list[bytes], now: float) -> None:
        """One batch from worker ``wid``, off the socket or a direct link."""
        free, inflight, queue, admission = self.free, self.inflight, self.queue, self._admission
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
            if h is None:  # the watchdog answered it and took the slot back already
                if ticket in self._reclaimed:
                    del self._reclaimed[ticket]
                else:
                    free.append(wid)
                continue
            free.append(wid)
            queue.done(h)
            if kind == inproc.REPLY:
                admission.reply(h, items[i + 2], items[i + 3], now)
            elif kind == inproc.FAIL:
                admission.refuse(h, items[i + 2].decode(), items[i + 3].decode(), None, cache=False)
            elif kind == inproc.DONE:
                admission.observe(h.type_id, now - h.arrived)
            else:
                log.error("worker_protocol_error", kind=kind)
                admission.refuse(h, "INTERNAL", "internal error: unknown worker answer", None)

    def _enqueue_internal(self, header_frame: bytes, body: bytes, now: float) -> None:
        if self._admission.stopping:
            self._metrics.rejections.labels("shutting_down").inc()
            return
        self._admission.enqueue([], decode_header(header_frame), header_frame, body, no_reply=True, now=now)

    def expire(self, now: float) -> None:
        """Answer every queued message whose lifetime is over (never executed)."""
        if self.queue.depth:
            for h in self.queue.expire(now):
                self._admission.refuse(h, "EXPIRED", "lifetime ended before a worker was free", "expired")

    def dispatch(self, backend: zmq.Socket[Any], now: float) -> None:
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
                self._admission.refuse(h, "EXPIRED", "lifetime ended before a worker was free", "expired")
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
                send_frames(backend, [wid, inproc.pack(items)])

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
            self._admission.refuse(h, "OUTCOME_UNKNOWN", "the worker did not answer within the lifetime", None)
        return len(overdue)

    def finish(self) -> None:
        """The drain is over: answer what is left (queued: never executed; running: maybe)."""
        left = list(self.queue.drain())
        for h in left:
            self._admission.refuse(h, "SHUTTING_DOWN", "service stopped before this message ran", "shutting_down")
        running = list(self.inflight.values())
        for h in running:
            self.queue.done(h)
            self._admission.refuse(
                h, "OUTCOME_UNKNOWN", "service stopped while this message was executing", "shutting_down"
            )
        if left or running:
            log.warning("broker_drain_incomplete", queued=len(left), running=len(running))
        self.inflight.clear()
