"""The worker pool: a few threads, each running an event loop that serves many worker slots.

A worker slot is one message in progress. Each :class:`WorkerThread` owns a
DEALER socket to the broker's ``inproc://workers`` ROUTER and one pipelined
Tarantool connection, announces its slots with READY (credit), and handles
every message it is given as a task on its loop. The broker never gives a
thread more messages than it has free slots, so the pool's size is fixed.

Worker to broker frames::

    [READY, slots:u32]                  credit: this many slots are free
    [R, ticket, header, body]           reply to send to the client; frees a slot
    [D, ticket]                         done, nothing to send (NO_REPLY); frees a slot
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
import time
from typing import Any

import structlog
import zmq

from service.config import Settings
from service.errors import ProtocolError, StorageUnavailable
from service.handlers import HANDLERS, Handler, Request
from service.metrics import Metrics
from service.protocol import (
    FLAG_DATA_ERROR,
    FLAG_NO_REPLY,
    NO_SESSION,
    REGISTRY,
    STATUS,
    TRANSPORT_ERROR,
    Header,
    decode_body,
    decode_header,
    encode_body,
    encode_header,
    error_body,
)
from service.storage import Storage

log = structlog.get_logger("workers")

WORKERS_ENDPOINT = "inproc://workers"
READY, REPLY, DONE = b"READY", b"R", b"D"
#: broker -> worker ticket frame: holder sequence number, milliseconds of lifetime left
TICKET = struct.Struct("!QI")
CREDIT = struct.Struct("!I")
STOP_GRACE_S = 5.0


def error_reply(header: Header, transport_error: str, message: str) -> tuple[bytes, bytes]:
    """Header and body frames of a transport error answer to header."""
    h = header.reply(transport_error=TRANSPORT_ERROR[transport_error], flags=FLAG_DATA_ERROR)
    return encode_header(h), encode_body(error_body("ERROR", transport_error, message))


class WorkerThread:
    """One thread, one event loop, one Tarantool connection, ``slots`` worker slots."""

    def __init__(self, *, index: int, slots: int, settings: Settings, context: zmq.Context[Any],
                 metrics: Metrics, handlers: dict[str, Handler] | None = None) -> None:
        self.index = index
        self.slots = slots
        self._settings = settings
        self._ctx = context
        self._metrics = metrics
        self._handlers = HANDLERS if handlers is None else handlers
        self._thread = threading.Thread(target=self._run, name=f"worker-{index}", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._started = threading.Event()
        self._sock: zmq.Socket[Any] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._outcomes: dict[tuple[str, str], Any] = {}
        self.storage: Storage | None = None

    def start(self) -> None:
        self._thread.start()
        self._started.wait()

    def stop(self) -> None:
        """Ask the loop to finish its tasks (up to a grace period) and exit."""
        if self._loop is not None and self._stopping is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                self._loop.call_soon_threadsafe(self._stopping.set)

    def join(self, timeout_s: float | None = None) -> None:
        self._thread.join(timeout_s)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self.storage = Storage(settings=self._settings, metrics=self._metrics)
        sock = self._sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, b"w%d" % self.index)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.connect(WORKERS_ENDPOINT)
        self._started.set()
        await self.storage.start()
        sock.send_multipart([READY, CREDIT.pack(self.slots)])
        self._loop.add_reader(sock.getsockopt(zmq.FD), self._pump)
        self._pump()
        try:
            await self._stopping.wait()
        finally:
            self._loop.remove_reader(sock.getsockopt(zmq.FD))
            if self._tasks:
                await asyncio.wait(self._tasks, timeout=STOP_GRACE_S)
            await self.storage.close()
            sock.close()

    def _pump(self) -> None:
        """Take every message waiting on the socket (its FD is edge-triggered)."""
        sock = self._sock
        assert sock is not None
        while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            frames = sock.recv_multipart(zmq.NOBLOCK)
            task = asyncio.get_running_loop().create_task(self._handle(frames))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _send(self, frames: list[bytes]) -> None:
        assert self._sock is not None
        self._sock.send_multipart(frames)
        self._pump()

    async def _handle(self, frames: list[bytes]) -> None:
        ticket, header_frame, body_frame = frames
        _, left_ms = TICKET.unpack(ticket)
        header = decode_header(header_frame)  # validated by the broker; cheap
        spec = REGISTRY.types_by_id[header.type]
        reply, outcome = await self._execute(header, spec.name, body_frame, left_ms / 1000)
        self._count(spec.name, outcome)
        if reply is None or header.flags & FLAG_NO_REPLY:
            self._send([DONE, ticket])
        else:
            self._send([REPLY, ticket, *reply])

    async def _execute(self, header: Header, type_name: str, body_frame: bytes,
                       timeout_s: float) -> tuple[tuple[bytes, bytes] | None, str]:
        """Run one message; returns (reply frames or None, outcome name)."""
        spec = REGISTRY.types[type_name]
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
            req = Request(header=header, spec=spec, body=body, timeout_s=timeout_s)
            assert self.storage is not None
            try:
                result = await handler(req, self.storage)
            except StorageUnavailable as e:
                return error_reply(header, "STORAGE_UNAVAILABLE", str(e)), "STORAGE_UNAVAILABLE"
            except Exception as e:
                log.exception("handler_failed", type=type_name, request_id=header.request_id)
                return error_reply(header, "INTERNAL", f"{type(e).__name__}: {e}"), "INTERNAL"
            if req.reply_session is not None:
                header = header._replace(session_id=req.reply_session)
        status = result["status"]
        result["status"] = STATUS[status]
        if log_debug_enabled():
            log.debug("request_done", type=type_name, request_id=header.request_id, status=status)
        return (encode_header(header.reply()), encode_body(result)), status

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


_debug = False


def log_debug_enabled() -> bool:
    return _debug


def set_debug(enabled: bool) -> None:
    """Per-request DEBUG lines are built only when enabled (hot path)."""
    global _debug
    _debug = enabled


class WorkerPool:
    """``settings.workers`` slots spread over ``settings.worker_threads`` threads."""

    def __init__(self, *, settings: Settings, context: zmq.Context[Any], metrics: Metrics,
                 handlers: dict[str, Handler] | None = None) -> None:
        n = settings.worker_threads
        sizes = [settings.workers // n + (1 if i < settings.workers % n else 0) for i in range(n)]
        self.threads = [WorkerThread(index=i, slots=s, settings=settings, context=context, metrics=metrics,
                                     handlers=handlers) for i, s in enumerate(sizes)]
        metrics.workers.set(settings.workers)

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        for t in self.threads:
            t.stop()

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
