"""The worker pool: worker slots served by event loops over pipelined Tarantool connections.

A worker slot is one message in progress. Each :class:`Worker` owns a DEALER
socket to the broker's ``inproc://workers`` ROUTER and one pipelined
Tarantool connection, announces its slots with READY (credit), and handles
every message it is given as a task on its loop. The broker never gives a
worker more messages than it has free slots, so the pool's size is fixed.
By default the one worker runs on the broker's own loop
(``SMARTCACHE_WORKER_THREADS=0``); with N > 0 each of N workers has a
:class:`WorkerThread` (measured slower here: a GIL hand-off per message).

Both directions batch: one ZeroMQ frame (a msgpack array of byte strings,
see ``zmqio.pack_batch``) carries every item ready at that moment, which
saves several socket calls per message (the inproc hop cost more than the
work).

Broker to worker: ``[identity, batch]``, the batch in groups of 3, ``ticket, header, body``.
Worker to broker: one batch frame, in groups of 4::

    [READY, slots:u32, "", ""]          credit: this many slots are free
    [R, ticket, header, body]           reply to send to the client; frees a slot
    [D, ticket, "", ""]                 done, nothing to send (NO_REPLY); frees a slot
    [Q, header, body, ""]               queue a new internal message (prewarm fetches)
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog
import zmq
from structlog.contextvars import bind_contextvars

from service import eventloop
from service.backend import Backend
from service.config import Settings
from service.errors import ProtocolError, StorageUnavailable
from service.handlers import Context, Handler, Request
from service.metrics import Metrics
from service.prewarm import ALL_HANDLERS
from service.protocol import (
    FLAG_DATA_ERROR,
    FLAG_NO_REPLY,
    NO_SESSION,
    REGISTRY,
    STATUS,
    TRANSPORT_ERROR,
    Header,
    MessageSpec,
    decode_body,
    encode_body,
    encode_header,
    error_body,
    trusted_header,
)
from service.storage import Storage
from service.zmqio import NOBLOCK, pack_batch, readable, unpack_batch

log = structlog.get_logger("workers")

WORKERS_ENDPOINT = "inproc://workers"
READY, REPLY, DONE, ENQUEUE = b"READY", b"R", b"D", b"Q"
#: broker -> worker ticket frame: holder sequence number, milliseconds of lifetime left
TICKET = struct.Struct("!QI")
CREDIT = struct.Struct("!I")
STOP_GRACE_S = 5.0
DEADLINE_SWEEP_S = 0.02


def error_reply(header: Header, transport_error: str, message: str) -> tuple[bytes, bytes]:
    """Header and body frames of a transport error answer to header."""
    h = header.reply(transport_error=TRANSPORT_ERROR[transport_error], flags=FLAG_DATA_ERROR)
    return encode_header(h), encode_body(error_body("ERROR", transport_error, message))


class Worker:
    """``slots`` worker slots served by one event loop over one Tarantool connection.

    ``run`` is a coroutine: a :class:`WorkerThread` runs it on a loop of its
    own, or the broker runs it on the broker's loop (``worker_threads = 0``),
    which saves every thread switch on the hot path.
    """

    def __init__(
        self,
        *,
        index: int,
        slots: int,
        settings: Settings,
        context: zmq.Context[Any],
        metrics: Metrics,
        handlers: dict[str, Handler] | None = None,
    ) -> None:
        self.index = index
        self.slots = slots
        self._settings = settings
        self._ctx = context
        self._metrics = metrics
        self._handlers = ALL_HANDLERS if handlers is None else handlers
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._sock: zmq.Socket[Any] | None = None
        self._outcomes: dict[tuple[str, str], Any] = {}
        self._outbox: list[bytes] = []
        #: running task -> loop time its message's lifetime ends; swept every DEADLINE_SWEEP_S
        self._deadlines: dict[asyncio.Task[None], float] = {}
        self._timed_out: set[asyncio.Task[None]] = set()
        self.storage: Storage | None = None
        self._handler_context: Context | None = None
        self._ids = 0

    def stop(self) -> None:
        """Ask the loop to finish this worker's tasks (up to a grace period); safe from any thread."""
        if self._loop is not None and self._stopping is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                self._loop.call_soon_threadsafe(self._stopping.set)

    async def run(self, on_connected: Callable[[], None] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self.storage = Storage(settings=self._settings, metrics=self._metrics)
        backend = Backend(settings=self._settings, metrics=self._metrics)
        self._handler_context = Context(
            storage=self.storage,
            backend=backend,
            settings=self._settings,
            metrics=self._metrics,
            enqueue=self.enqueue,
            owner_prefix=f"{self._settings.instance_id}/w{self.index}",
        )
        sock = self._sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, b"w%d" % self.index)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.connect(WORKERS_ENDPOINT)
        if on_connected is not None:
            on_connected()
        await self.storage.start()
        sock.send(pack_batch([READY, CREDIT.pack(self.slots), b"", b""]))
        self._loop.add_reader(sock.getsockopt(zmq.FD), self._pump)
        self._pump()
        self._loop.call_later(DEADLINE_SWEEP_S, self._sweep)
        try:
            await self._stopping.wait()
        finally:
            self._loop.remove_reader(sock.getsockopt(zmq.FD))
            if self._deadlines:
                await asyncio.wait(list(self._deadlines), timeout=STOP_GRACE_S)
            if self._outbox:
                self._flush()
            await self.storage.close()
            await backend.close()
            sock.close()

    def _pump(self) -> None:
        """Take every message waiting on the socket (its FD is edge-triggered)."""
        sock = self._sock
        assert sock is not None
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadlines = self._deadlines
        while readable(sock):
            frames = unpack_batch(sock.recv(NOBLOCK))  # the broker sends one batch frame
            for i in range(0, len(frames) - 2, 3):
                ticket = frames[i]
                lifetime_s = TICKET.unpack(ticket)[1] / 1000
                task = loop.create_task(self._handle(ticket, frames[i + 1], frames[i + 2], lifetime_s))
                deadlines[task] = now + lifetime_s
                task.add_done_callback(self._forget)

    def enqueue(self, type_name: str, body: dict[str, Any]) -> None:
        """Put an internal message into the broker's queue (no client, no reply)."""
        self._ids += 1
        h = Header.request(REGISTRY.types[type_name].id, request_id=self._ids)
        self._send([ENQUEUE, encode_header(h), encode_body(body), b""])

    def _forget(self, task: asyncio.Task[None]) -> None:
        del self._deadlines[task]
        self._timed_out.discard(task)

    def _sweep(self) -> None:
        """Cancel tasks whose message lifetime ended (one timer per loop, not one per call)."""
        assert self._loop is not None
        now = self._loop.time()
        for task, deadline in self._deadlines.items():
            if deadline <= now and task not in self._timed_out:
                self._timed_out.add(task)
                task.cancel()
        if self._stopping is not None and not self._stopping.is_set():
            self._loop.call_later(DEADLINE_SWEEP_S, self._sweep)

    def _send(self, frames: list[bytes]) -> None:
        """Queue one 4-frame item for the broker; flushed once per loop turn."""
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.extend(frames)

    def _flush(self) -> None:
        assert self._sock is not None
        out, self._outbox = self._outbox, []
        self._sock.send(pack_batch(out))
        self._pump()

    async def _handle(self, ticket: bytes, header_frame: bytes, body_frame: bytes, lifetime_s: float) -> None:
        header = trusted_header(header_frame)  # the broker validated it
        spec = REGISTRY.types_by_id[header.type]
        # Every log line of this request (this task's context) carries its id.
        bind_contextvars(request_id=header.request_id)
        reply, outcome = await self._execute(header, header_frame, spec, body_frame, lifetime_s)
        self._count(spec.name, outcome)
        if reply is None or header.flags & FLAG_NO_REPLY:
            self._send([DONE, ticket, b"", b""])
        else:
            self._send([REPLY, ticket, *reply])

    async def _execute(
        self, header: Header, header_frame: bytes, spec: MessageSpec, body_frame: bytes, timeout_s: float
    ) -> tuple[tuple[bytes, bytes] | None, str]:
        """Run one message; returns (reply frames or None, outcome name)."""
        type_name = spec.name
        try:
            body = decode_body(body_frame, max_bytes=self._settings.max_body_bytes)
        except ProtocolError as e:
            self._metrics.bad_input.labels(e.transport_error).inc()
            return error_reply(header, e.transport_error, str(e)), e.transport_error
        problem = spec.check_request(body) or _session_problem(spec.session, header.session_id)
        handler = self._handlers.get(type_name)
        if problem is not None:
            result: dict[str, Any] = {"status": "BAD_REQUEST", "message": problem}
        elif handler is None:
            return error_reply(header, "INTERNAL", f"{type_name} is not implemented"), "INTERNAL"
        else:
            req = Request(header=header, body=body, timeout_s=timeout_s)
            assert self._handler_context is not None
            try:
                result = await handler(req, self._handler_context)
            except asyncio.CancelledError:
                if asyncio.current_task() not in self._timed_out:
                    raise
                message = f"no answer from storage within the message lifetime ({timeout_s * 1000:.0f} ms)"
                return error_reply(header, "STORAGE_UNAVAILABLE", message), "STORAGE_UNAVAILABLE"
            except StorageUnavailable as e:
                return error_reply(header, "STORAGE_UNAVAILABLE", str(e)), "STORAGE_UNAVAILABLE"
            except Exception as e:
                log.exception("handler_failed", type=type_name)
                return error_reply(header, "INTERNAL", f"{type(e).__name__}: {e}"), "INTERNAL"
            if req.reply_session is not None:
                header_frame = header_frame[:20] + req.reply_session  # session_id is the last 16 bytes
        status = result["status"]
        result["status"] = STATUS[status]
        flags = FLAG_DATA_ERROR if "error" in result else 0
        log.debug(  # a no-op below DEBUG (filtering logger)
            "request_done", type=type_name, status=status
        )
        # The reply header is the request's (transport_error is 0 in both) with the reply's flags.
        if flags != header.flags:
            header_frame = header_frame[:6] + bytes((flags,)) + header_frame[7:]
        return (header_frame, encode_body(result)), status

    def _count(self, type_name: str, outcome: str) -> None:
        key = (type_name, outcome)
        child = self._outcomes.get(key)
        if child is None:
            child = self._outcomes[key] = self._metrics.messages.labels(type_name, outcome)
        child.inc()


