"""The broker: one thread, two ROUTER sockets, one poll loop.

Clients talk to ``settings.listen`` (tcp); worker threads to
``inproc://workers``. The broker parses and validates headers only, answers
PING itself, queues everything else in the priority queue, and hands the most
urgent message to a free worker slot. It does no business logic. Replies come
back through it to the client address saved in the message's holder.

Shutdown (``stop``): new messages are answered SHUTTING_DOWN; queued and
running ones get up to ``drain_timeout_s`` to finish; whatever is left is
answered SHUTTING_DOWN; then the sockets close, flushing replies. Every
accepted message gets exactly one answer (none for NO_REPLY ones).
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import structlog
import zmq

from service import eventloop
from service.config import Settings
from service.errors import ProtocolError
from service.metrics import REJECTION_REASONS, Metrics
from service.protocol import (
    FLAG_DATA_ERROR,
    FLAG_NO_REPLY,
    REGISTRY,
    STATUS,
    TRANSPORT_ERROR,
    Header,
    decode_header,
    encode_body,
    encode_header,
    error_body,
    loose_header,
)
from service.queue import Holder, PriorityQueue, QueueFull
from service.workers import CREDIT, DONE, ENQUEUE, READY, REPLY, TICKET, WORKERS_ENDPOINT, Worker
from service.zmqio import NOBLOCK, pack_batch, readable, recv_frames, send_frames, unpack_batch

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
#: transport_error (u16) and flags (u8) at offset 4 of the header
_ERROR_FIELDS = struct.Struct("!HB")
FLUSH_LINGER_MS = 2000
_PING = REGISTRY.types["PING"].id
_APP_START = REGISTRY.types["APP_START"].id
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
            backend.bind(WORKERS_ENDPOINT)
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
            self._bad_input(
                envelope,
                payload[0] if payload else b"",
                "BAD_FRAMES",
                f"expected 2 frames (header, body), got {len(payload)}",
            )
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
        no_reply = bool(header.flags & FLAG_NO_REPLY) or header.type == _APP_START
        if len(body) > self._settings.max_body_bytes:
            self._bad_input(
                envelope,
                header_frame,
                "BODY_TOO_LARGE",
                f"body is {len(body)} bytes, limit {self._settings.max_body_bytes}",
                no_reply,
            )
            return
        if self._stopping:
            self._answer_error(envelope, header, "SHUTTING_DOWN", "service is stopping", no_reply)
            self._rejections["shutting_down"].inc()
            return
        if header.type == _PING:
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

    def _bad_input(
        self, envelope: list[bytes], header_frame: bytes, error: str, message: str, no_reply: bool = False
    ) -> None:
        self._metrics.bad_input.labels(error).inc()
        header = loose_header(header_frame)
        self._answer_error(envelope, header, error, message, no_reply)

    def _refuse(self, h: Holder, error: str, message: str, reason: str) -> None:
        """Answer a holder that will not be executed: the cheap path, it runs at overload rates."""
        self._rejections[reason].inc()
        self._count(h.type_id, error)
        if not h.no_reply:
            # The holder's header was validated: patch transport_error and flags in place.
            frame = h.header
            header = frame[:4] + _ERROR_FIELDS.pack(TRANSPORT_ERROR[error], FLAG_DATA_ERROR) + frame[7:]
            body = self._error_bodies.get((error, message))
            if body is None:
                body = self._error_bodies[(error, message)] = encode_body(error_body("ERROR", error, message))
            self._send(h.envelope, header, body)
        self._durations[h.type_id].observe(time.monotonic() - h.arrived)

    def _answer_error(self, envelope: list[bytes], header: Header, error: str, message: str, no_reply: bool) -> None:
        self._count(header.type, error)
        if no_reply:
            return
        h = header.reply(transport_error=TRANSPORT_ERROR[error], flags=FLAG_DATA_ERROR)
        self._send(envelope, encode_header(h), encode_body(error_body("ERROR", error, message)))

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
            frames = unpack_batch(backend.recv(0))
            for i in range(0, len(frames) - 3, 4):
                kind = frames[i]
                if kind == READY:
                    slots = CREDIT.unpack(frames[i + 1])[0]
                    free.extend([wid] * slots)
                    log.info("worker_ready", worker=wid.decode(), slots=slots)
                    continue
                if kind == ENQUEUE:
                    self._from_worker_enqueue(frames[i + 1], frames[i + 2], now)
                    continue
                free.append(wid)
                h = inflight.pop(frames[i + 1], None)
                if h is None:  # already answered SHUTTING_DOWN at the drain deadline
                    continue
                queue.done(h)
                if kind == REPLY and not h.no_reply:
                    self._send(h.envelope, frames[i + 2], frames[i + 3])
                elif kind not in (DONE, REPLY):
                    log.error("worker_protocol_error", kind=kind)
                self._durations[h.type_id].observe(now - h.arrived)

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
            ticket = TICKET.pack(h.seq, left_ms)
            inflight[ticket] = h
            wid = free.popleft()
            batch = batches.get(wid)
            if batch is None:
                batches[wid] = [ticket, h.header, h.body]
            else:
                batch += (ticket, h.header, h.body)
        for wid, items in batches.items():
            send_frames(backend, [wid, pack_batch(items)])

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
            self._refuse(h, "SHUTTING_DOWN", "service stopped before this message finished", "shutting_down")
        if left or self._inflight:
            log.warning("broker_drain_incomplete", queued=len(left), running=len(self._inflight))
        self._inflight.clear()
        # Whatever clients sent before we stopped listening still gets its answer (SHUTTING_DOWN).
        for _ in range(FINAL_READ_BATCHES):
            if not self._from_clients(frontend):
                break
