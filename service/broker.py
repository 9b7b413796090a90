"""The broker: one thread, two ROUTER sockets, one poll loop.

Clients talk to ``settings.listen`` (tcp); worker threads to
``inproc://workers``. The broker parses and validates headers only, answers
PING itself, queues everything else in the priority queue, and hands the most
urgent message to a free worker slot. It does no business logic. Replies come
back through it to the client address saved in the message's holder.

Shutdown (``stop``): new messages are answered SHUTTING_DOWN; queued and
running ones get up to ``drain_timeout_s`` to finish; whatever is left is
answered (queued: SHUTTING_DOWN, never executed; running: OUTCOME_UNKNOWN);
then the sockets close, flushing replies.

Every message gets exactly one answer (none when PROTOCOL.md's NO_REPLY rule
says so: ``protocol.frame_no_reply``). The workers guarantee an answer for
every message they take; a watchdog checks: a slot held past its message's
deadline + ``WATCHDOG_GRACE_S`` is answered OUTCOME_UNKNOWN and taken back,
and counted in ``smartcache_watchdog_reclaimed_total`` (which should stay 0).
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog
import zmq

from service import eventloop, inproc
from service.config import Settings
from service.errors import ProtocolError
from service.metrics import REJECTION_REASONS, Metrics
from service.protocol import (
    FLAG_DATA_ERROR,
    REGISTRY,
    STATUS,
    TRANSPORT_ERROR,
    Header,
    decode_body,
    decode_header,
    encode_body,
    encode_header,
    error_body,
    frame_no_reply,
    loose_header,
    with_transport_error,
)
from service.queue import Holder, PriorityQueue, QueueFull
from service.zmqio import NOBLOCK, readable, recv_frames, send_frames

if TYPE_CHECKING:
    from service.workers import Worker

log = structlog.get_logger("broker")

STOP_POLL_S = 0.02
STOP_GRACE_S = 5.0
CLIENT_BATCH = 512  # client messages read per loop turn, so workers' replies are not starved
FINAL_READ_BATCHES = 100  # at stop: up to this many batches already sent to us are answered
#: per client connection: a client that sends faster than we read is pushed back by TCP, not buffered here
FRONTEND_RCVHWM = 1000
#: replies waiting for a slow client; beyond this they are dropped and counted
FRONTEND_SNDHWM = 10_000
#: a body up to this much over the limit is answered BODY_TOO_LARGE; a bigger one disconnects its sender
OVERSIZE_MARGIN_BYTES = 64 * 1024
FLUSH_LINGER_MS = 2000
#: a worker answers at its message's deadline; past deadline + this, the watchdog answers and takes the slot back
WATCHDOG_GRACE_S = 1.0
WATCHDOG_PERIOD_S = 0.25
#: tickets reclaimed by the watchdog whose late answers are still expected (bounded)
RECLAIMED_KEPT = 10_000
_PING = REGISTRY.types["PING"].id
_INTERNAL = frozenset(t.id for t in REGISTRY.types.values() if t.internal)
_MAX_LIFETIME_S = REGISTRY.max_lifetime_ms / 1000


class Broker:
    """The broker thread. ``start`` binds and runs it; ``stop`` begins the drain; ``join`` waits."""

    def __init__(
        self,
        *,
        settings: Settings,
        context: zmq.Context[Any],
        metrics: Metrics,
        local_workers: list[Worker] | None = None,
    ) -> None:
        """local_workers run on the broker's own event loop (worker_threads = 0)."""
        self._settings = settings
        self._local_workers = local_workers or []
        self._loop: asyncio.AbstractEventLoop  # set in _main, on the broker thread
        self._finished: asyncio.Future[None]  # set in _main
        self._timer: asyncio.TimerHandle | None = None
        self._control: zmq.Socket[Any] | None = None
        self._ctx = context
        self._metrics = metrics
        self._thread = threading.Thread(target=self._run, name="broker", daemon=True)
        self._bound = threading.Event()
        self._control_endpoint = f"inproc://broker-control-{id(self)}"
        self.endpoint = ""
        self.error: BaseException | None = None
        self.queue = PriorityQueue(
            capacity=settings.queue_capacity,
            priorities={t.id: t.priority for t in REGISTRY.types.values()},
            limits={t.id: settings.bulkheads.get(t.name, settings.workers) for t in REGISTRY.types.values()},
        )
        self._free: deque[bytes] = deque()  # one worker identity per free slot
        self._inflight: dict[bytes, Holder] = {}  # ticket -> holder
        #: tickets the watchdog answered and took back: a late answer must not free the slot twice
        self._reclaimed: OrderedDict[bytes, None] = OrderedDict()
        self._seq = itertools.count(1)
        self._stopping = False
        self._drain_deadline = 0.0
        self._frontend: zmq.Socket[Any] | None = None
        self._backend: zmq.Socket[Any] | None = None
        self._type_names = {t.id: t.name for t in REGISTRY.types.values()}
        self._durations = {t.id: metrics.duration.labels(t.name) for t in REGISTRY.types.values()}
        self._outcomes: dict[tuple[int, str], Any] = {}
        self._rejections = {r: metrics.rejections.labels(r) for r in REJECTION_REASONS}
        self._error_bodies: dict[tuple[str, str], bytes] = {}
        metrics.queue_capacity.set(settings.queue_capacity)
        metrics.watch(metrics.queue_depth, lambda: len(self.queue))
        metrics.watch(metrics.workers_busy, lambda: len(self._inflight))
        for t in REGISTRY.types.values():
            metrics.watch(metrics.workers_busy_by_type.labels(t.name), self._running_of(t.id))
            metrics.bulkhead_limit.labels(t.name).set(self.queue.limits[t.id])

    def _running_of(self, type_id: int) -> Callable[[], float]:
        return lambda: self.queue.running[type_id]

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Start the thread and wait until the sockets are bound (raises if binding failed)."""
        self._thread.start()
        self._bound.wait()
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """Begin the drain (safe from any thread)."""
        sock = self._ctx.socket(zmq.PAIR)
        try:
            sock.connect(self._control_endpoint)
            sock.send(b"STOP")
        finally:
            sock.close(linger=1000)

    def join(self, timeout_s: float | None = None) -> None:
        self._thread.join(timeout_s)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    # -- the loop --------------------------------------------------------------
    #
    # An asyncio loop in the broker thread drives everything: the sockets' FDs
    # (edge-triggered: after any socket operation, EVENTS must be re-checked,
    # which _rearm does), one timer for the next queue deadline, and the
    # workers that share this loop (worker_threads = 0).

    def _run(self) -> None:
        eventloop.run(self._main())

    async def _main(self) -> None:
        ctx = self._ctx
        frontend = self._frontend = ctx.socket(zmq.ROUTER)
        backend = self._backend = ctx.socket(zmq.ROUTER)
        control = self._control = ctx.socket(zmq.PAIR)
        try:
            frontend.setsockopt(zmq.ROUTER_MANDATORY, 1)
            frontend.setsockopt(zmq.SNDHWM, FRONTEND_SNDHWM)
            frontend.setsockopt(zmq.RCVHWM, FRONTEND_RCVHWM)
            # A frame far over the body limit is not even buffered: its sender is disconnected.
            frontend.setsockopt(zmq.MAXMSGSIZE, self._settings.max_body_bytes + OVERSIZE_MARGIN_BYTES)
            frontend.bind(self._settings.listen)
            self.endpoint = frontend.getsockopt_string(zmq.LAST_ENDPOINT)
            backend.setsockopt(zmq.ROUTER_MANDATORY, 1)
            backend.setsockopt(zmq.SNDHWM, 0)
            backend.setsockopt(zmq.RCVHWM, 0)
            backend.bind(inproc.ENDPOINT)
            control.bind(self._control_endpoint)
        except zmq.ZMQError as e:
            self.error = e
            self._bound.set()
            for sock in (frontend, backend, control):
                sock.close(linger=0)
            return
        loop = self._loop = asyncio.get_running_loop()
        self._finished = loop.create_future()
        workers = [loop.create_task(w.run()) for w in self._local_workers]
        for task in workers:
            task.add_done_callback(self._worker_ended)
        self._bound.set()
        log.info("broker_listening", endpoint=self.endpoint, queue_capacity=self.queue.capacity)
        for sock in (frontend, backend, control):
            loop.add_reader(sock.getsockopt(zmq.FD), self._on_event)
        self._on_event()
        loop.call_later(WATCHDOG_PERIOD_S, self._watchdog)
        try:
            await self._finished
        except Exception:
            log.exception("broker_crashed")
            raise
        finally:
            for sock in (frontend, backend, control):
                loop.remove_reader(sock.getsockopt(zmq.FD))
            for w in self._local_workers:
                w.stop()
            if workers:
                await asyncio.wait(workers, timeout=STOP_GRACE_S)
            frontend.close(linger=FLUSH_LINGER_MS)
            backend.close(linger=0)
            control.close(linger=0)
            log.info("broker_stopped")

    def _worker_ended(self, task: asyncio.Task[None]) -> None:
        """A worker on this loop must not die quietly: stop the broker with its error."""
        if task.cancelled() or self._finished.done():
            return
        error = task.exception() or RuntimeError("worker stopped")
        if not self._stopping:
            log.error("worker_died", error=repr(error))
            self._finished.set_exception(error)

    def _on_event(self) -> None:
        """One turn: read what is ready, expire, dispatch, re-arm. Runs on every FD wake-up and timer."""
        if self._finished.done():
            return
        try:
            self._turn()
        except Exception as e:
            self._finished.set_exception(e)

    def _turn(self) -> None:
        frontend, backend, control = self._frontend, self._backend, self._control
        assert frontend is not None
        assert backend is not None
        assert control is not None
        more = True
        while more:
            more = False
            if readable(backend):
                self._from_workers(backend)
            if readable(frontend):
                more = self._from_clients(frontend)
            if readable(control):
                control.recv()
                self._begin_stop()
            now = time.monotonic()
            if self.queue.depth:
                for h in self.queue.expire(now):
                    self._refuse(h, "EXPIRED", "lifetime ended before a worker was free", "expired")
            self._dispatch(backend, now)
            if self._stopping and ((not self.queue.depth and not self._inflight) or now >= self._drain_deadline):
                self._finish(frontend)
                self._finished.set_result(None)
                return
            if more:  # yield to the workers on this loop before the next client batch
                self._loop.call_soon(self._on_event)
                break
        else:
            # Our own sends may have swallowed an FD edge: look once more.
            if readable(backend) or readable(frontend) or readable(control):
                self._loop.call_soon(self._on_event)
        self._arm_timer()

    def _arm_timer(self) -> None:
        """Wake at the next queue deadline (or soon, while draining)."""
        if self._stopping:
            when: float | None = time.monotonic() + STOP_POLL_S
        else:
            when = self.queue.next_deadline() if self.queue.depth else None
        if when is None:
            return
        if self._timer is not None:
            if self._timer.when() <= when and not self._timer.cancelled():
                return
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._on_event()

    # -- clients ---------------------------------------------------------------

    def _from_clients(self, frontend: zmq.Socket[Any]) -> bool:
        """Accept up to one batch; True when more may be waiting."""
        for _ in range(CLIENT_BATCH):
            if not readable(frontend):  # cheaper than catching zmq.Again
                return False
            self._accept(recv_frames(frontend), time.monotonic())
        return True

    def _accept(self, frames: list[bytes], now: float) -> None:
        # [identity, (empty delimiter from a REQ client), header, body]
        split = 2 if len(frames) > 2 and frames[1] == b"" else 1
        envelope, payload = frames[:split], frames[split:]
        if len(payload) != 2:
            first = payload[0] if payload else b""
            self._bad_input(envelope, first, "BAD_FRAMES", f"expected 2 frames (header, body), got {len(payload)}")
            return
        header_frame, body = payload
        try:
            header = decode_header(header_frame)
        except ProtocolError as e:
            self._bad_input(envelope, header_frame, e.transport_error, str(e))
            return
        if header.transport_error:
            self._bad_input(envelope, header_frame, "BAD_HEADER", "transport_error must be 0 from clients")
            return
        if header.type in _INTERNAL:
            self._bad_input(envelope, header_frame, "UNKNOWN_TYPE", f"type {header.type} is internal")
            return
        no_reply = frame_no_reply(header_frame)
        if len(body) > self._settings.max_body_bytes:
            self._bad_input(
                envelope,
                header_frame,
                "BODY_TOO_LARGE",
                f"body is {len(body)} bytes, limit {self._settings.max_body_bytes}",
            )
            return
        if self._stopping:
            self._answer_error(envelope, header, "SHUTTING_DOWN", "service is stopping", no_reply)
            self._rejections["shutting_down"].inc()
            return
        if header.type == _PING:
            try:  # its body is checked like any other (unknown fields are ignored)
                decode_body(body, max_bytes=self._settings.max_body_bytes)
            except ProtocolError as e:
                self._bad_input(envelope, header_frame, e.transport_error, str(e))
                return
            if not no_reply:
                self._send(
                    envelope,
                    encode_header(header.reply()),
                    encode_body({"status": STATUS["OK"], "time_ms": int(time.time() * 1000)}),
                )
            self._count(header.type, "OK")
            self._durations[header.type].observe(time.monotonic() - now)
            return
        self._enqueue(envelope, header, header_frame, body, no_reply=no_reply, now=now)

    def _enqueue(
        self, envelope: list[bytes], header: Header, header_frame: bytes, body: bytes, *, no_reply: bool, now: float
    ) -> None:
        """Queue a message (from a client, or made by a worker: no envelope, no reply)."""
        spec = REGISTRY.types_by_id[header.type]
        lifetime_s = min(header.lifetime_ms / 1000 if header.lifetime_ms else spec.lifetime_ms / 1000, _MAX_LIFETIME_S)
        h = Holder(
            seq=next(self._seq),
            priority=spec.priority,
            type_id=header.type,
            arrived=now,
            deadline=now + lifetime_s,
            envelope=envelope,
            header=header_frame,
            body=body,
            no_reply=no_reply,
        )
        try:
            victim = self.queue.push(h)
        except QueueFull:
            self._refuse(h, "QUEUE_FULL", f"queue full ({self.queue.capacity})", "full")
            return
        if victim is not None:
            self._refuse(victim, "QUEUE_FULL", "evicted by a more urgent message", "evicted")

    def _bad_input(self, envelope: list[bytes], header_frame: bytes, error: str, message: str) -> None:
        self._metrics.bad_input.labels(error).inc()
        header = loose_header(header_frame)
        self._answer_error(envelope, header, error, message, frame_no_reply(header_frame))

    def _refuse(self, h: Holder, error: str, message: str, reason: str | None, *, cache: bool = True) -> None:
        """Answer a holder with a transport error: the cheap path, it runs at overload rates.

        ``reason`` counts a queue rejection; ``cache`` keeps the encoded body
        for the next refusal with the same message (only fixed messages).
        """
        if reason is not None:
            self._rejections[reason].inc()
        self._count(h.type_id, error)
        if not h.no_reply:
            body = self._error_bodies.get((error, message)) if cache else None
            if body is None:
                body = encode_body(error_body("ERROR", error, message))
                if cache:
                    self._error_bodies[(error, message)] = body
            self._send(h.envelope, with_transport_error(h.header, TRANSPORT_ERROR[error]), body)
        self._durations[h.type_id].observe(time.monotonic() - h.arrived)

    def _answer_error(self, envelope: list[bytes], header: Header, error: str, message: str, no_reply: bool) -> None:
        self._count(header.type, error)
        if no_reply:
            return
        h = header.reply(transport_error=TRANSPORT_ERROR[error], flags=FLAG_DATA_ERROR)
        frame = encode_header(h)
        if header.type in REGISTRY.types_by_id:  # a SESSION_CREATE refusal carries no session id
            frame = with_transport_error(frame, h.transport_error)
        self._send(envelope, frame, encode_body(error_body("ERROR", error, message)))

    def _send(self, envelope: list[bytes], header: bytes, body: bytes) -> None:
        assert self._frontend is not None
        try:
            send_frames(self._frontend, [*envelope, header, body], block=False)
        except zmq.Again:
            self._metrics.dropped_replies.labels("client_backlog").inc()
        except zmq.ZMQError as e:
            if e.errno != errno.EHOSTUNREACH:
                raise
            self._metrics.dropped_replies.labels("client_gone").inc()

    def _count(self, type_id: int, outcome: str) -> None:
        key = (type_id, outcome)
        child = self._outcomes.get(key)
        if child is None:
            name = self._type_names.get(type_id, "UNKNOWN")
            child = self._outcomes[key] = self._metrics.messages.labels(name, outcome)
        child.inc()

    # -- workers ---------------------------------------------------------------

    def _from_workers(self, backend: zmq.Socket[Any]) -> None:
        free, inflight, queue, now = self._free, self._inflight, self.queue, time.monotonic()
        while readable(backend):
            wid = backend.recv(NOBLOCK)  # workers send exactly [identity, batch]
            items = inproc.unpack(backend.recv(0))
            for i in range(0, len(items) - 3, inproc.TO_BROKER):
                kind = items[i]
                if kind == inproc.READY:
                    slots = inproc.CREDIT.unpack(items[i + 1])[0]
                    free.extend([wid] * slots)
                    log.info("worker_ready", worker=wid.decode(), slots=slots)
                    continue
                if kind == inproc.ENQUEUE:
                    self._from_worker_enqueue(items[i + 1], items[i + 2], now)
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
                    if not h.no_reply:
                        self._send(h.envelope, items[i + 2], items[i + 3])
                    self._durations[h.type_id].observe(now - h.arrived)
                elif kind == inproc.FAIL:
                    self._refuse(h, items[i + 2].decode(), items[i + 3].decode(), None, cache=False)
                elif kind == inproc.DONE:
                    self._durations[h.type_id].observe(now - h.arrived)
                else:
                    log.error("worker_protocol_error", kind=kind)
                    self._refuse(h, "INTERNAL", "internal error: unknown worker answer", None)

    def _from_worker_enqueue(self, header_frame: bytes, body: bytes, now: float) -> None:
        if self._stopping:
            self._rejections["shutting_down"].inc()
            return
        self._enqueue([], decode_header(header_frame), header_frame, body, no_reply=True, now=now)

    def _dispatch(self, backend: zmq.Socket[Any], now: float) -> None:
        free, queue, inflight = self._free, self.queue, self._inflight
        batches: dict[bytes, list[bytes]] = {}
        while free and queue.depth:
            h = queue.pop_ready()
            if h is None:
                break
            left_ms = int((h.deadline - now) * 1000)
            if left_ms <= 0:
                queue.done(h)
                self._refuse(h, "EXPIRED", "lifetime ended before a worker was free", "expired")
                continue
            ticket = inproc.TICKET.pack(h.seq, left_ms)
            inflight[ticket] = h
            wid = h.worker = free.popleft()
            batch = batches.get(wid)
            if batch is None:
                batches[wid] = [ticket, h.header, h.body]
            else:
                batch += (ticket, h.header, h.body)
        for wid, items in batches.items():
            send_frames(backend, [wid, inproc.pack(items)])

    def _watchdog(self) -> None:
        """Answer and take back every slot held past its message's deadline + grace (should be none)."""
        if self._finished.done():
            return
        now = time.monotonic()
        overdue = [t for t, h in self._inflight.items() if h.deadline + WATCHDOG_GRACE_S < now]
        for ticket in overdue:
            h = self._inflight.pop(ticket)
            self.queue.done(h)
            self._free.append(h.worker)
            self._reclaimed[ticket] = None
            if len(self._reclaimed) > RECLAIMED_KEPT:
                self._reclaimed.popitem(last=False)
            self._metrics.watchdog_reclaimed.inc()
            log.error("watchdog_reclaimed", type=self._type_names[h.type_id], late_s=round(now - h.deadline, 3))
            self._refuse(h, "OUTCOME_UNKNOWN", "the worker did not answer within the lifetime", None)
        if overdue:
            self._on_event()  # the freed slots may take queued messages now
        self._loop.call_later(WATCHDOG_PERIOD_S, self._watchdog)

    # -- shutdown --------------------------------------------------------------

    def _begin_stop(self) -> None:
        if not self._stopping:
            self._stopping = True
            self._drain_deadline = time.monotonic() + self._settings.drain_timeout_s
            log.info(
                "broker_draining",
                queued=len(self.queue),
                running=len(self._inflight),
                drain_timeout_s=self._settings.drain_timeout_s,
            )

    def _finish(self, frontend: zmq.Socket[Any]) -> None:
        left = list(self.queue.drain())
        for h in left:
            self._refuse(h, "SHUTTING_DOWN", "service stopped before this message ran", "shutting_down")
        for h in self._inflight.values():
            self.queue.done(h)
            self._refuse(h, "OUTCOME_UNKNOWN", "service stopped while this message was executing", "shutting_down")
        if left or self._inflight:
            log.warning("broker_drain_incomplete", queued=len(left), running=len(self._inflight))
        self._inflight.clear()
        # Whatever clients sent before we stopped listening still gets its answer (SHUTTING_DOWN).
        for _ in range(FINAL_READ_BATCHES):
            if not self._from_clients(frontend):
                break
