"""The broker: one thread, two ROUTER sockets, one event loop.

Clients talk to ``settings.listen`` (tcp); workers on the broker's own loop
hand batches over by direct call (:class:`~smartcache.server.broker.inproc.Direct`),
worker threads through ``inproc://workers``. The broker validates headers
only, answers PING itself, queues everything else in the priority queue, and
hands the most urgent message to a free worker slot. It does no business
logic, and imports nothing of the workers, handlers or storage (``make lint``
checks it): what runs on its loop beside it is a :class:`Guest`. Three helpers
own the parts: :class:`~smartcache.server.broker.intake.Intake` (the door in:
validate, refuse, queue), :class:`~smartcache.server.broker.dispatch.Dispatcher`
(worker slots, dispatch, answers, the watchdog) and
:class:`~smartcache.server.broker.replies.Replies` (the door out: send, count),
which both others answer through; this module owns the thread, the sockets,
the loop and the shutdown order.

Every message gets exactly one answer (none when PROTOCOL.md's NO_REPLY rule
says so): the workers answer every message they take, and a watchdog checks
it -- a slot held past its message's deadline + ``WATCHDOG_GRACE_S`` (service/smartcache/server/deadlines.py) is
answered OUTCOME_UNKNOWN and taken back, counted in
``smartcache_watchdog_reclaimed_total`` (which should stay 0).

Shutdown (``stop``): new messages are answered SHUTTING_DOWN; queued and
running ones get up to ``drain_timeout_s`` to finish; whatever is left is
answered (queued: SHUTTING_DOWN, never executed; running: OUTCOME_UNKNOWN);
then the sockets close, flushing replies.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

import structlog
import zmq
from zmq.utils.monitor import recv_monitor_message

from smartcache.server import eventloop
from smartcache.server.broker import inproc
from smartcache.server.broker.dispatch import Dispatcher
from smartcache.server.broker.intake import Intake
from smartcache.server.broker.queue import PriorityQueue
from smartcache.server.broker.replies import Replies
from smartcache.server.config import Settings
from smartcache.server.deadlines import STOP_GRACE_S, WATCHDOG_PERIOD_S
from smartcache.server.metrics import Metrics, label
from smartcache.server.security import Curve
from smartcache.server.socketthread import SocketThread
from smartcache.server.zmqio import readable, recv_frames, recv_frames_with_user
from smartcache.wire import REGISTRY

log = structlog.get_logger("broker")

STOP_POLL_S = 0.02
CLIENT_BATCH = 512  # client messages read per loop turn, so workers' replies are not starved
FINAL_READ_BATCHES = 100  # at stop: up to this many batches already sent to us are answered
#: per client connection: a client that sends faster than we read is pushed back by TCP, not buffered here
FRONTEND_RCVHWM = 1000
#: replies waiting for a slow client; beyond this they are dropped and counted
FRONTEND_SNDHWM = 10_000
#: a body up to this much over the limit is answered BODY_TOO_LARGE; a bigger one disconnects its sender
OVERSIZE_MARGIN_BYTES = 64 * 1024
FLUSH_LINGER_MS = 2000
#: socket monitor events of a client whose CURVE handshake failed (unknown keys are counted by the ZAP callback)
HANDSHAKE_FAILURES = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL


class Guest(Protocol):
    """Something that runs on the broker's own event loop: a worker (``role`` "worker") or the events
    publisher ("publisher"). One that ends while the broker runs stops the broker, logged as
    ``<role>_died``."""

    role: str

    def run(self) -> Coroutine[Any, Any, None]: ...

    def stop(self) -> None: ...


class Broker(SocketThread):
    """The broker thread. ``start`` binds and runs it; ``stop`` begins the drain; ``join`` waits."""

    def __init__(
        self,
        *,
        settings: Settings,
        context: zmq.Context[Any],
        metrics: Metrics,
        guests: Sequence[Guest] = (),
        links: Sequence[inproc.Direct] = (),
        curve: Curve | None = None,
    ) -> None:
        """guests run on the broker's own event loop (the workers when worker_threads = 0, the publisher with
        them); links are the direct links of the workers among them (no socket between them and the broker);
        curve secures the client socket."""
        self._settings = settings
        self._curve = curve
        self._monitor: zmq.Socket[Any] | None = None
        self._guests = list(guests)
        self._guest_tasks: dict[asyncio.Task[None], Guest] = {}
        self._loop: asyncio.AbstractEventLoop  # set in _main, on the broker thread
        self._finished: asyncio.Future[None]  # set in _main
        self._timer: asyncio.TimerHandle | None = None
        super().__init__(context=context, name="broker", run=self._run)
        self.endpoint = ""
        self.queue = PriorityQueue(
            capacity=settings.queue_capacity,
            priorities={t.id: t.priority for t in REGISTRY.types.values()},
            limits={t.id: settings.bulkheads.get(t.name, settings.workers) for t in REGISTRY.types.values()},
        )
        self.replies = Replies(metrics=metrics)
        self.intake = Intake(
            settings=settings,
            metrics=metrics,
            queue=self.queue,
            replies=self.replies,
            keyring=curve.keyring if curve else None,
        )
        self.dispatcher = Dispatcher(
            queue=self.queue,
            replies=self.replies,
            enqueue_internal=self.intake.enqueue_internal,
            bad_input_allowed=self.intake.allow_bad_input,
            metrics=metrics,
            session_missed=self.intake.misses.missed,
        )
        for link in links:
            link.to_broker = self._from_direct
            self.dispatcher.direct[link.identity] = link.to_worker
        self._drain_deadline = 0.0
        self._sockets: tuple[zmq.Socket[Any], zmq.Socket[Any], zmq.Socket[Any]] | None = None
        metrics.queue_capacity.set(settings.queue_capacity)
        metrics.watch(metrics.queue_depth, lambda: len(self.queue))
        metrics.watch(metrics.workers_busy, lambda: len(self.dispatcher.inflight))
        for t in REGISTRY.types.values():
            metrics.watch(metrics.workers_busy_by_type.labels(label(t.name)), self._running_of(t.id))
            metrics.bulkhead_limit.labels(label(t.name)).set(self.queue.limits[t.id])

    def _running_of(self, type_id: int) -> Callable[[], float]:
        return lambda: self.queue.running[type_id]

    @property
    def stopping(self) -> bool:
        return self.intake.stopping

    # -- lifecycle -------------------------------------------------------------

    def stop(self) -> None:
        """Begin the drain (safe from any thread)."""
        self.send_control(b"STOP")

    # -- the loop --------------------------------------------------------------
    #
    # An asyncio loop in the broker thread drives everything: the sockets' FDs
    # (edge-triggered: after any socket operation, EVENTS must be re-checked),
    # one timer for the next queue deadline, the watchdog, and the workers
    # that share this loop (worker_threads = 0).

    def _run(self) -> None:
        eventloop.run(self._main())

    def _bind(self) -> tuple[zmq.Socket[Any], zmq.Socket[Any], zmq.Socket[Any]]:
        ctx = self._ctx
        frontend, workers, control = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER), ctx.socket(zmq.PAIR)
        try:
            frontend.setsockopt(zmq.ROUTER_MANDATORY, 1)
            frontend.setsockopt(zmq.SNDHWM, FRONTEND_SNDHWM)
            frontend.setsockopt(zmq.RCVHWM, FRONTEND_RCVHWM)
            # A frame far over the body limit is not even buffered: its sender is disconnected.
            frontend.setsockopt(zmq.MAXMSGSIZE, self._settings.max_body_bytes + OVERSIZE_MARGIN_BYTES)
            if self._curve is not None:
                self._curve.secure(frontend)
                # Handshakes that fail (plain text, a wrong server key) are counted: no frame of theirs arrives.
                self._monitor = frontend.get_monitor_socket(HANDSHAKE_FAILURES)
            if self._settings.routing_hops > 1:  # behind the --processes proxy, which binds (processes.py)
                frontend.connect(self._settings.listen)
            else:
                frontend.bind(self._settings.listen)
            self.endpoint = frontend.getsockopt_string(zmq.LAST_ENDPOINT)
            workers.setsockopt(zmq.ROUTER_MANDATORY, 1)
            workers.setsockopt(zmq.SNDHWM, 0)
            workers.setsockopt(zmq.RCVHWM, 0)
            workers.bind(inproc.ENDPOINT)
            control.bind(self._control_endpoint)
        except zmq.ZMQError:
            for sock in (frontend, workers, control):
                sock.close(linger=0)
            raise
        return frontend, workers, control

    async def _main(self) -> None:
        try:
            sockets = self._sockets = self._bind()
        except zmq.ZMQError as e:
            self.error = e
            self.bound()
            return
        frontend, workers_sock, control = sockets
        watched = [*sockets, self._monitor] if self._monitor is not None else list(sockets)
        fds = [int(sock.getsockopt(zmq.FD)) for sock in watched]
        self.replies.attach(frontend)
        loop = self._loop = asyncio.get_running_loop()
        self._finished = loop.create_future()
        guests = self._guest_tasks = {loop.create_task(g.run()): g for g in self._guests}
        for task in guests:
            task.add_done_callback(self._guest_ended)
        self.bound()
        log.info("broker_listening", endpoint=self.endpoint, queue_capacity=self.queue.capacity)
        for fd in fds:
            loop.add_reader(fd, self._on_event)
        self._on_event()
        loop.call_later(WATCHDOG_PERIOD_S, self._watchdog)
        try:
            await self._finished
        except Exception:
            log.exception("broker_crashed")
            raise
        finally:
            # Deliberate order: stop reading, let the guests end, then close (flushing replies).
            for fd in fds:
                loop.remove_reader(fd)
            for g in self._guests:
                g.stop()
            if guests:
                await asyncio.wait(guests, timeout=STOP_GRACE_S)
            if self._monitor is not None:
                frontend.disable_monitor()
                self._monitor.close(linger=0)
            frontend.close(linger=FLUSH_LINGER_MS)
            workers_sock.close(linger=0)
            control.close(linger=0)
            log.info("broker_stopped")

    def _guest_ended(self, task: asyncio.Task[None]) -> None:
        """A guest on this loop must not die quietly: stop the broker with its error."""
        if task.cancelled() or self._finished.done():
            return
        role = self._guest_tasks[task].role
        error = task.exception() or RuntimeError(f"{role} stopped")
        if not self.stopping:
            log.error(f"{role}_died", error=repr(error))
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
        assert self._sockets is not None
        frontend, workers, control = self._sockets
        dispatcher = self.dispatcher
        more = True
        while more:
            more = False
            if readable(workers):
                dispatcher.from_workers(workers, time.monotonic())
            if readable(frontend):
                more = self._from_clients(frontend)
            if readable(control):
                control.recv()
                self._begin_stop()
            if self._monitor is not None and readable(self._monitor):
                self._handshake_failures(self._monitor)
            now = time.monotonic()
            dispatcher.expire(now)
            dispatcher.dispatch(workers, now)
            if self.stopping and ((not self.queue.depth and not dispatcher.inflight) or now >= self._drain_deadline):
                dispatcher.finish()
                # Whatever clients sent before we stopped listening still gets its answer (SHUTTING_DOWN).
                for _ in range(FINAL_READ_BATCHES):
                    if not self._from_clients(frontend):
                        break
                self._finished.set_result(None)
                return
            if more:  # yield to the workers on this loop before the next client batch
                self._loop.call_soon(self._on_event)
                break
        else:
            # Our own sends may have swallowed an FD edge: look once more.
            if readable(workers) or readable(frontend) or readable(control):
                self._loop.call_soon(self._on_event)
        self._arm_timer()

    def _from_direct(self, wid: bytes, items: list[bytes]) -> None:
        """A batch from a worker on this loop (its own callback, never inside a turn); then a turn."""
        if self._finished.done():  # stopped: every message was answered already (Dispatcher.finish)
            return
        try:
            self.dispatcher.take(wid, items, time.monotonic())
        except Exception as e:  # as in a turn: the broker stops with it
            self._finished.set_exception(e)
            return
        self._on_event()

    def _from_clients(self, frontend: zmq.Socket[Any]) -> bool:
        """Accept up to one batch; True when more may be waiting."""
        accept = self.intake.accept
        with_user = self._curve is not None
        for _ in range(CLIENT_BATCH):
            if not readable(frontend):  # cheaper than catching zmq.Again
                return False
            if with_user:
                frames, user = recv_frames_with_user(frontend)
                accept(frames, time.monotonic(), user)
            else:
                accept(recv_frames(frontend), time.monotonic())
        return True

    def _handshake_failures(self, monitor: zmq.Socket[Any]) -> None:
        assert self._curve is not None
        while readable(monitor):
            event = recv_monitor_message(monitor, zmq.NOBLOCK)
            self._curve.keyring.failed("handshake", zmq_event=str(event.get("event")), peer=str(event.get("endpoint")))

    def _arm_timer(self) -> None:
        """Wake at the next queue deadline (or soon, while draining)."""
        if self.stopping:
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

    def _watchdog(self) -> None:
        if self._finished.done():
            return
        if self.dispatcher.reclaim_overdue(time.monotonic()):
            self._on_event()  # the freed slots may take queued messages now
        self._loop.call_later(WATCHDOG_PERIOD_S, self._watchdog)

    # -- shutdown --------------------------------------------------------------

    def _begin_stop(self) -> None:
        if not self.stopping:
            self.intake.stopping = True
            self._drain_deadline = time.monotonic() + self._settings.drain_timeout_s
            log.info(
                "broker_draining",
                queued=len(self.queue),
                running=len(self.dispatcher.inflight),
                drain_timeout_s=self._settings.drain_timeout_s,
            )