def _session_problem(rule: str, session_id: bytes) -> str | None:
    if rule == "required" and session_id == NO_SESSION:
        return "header session_id is required for this type"
    if rule == "none" and session_id != NO_SESSION:
        return "header session_id must be zero for this type"
    return None


class WorkerThread:
    """A thread running one :class:`Worker` on an event loop of its own."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"worker-{worker.index}", daemon=True)

    def _run(self) -> None:
        eventloop.run(self.worker.run(self._connected.set))

    def start(self) -> None:
        self._thread.start()
        self._connected.wait()

    def stop(self) -> None:
        self.worker.stop()

    def join(self, timeout_s: float | None = None) -> None:
        self._thread.join(timeout_s)


class WorkerPool:
    """``settings.workers`` slots spread over ``max(1, worker_threads)`` workers.

    With ``worker_threads = 0`` the single worker runs on the broker's loop
    (``local``); otherwise each worker has a thread of its own.
    """

    def __init__(
        self,
        *,
        settings: Settings,
        context: zmq.Context[Any],
        metrics: Metrics,
        handlers: dict[str, Handler] | None = None,
    ) -> None:
        n = max(1, settings.worker_threads)
        sizes = [settings.workers // n + (1 if i < settings.workers % n else 0) for i in range(n)]
        self.workers = [
            Worker(index=i, slots=s, settings=settings, context=context, metrics=metrics, handlers=handlers)
            for i, s in enumerate(sizes)
        ]
        self.local = self.workers if settings.worker_threads == 0 else []
        self.threads = [] if self.local else [WorkerThread(w) for w in self.workers]
        metrics.workers.set(settings.workers)

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        for w in self.workers:
            w.stop()

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
