"""The events publisher: one reader of the event log per service instance, and the PUB socket
front servers subscribe to (issue 16).

Storage keeps the log (lua/smartcache/events/log.lua): every change that matters
writes its event in its own transaction, numbered by a gap-free sequence. The
publisher reads it from the leader with ``events_read``, which waits *inside*
Tarantool on a fiber.cond until a commit (push: no polling, one round trip per
batch), and publishes each event on ``SMARTCACHE_EVENTS_LISTEN`` in sequence
order, three frames per event::

    topic (UTF-8: ZeroMQ's prefix filter)  |  seq (8 bytes, big-endian)  |  msgpack {seq, time_ms, topic, key, payload}

and, after a second without events, a heartbeat: an empty topic, the last
sequence published, an empty body. A subscriber that sees a gap (a slow
joiner, its queue overflowed at ``SNDHWM``, a reconnect, a restart of this
service) reads the missing events with ``EVENTS_READ`` from its last
sequence: the ZeroMQ guide's Clone pattern, built into the client library
(service/smartcache/client/subscriber.py).

It runs on the broker's event loop beside the worker slots (measured: p50 2.3
against 2.5-4 ms, p90 6 against 8-13 ms with a thread of its own, at 5,000
events/s written through the service: no GIL hand-off), or on a thread when
the workers have threads. The reader follows the leader like the workers do
(service/smartcache/server/storage/leadership.py: every instance is asked its role); after a failover it
goes on from its last sequence on the new leader, which has every acknowledged
event (synchronous partitions in HA), so the stream stays gap-free. It starts at the head: events committed
while no publisher ran are read by subscribers with EVENTS_READ, never
replayed here. While nothing is connected to the socket (its monitor says)
ZeroMQ would drop every message: the publisher reads no events then, only the
head, every UNWATCHED_READ_PAUSE_S, and moves its cursor there (the events
are not published, and not counted as published); a subscriber that connects
meanwhile finds the gap at its first event or heartbeat and reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
import time
from typing import Any

import msgpack
import structlog
import zmq
from zmq.utils.monitor import recv_monitor_message

from smartcache.server import eventloop
from smartcache.server.config import Settings
from smartcache.server.deadlines import STOP_GRACE_S
from smartcache.server.metrics import EVENT_TOPIC_LABELS, Metrics
from smartcache.server.security import Curve
from smartcache.server.storage import ShardRouter, Storage
from smartcache.server.zmqio import send_frames
from smartcache.wire.errors import StorageError

log = structlog.get_logger("events")

#: events per read (the procedure's largest limit)
BATCH = 1000
#: an idle read waits this long in storage for a commit; a heartbeat follows each idle read
READ_WAIT_MS = 1000
#: while no leader is known, look again this often
NO_LEADER_DELAY_S = 0.05
#: while nothing is connected to the socket, move the cursor to the head this often (reading the events
#: nobody would get cost storage and the service about 1 us per session created, measured at W=16)
UNWATCHED_READ_PAUSE_S = 0.1
#: after a failed read, wait this long before the next
RETRY_DELAY_S = 0.5
#: partitions and the oldest kept sequence are asked this often
STATS_INTERVAL_S = 5.0
#: messages queued per subscriber before ZeroMQ drops (the subscriber then catches up with EVENTS_READ):
#: 100,000 events of about 150 bytes, 20 s at 5,000 events/s, about 15 MB per stalled subscriber
SNDHWM = 100_000
#: how often the publisher looks whether the logs to read changed (a cluster sharded after its start)
LOGS_CHECK_S = 1.0
#: how long start-up waits for the socket to be bound (its loop may start a moment later)
BIND_TIMEOUT_S = 10.0
SEQ = struct.Struct("!Q")
HEARTBEAT_TOPIC = b""
#: topics storage writes by itself; application topics (app.*) are one metric label
SYSTEM_TOPICS = frozenset(EVENT_TOPIC_LABELS) - {"app"}
_MONITORED = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED


def topic_label(topic: str) -> str:
    """A bounded metric label: the system topic itself, ``app`` for application topics."""
    if topic in SYSTEM_TOPICS:
        return topic
    return "app" if topic.startswith("app.") else "other"


def event_frames(seq: int, time_ms: int, topic: str, key: str, payload: Any = None, *, shard: str = "") -> list[bytes]:
    """The three frames of one published event, from its fields in the order of the stored tuple
    (``events_read`` with rows: ``event_frames(*row)``; a tuple without a payload has four). A sharded
    cluster's events name their shard: the sequence is the shard's (PROTOCOL.md 11)."""
    body = {"seq": seq, "time_ms": time_ms, "topic": topic, "key": key, "payload": payload}
    if shard:
        body["shard"] = shard
    return [topic.encode(), SEQ.pack(seq), msgpack.packb(body, use_bin_type=True)]


def heartbeat_frames(seq: int, shard: str = "") -> list[bytes]:
    """An empty topic: every sequence up to ``seq`` (of the shard named in the body, if sharded) was published."""
    return [HEARTBEAT_TOPIC, SEQ.pack(seq), msgpack.packb({"shard": shard}) if shard else b""]


class EventPublisher:
    """The reader and the PUB socket.

    ``run`` is a coroutine: the broker runs it on its own loop beside the worker slots
    (``worker_threads = 0``, a :class:`~smartcache.server.broker.broker.Guest` of it: no GIL hand-off
    between the requests that write events and the reader that publishes them), or ``start`` runs it
    on a thread of its own (start, stop, join). Either way ``wait_bound`` reports whether the socket could be bound.
    """

    #: what the broker calls it when it runs on the broker's loop (a crash logs ``publisher_died``)
    role = "publisher"

    def __init__(
        self, *, settings: Settings, context: zmq.Context[Any], metrics: Metrics, curve: Curve | None = None
    ) -> None:
        self._settings = settings
        self._ctx = context
        self._metrics = metrics
        self._curve = curve
        self._thread = threading.Thread(target=self._run, name="events", daemon=True)
        self._bound = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._sock: zmq.Socket[Any] | None = None
        self._monitor: zmq.Socket[Any] | None = None
        #: the bound endpoint (port 0 resolved), once started
        self.endpoint = ""
        self.error: zmq.ZMQError | None = None
        #: per shard ("" with one replica set), the last sequence published (everything up to it went out, in order)
        self.cursors: dict[str, int] = {}
        self._subscribers = 0
        self._labels: dict[str, Any] = {}
        self._stop_asked = False

    def start(self) -> None:
        """On a thread of its own: bind the PUB socket (raises zmq.ZMQError if it cannot), then read."""
        self._thread.start()
        self.wait_bound()

    def wait_bound(self, timeout_s: float = BIND_TIMEOUT_S) -> None:
        """Until ``run`` has bound the socket, wherever it runs; raises zmq.ZMQError if it could not."""
        if not self._bound.wait(timeout_s):
            raise zmq.ZMQError(zmq.ETIMEDOUT, "the events socket was not bound in time")
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """Stop reading and close the socket; safe from any thread, before or after ``run`` started."""
        self._stop_asked = True
        if self._loop is not None and self._stopping is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                self._loop.call_soon_threadsafe(self._stopping.set)

    def join(self, timeout_s: float | None = None) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        eventloop.run(self.run())

    def _bind(self) -> None:
        sock = self._ctx.socket(zmq.PUB)
        try:
            sock.setsockopt(zmq.SNDHWM, SNDHWM)
            sock.setsockopt(zmq.LINGER, 0)
            if self._curve is not None:
                self._curve.secure(sock)  # the same keys as the client socket
            self._monitor = sock.get_monitor_socket(_MONITORED)
            sock.bind(self._settings.events_listen)
            self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError:
            if self._monitor is not None:
                self._monitor.close(linger=0)
            sock.close(linger=0)
            raise
        self._sock = sock

    async def run(self) -> None:
        """Bind, then read and publish until ``stop``, on the running loop."""
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        if self._stop_asked:
            self._stopping.set()
        try:
            self._bind()
        except zmq.ZMQError as e:
            self.error = e
            self._bound.set()
            if threading.current_thread() is not self._thread:
                await self._stopping.wait()  # on the broker's loop: start-up fails (wait_bound), the broker lives on
            return
        self._bound.set()
        log.info("events_publishing", endpoint=self.endpoint)
        storage = self._storage()
        await storage.start()
        readers: dict[str, asyncio.Task[None]] = {}
        try:
            while True:
                self._follow_logs(storage, readers)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), LOGS_CHECK_S)
                if self._stopping.is_set():
                    break
        finally:
            for reader in readers.values():
                reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(asyncio.gather(*readers.values(), return_exceptions=True), STOP_GRACE_S)
            await storage.close()
            # 1. the monitor (its inproc pair) 2. the PUB socket: nothing is sent after stop
            if self._monitor is not None:
                with contextlib.suppress(zmq.ZMQError):
                    self._pub.disable_monitor()
                self._monitor.close(linger=0)
            self._pub.close(linger=0)
            log.info("events_stopped", published_seq=self.cursors)

    def _storage(self) -> Storage | ShardRouter:
        """What the workers use: under discovery a router that finds at start whether the cluster is sharded."""
        if self._settings.discovery:
            return ShardRouter(
                settings=self._settings,
                metrics=self._metrics,
                make_storage=lambda s: Storage(settings=s, metrics=self._metrics),
            )
        return Storage(settings=self._settings, metrics=self._metrics)

    @staticmethod
    def _logs(storage: Storage | ShardRouter) -> dict[str, Storage]:
        return dict(storage.stores) if isinstance(storage, ShardRouter) else {"": storage}

    def _follow_logs(self, storage: Storage | ShardRouter, readers: dict[str, asyncio.Task[None]]) -> None:
        """One reader per log: a sharded cluster's shards each keep theirs (ShardRouter.stores; "" for one
        replica set); a cluster sharded after the start (cluster init --shards) gets its shards' readers."""
        assert self._loop is not None
        logs = self._logs(storage)
        for name in [n for n in readers if n not in logs]:
            readers.pop(name).cancel()
        for name, store in logs.items():
            if name not in readers:
                readers[name] = self._loop.create_task(self._read_forever(name, store))

    async def _read_forever(self, shard: str, storage: Storage) -> None:
        """Read from the leader and publish, from the head at start, for as long as the service runs."""
        next_stats = 0.0
        failing = False
        while True:
            self._count_subscribers()
            if self._subscribers == 0 and shard in self.cursors:
                await asyncio.sleep(UNWATCHED_READ_PAUSE_S)
                self._count_subscribers()
            if storage.leader is None:
                await asyncio.sleep(NO_LEADER_DELAY_S)
                continue
            try:
                if time.monotonic() >= next_stats:
                    await self._stats(shard, storage)
                    next_stats = time.monotonic() + STATS_INTERVAL_S
                await self._read_once(shard, storage)
            except StorageError as e:
                if not failing:
                    log.warning("events_read_failing", error=str(e), shard=shard, published_seq=self.cursors.get(shard))
                failing = True
                await asyncio.sleep(RETRY_DELAY_S)
                continue
            if failing:
                log.info("events_read_recovered", shard=shard, published_seq=self.cursors.get(shard))
                failing = False

    async def _read_once(self, shard: str, storage: Storage) -> None:
        cursor = self.cursors.get(shard)
        if cursor is None or self._subscribers == 0:
            # Start at the head (what came before is for EVENTS_READ), and stay there while nobody listens.
            r = await storage.call("events_read", [None, None, 1, 0], job=None)
            head = int(r["head_seq"])
            self._advance(shard, head, head)
            if cursor is None:
                log.info("events_reader_started", shard=shard, head_seq=head)
            return
        # rows: each event as its stored tuple (no map built and no payload decoded in storage)
        r = await storage.call("events_read", [cursor, None, BATCH, READ_WAIT_MS, True], job=None)
        status = r["status"]
        if status == "CURSOR_TOO_OLD":
            # Days without a publisher: subscribers find the same gap and get CURSOR_TOO_OLD themselves.
            log.error("events_cursor_too_old", shard=shard, published_seq=cursor, oldest_seq=r["oldest_seq"])
            self.cursors[shard] = int(r["oldest_seq"]) - 1
            return
        if status != "OK":
            raise StorageError(f"events_read answered {status}: {r.get('message', '')}")
        self._publish(shard, r["events"], storage)
        cursor = self._advance(shard, int(r["head_seq"]), int(r["last_seq"]))
        if not r["events"]:
            send_frames(self._pub, heartbeat_frames(cursor, shard))

    def _advance(self, shard: str, head: int, last: int) -> int:
        """Move the shard's cursor to ``last`` (never back), say so in the metrics; returns the cursor."""
        was = self.cursors.get(shard)
        if was is not None and head < was:
            # A leader without events already published: replication was asynchronous (SC_SYNC=false).
            log.error("events_leader_behind", shard=shard, head_seq=head, published_seq=was)
        cursor = self.cursors[shard] = last if was is None else max(was, last)
        m = self._metrics
        m.events_head_seq.labels(shard).set(head)
        m.events_published_seq.labels(shard).set(cursor)
        m.events_reader_lag.labels(shard).set(max(0, head - cursor))
        return cursor

    @property
    def _pub(self) -> zmq.Socket[Any]:
        assert self._sock is not None
        return self._sock

    def _publish(self, shard: str, rows: list[list[Any]], storage: Storage) -> None:
        """Send each event, ``rows`` as ``events_read`` answers with rows: {seq, time_ms, topic, key, payload?}."""
        sock, m = self._pub, self._metrics
        leader = storage.leader
        offset_ms = leader.offset_ms if leader is not None else 0.0
        now_ms = time.time() * 1000
        counts: dict[str, int] = {}
        for row in rows:
            send_frames(sock, event_frames(*row, shard=shard))
            topic = row[2]
            counts[topic] = counts.get(topic, 0) + 1
        # Metrics once per batch, not per event (a counter and a histogram per event were a fifth of the
        # publisher's cost): the delay is the oldest event's of the batch, the longest any of it waited.
        for topic, n in counts.items():
            counter = self._labels.get(topic)
            if counter is None:
                counter = self._labels[topic] = m.events_published.labels(topic_label(topic))
            counter.inc(n)
        if rows:
            m.events_delay.observe(max(0.0, now_ms - (rows[0][1] - offset_ms)) / 1000)

    async def _stats(self, shard: str, storage: Storage) -> None:
        s = await storage.call("events_stats", [], job=None)
        self._metrics.events_partitions.labels(shard).set(len(s.get("partitions") or ()))
        self._metrics.events_oldest_seq.labels(shard).set(int(s.get("oldest_seq") or 0))

    def _count_subscribers(self) -> None:
        """Connections accepted minus those gone, from the socket's monitor (read without waiting)."""
        mon = self._monitor
        if mon is None:
            return
        while True:
            try:
                event = recv_monitor_message(mon, zmq.NOBLOCK)
            except zmq.Again:
                break
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._subscribers += 1
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self._subscribers = max(0, self._subscribers - 1)
        self._metrics.events_subscribers.set(self._subscribers)
