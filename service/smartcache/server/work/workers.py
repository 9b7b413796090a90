"""The worker pool: worker slots served by event loops over pipelined Tarantool connections.

A worker slot is one message in progress. Each :class:`Worker` talks the
inproc protocol (service/smartcache/server/broker/inproc.py) with the broker and owns a :class:`Storage`
connection; it announces its slots with READY (credit) at once, whatever
storage does, and runs every message it is given as an asyncio task
(:func:`smartcache.server.work.execute.execute`). The broker never gives a worker more
messages than it has free slots, so the pool's size is fixed.

By default the one worker runs on the broker's own event loop
(``SMARTCACHE_WORKER_THREADS=0``) and exchanges its batches with the broker
by direct call (:class:`smartcache.server.broker.inproc.Direct`); with N > 0 each of N workers
has a :class:`WorkerThread` with a loop of its own and a DEALER socket to the
broker's ``inproc://workers`` ROUTER (measured slower here: a GIL hand-off per
message).

Exactly one answer per message, by construction: the answer is sent by the
task's done callback, which asyncio runs exactly once per task whatever
happened to it -- finished, raised, cancelled at its deadline, even
cancelled before it started (then its coroutine never ran, and no
``try``/``finally`` inside it would have). The callback sends REPLY, DONE or
FAIL for the message's ticket, and falls back to a prebuilt FAIL if building
the answer itself fails. A task whose message outlives its lifetime is
cancelled by one sweep per loop: it is answered ``EXPIRED`` if it never
reached storage, ``OUTCOME_UNKNOWN`` if it did.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog
import zmq

from smartcache.server import eventloop, logs
from smartcache.server.broker import inproc
from smartcache.server.config import Settings
from smartcache.server.corebackend import CoreBackend
from smartcache.server.deadlines import DEADLINE_SWEEP_S, STOP_GRACE_S
from smartcache.server.handlers import Context, Handler
from smartcache.server.handlers.routes import ALL_HANDLERS
from smartcache.server.job import Job
from smartcache.server.metrics import Metrics, label
from smartcache.server.sessionids import KeyCheck, SessionIds
from smartcache.server.storage import AnyStorage, ShardRouter, Storage
from smartcache.server.work.execute import Answer, execute, failure
from smartcache.server.zmqio import NOBLOCK, readable
from smartcache.wire import (
    FLAG_NO_REPLY,
    NO_SESSION,
    REGISTRY,
    Header,
    encode_body,
    encode_header,
    frame_flags,
    frame_request_id,
    frame_type,
)

log = structlog.get_logger("workers")

#: the answer when building the answer failed: (error, message)
_FALLBACK = (b"INTERNAL", b"internal error while answering; see the service log")


def _storage_of(settings: Settings, metrics: Metrics) -> AnyStorage:
    """The instances from etcd: a router that finds at start whether the cluster is sharded; else the list."""
    if settings.discovery:
        return ShardRouter(
            settings=settings, metrics=metrics, make_storage=lambda s: Storage(settings=s, metrics=metrics)
        )
    return Storage(settings=settings, metrics=metrics)


class Worker:
    """``slots`` worker slots served by one event loop over one Tarantool connection.

    ``run`` is a coroutine: a :class:`WorkerThread` runs it on a loop of its
    own, or the broker runs it on the broker's loop (``worker_threads = 0``),
    which saves every thread switch on the hot path.
    """

    #: what the broker calls it when it runs on the broker's loop (a crash logs ``worker_died``)
    role = "worker"

    def __init__(
        self,
        *,
        index: int,
        slots: int,
        settings: Settings,
        context: zmq.Context[Any],
        metrics: Metrics,
        handlers: dict[str, Handler] | None = None,
        introspect: Callable[[], dict[str, Any]] = dict,
        direct: bool = False,
        storage: Callable[[], AnyStorage] | None = None,
        sessions: SessionIds | None = None,
        check_key: bool = False,
    ) -> None:
        """direct: the worker runs on the broker's loop and talks to it through ``self.link`` (no socket).
        storage: makes the worker's storage once its loop runs (default: a :class:`Storage` of the
        settings' instances; unit tests give a stub). sessions: the service's session key (shared by its
        workers); check_key: this worker checks it with storage (one per process)."""
        self.sessions = sessions or SessionIds(settings)
        self._check_key = check_key
        self._key_check: asyncio.Task[None] | None = None
        self._make_storage = storage or (lambda: _storage_of(settings, metrics))
        self.index = index
        self._introspect = introspect
        self.slots = slots
        self._settings = settings
        self._ctx = context
        self._metrics = metrics
        self._handlers = ALL_HANDLERS if handlers is None else handlers
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._sock: zmq.Socket[Any] | None = None
        self._outcomes: dict[tuple[int, str], Any] = {}
        self._outbox: list[bytes] = []
        #: running task -> its job; swept every DEADLINE_SWEEP_S
        self._jobs: dict[asyncio.Task[Answer], Job] = {}
        self.storage: AnyStorage | None = None
        self._handler_context: Context | None = None
        self._ids = 0
        self.identity = b"w%d" % index
        #: the broker's direct link (a worker on its loop), or None: the inproc socket
        self.link = inproc.Direct(self.identity, self._take) if direct else None

    def stop(self) -> None:
        """Ask the loop to finish this worker's tasks (up to a grace period); safe from any thread."""
        if self._loop is not None and self._stopping is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                self._loop.call_soon_threadsafe(self._stopping.set)

    async def run(self, on_connected: Callable[[], None] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self.storage = self._make_storage()
        backend = CoreBackend(settings=self._settings, metrics=self._metrics)
        self._handler_context = Context(
            storage=self.storage,
            backend=backend,
            settings=self._settings,
            metrics=self._metrics,
            enqueue=self.enqueue,
            owner_prefix=f"{self._settings.instance_id}/w{self.index}",
            introspect=self._introspect,
            sessions=self.sessions,
        )
        await self.storage.start()  # returns at once; connects in the background
        if self._check_key:
            self._key_check = asyncio.ensure_future(KeyCheck(self.sessions).run(self.storage))
        # Slots are offered at once: with storage down, messages are answered
        # STORAGE_UNAVAILABLE at once instead of waiting in the queue.
        ready = [inproc.READY, inproc.CREDIT.pack(self.slots), b"", b""]
        if self.link is not None:
            self.link.send(ready)
            await self._serve(backend)
            return
        sock = self._sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self.identity)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.connect(inproc.ENDPOINT)
        if on_connected is not None:
            on_connected()
        sock.send(inproc.pack(ready))
        self._loop.add_reader(sock.getsockopt(zmq.FD), self._pump)
        self._pump()
        try:
            await self._serve(backend)
        finally:
            self._loop.remove_reader(sock.getsockopt(zmq.FD))
            sock.close()

    async def _serve(self, backend: CoreBackend) -> None:
        """Sweep deadlines until stopped; then let running tasks end (up to a grace period), send their
        answers and close the connections."""
        assert self._stopping is not None
        assert self.storage is not None
        asyncio.get_running_loop().call_later(DEADLINE_SWEEP_S, self._sweep)
        try:
            await self._stopping.wait()
        finally:
            if self._key_check is not None:
                self._key_check.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._key_check
            if self._jobs:
                await asyncio.wait(list(self._jobs), timeout=STOP_GRACE_S)
            if self._outbox:
                self._flush()
            await self.storage.close()
            await backend.close()

    def _pump(self) -> None:
        """Take every batch waiting on the socket (its FD is edge-triggered)."""
        sock = self._sock
        assert sock is not None
        while readable(sock):
            self._take(inproc.unpack(sock.recv(NOBLOCK)))  # the broker sends one batch frame

    def _take(self, items: list[bytes]) -> None:
        """One batch from the broker: a task per message."""
        loop = self._loop
        assert loop is not None
        now = loop.time()
        jobs, run, answer = self._jobs, self._run_job, self._answer
        for i in range(0, len(items) - 2, inproc.TO_WORKER):
            ticket = items[i]
            left_ms = inproc.TICKET.unpack(ticket)[1]
            job = Job(ticket, items[i + 1], items[i + 2], now + left_ms / 1000)
            task = loop.create_task(run(job))
            jobs[task] = job
            task.add_done_callback(answer)

    async def _run_job(self, job: Job) -> Answer:
        logs.message_header.set(job.header)  # every line logged for this message carries its request_id
        assert self._handler_context is not None
        return await execute(job, self._handler_context, self._handlers, self._settings.max_body_bytes)

    def _answer(self, task: asyncio.Task[Answer]) -> None:
        """The task's done callback: exactly one REPLY, DONE or FAIL for its ticket."""
        job = self._jobs.pop(task)
        try:
            if task.cancelled():
                answer = self._unfinished(job)
            elif (exc := task.exception()) is not None:
                answer = self._internal(job, exc)
            else:
                answer = task.result()
            if answer.error is not None:  # the broker answers it, and counts it then
                item = [inproc.FAIL, job.ticket, answer.error.encode(), answer.message.encode()]
            elif answer.frames is None or frame_flags(job.header) & FLAG_NO_REPLY:
                self._count(job, answer.outcome)
                item = [inproc.DONE, job.ticket, b"", b""]
            else:
                self._count(job, answer.outcome)
                item = [inproc.MISS if answer.miss else inproc.REPLY, job.ticket, *answer.frames]
        except Exception:  # building the answer failed: still answer, and say so in the log
            log.exception("answer_failed")
            item = [inproc.FAIL, job.ticket, *_FALLBACK]
        self._send(item)

    def _unfinished(self, job: Job) -> Answer:
        """A task cancelled at its deadline (or at stop): say whether it may have run."""
        if job.reached_storage:
            return failure("OUTCOME_UNKNOWN", "lifetime ended while storage was executing it; it may have been applied")
        return failure("EXPIRED", "lifetime ended before it was executed")

    def _internal(self, job: Job, exc: BaseException) -> Answer:
        """An unexpected failure: the client gets an error id, the log the traceback (no request data)."""
        error_id = secrets.token_hex(6)
        self._metrics.internal_errors.inc()
        type_name = REGISTRY.types_by_id[frame_type(job.header)].name
        # The done callback runs outside the task's context: bind the request id here.
        log.error(
            "handler_failed", error_id=error_id, request_id=frame_request_id(job.header), type=type_name, exc_info=exc
        )
        return failure("INTERNAL", f"internal error {error_id}")

    def enqueue(self, type_name: str, body: dict[str, Any], session_id: bytes = NO_SESSION) -> None:
        """Put an internal message into the broker's queue (no client, no reply)."""
        self._ids += 1
        h = Header.request(REGISTRY.types[type_name].id, request_id=self._ids, session_id=session_id)
        self._send([inproc.ENQUEUE, encode_header(h), encode_body(body), b""])

    def _sweep(self) -> None:
        """Cancel tasks whose message lifetime ended (one timer per loop, not one per call)."""
        assert self._loop is not None
        now = self._loop.time()
        for task, job in self._jobs.items():
            if job.deadline <= now:
                task.cancel()  # idempotent; the done callback answers
        if self._stopping is not None and not self._stopping.is_set():
            self._loop.call_later(DEADLINE_SWEEP_S, self._sweep)

    def _send(self, item: list[bytes]) -> None:
        """Queue one 4-field item for the broker; flushed once per loop turn."""
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.extend(item)

    def _flush(self) -> None:
        out, self._outbox = self._outbox, []
        if self.link is not None:
            if out:
                self.link.send(out)
            return
        assert self._sock is not None
        if out:
            self._sock.send(inproc.pack(out))
        self._pump()

    def _count(self, job: Job, outcome: str) -> None:
        """Messages the worker answered itself (FAIL ones are counted by the broker)."""
        key = (frame_type(job.header), outcome)
        child = self._outcomes.get(key)
        if child is None:
            name = REGISTRY.types_by_id[key[0]].name
            child = self._outcomes[key] = self._metrics.messages.labels(label(name), label(outcome))
        child.inc()


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
        introspect: Callable[[], dict[str, Any]] = dict,
        sessions: SessionIds | None = None,
    ) -> None:
        n = max(1, settings.worker_threads)
        #: the session key the workers derive with, and whether the cluster agrees on it (worker 0 asks)
        self.sessions = sessions or SessionIds(settings)
        sizes = [settings.workers // n + (1 if i < settings.workers % n else 0) for i in range(n)]
        self.workers = [
            Worker(
                index=i,
                slots=s,
                settings=settings,
                context=context,
                metrics=metrics,
                handlers=handlers,
                introspect=introspect,
                direct=settings.worker_threads == 0,
                sessions=self.sessions,
                check_key=i == 0,
            )
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
