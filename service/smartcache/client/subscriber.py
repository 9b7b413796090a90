"""``subscribe(topics, from_seq)``: the event stream for front servers, every event once, in order.

A :class:`Subscription` is the ZeroMQ guide's Clone pattern on top of the
service's two sockets:

1. a SUB socket connects to the publishers (one or several service instances:
   ``SMARTCACHE_EVENTS_LISTEN``) and subscribes *before* anything is read, so
   nothing published from then on can slip between the catch-up and the stream;
2. events after the cursor are read with ``EVENTS_READ`` until the head (the
   catch-up; a late start, a restart from the last sequence processed);
3. then the stream: an event whose sequence is the cursor + 1 is delivered,
   one at or below the cursor is a duplicate (several publishers, the catch-up
   overlapping the stream) and is dropped, one further ahead is a gap (the
   subscriber was slow and ZeroMQ dropped at its high-water mark, a reconnect,
   a publisher restarted) and sends it back to step 2. A heartbeat (empty
   topic) that names a sequence above the cursor is a gap at the tail.

The SUB socket subscribes to every topic and filters here: with ZeroMQ's
prefix filter a missing sequence number could be an event filtered out or one
lost, and only the whole sequence tells them apart. Events the filter skips
still move the cursor.

A subscriber that restarts passes the sequence of the last event it processed
+ 1 as ``from_seq``: nothing lost, nothing twice. Events dropped by retention
raise :class:`~smartcache.wire.errors.CursorTooOld`, never a silent gap. Transient
failures of a catch-up (the service restarting, a storage failover) are
retried; a subscription belongs to one thread.

A sharded cluster keeps a log per shard, each numbered by its own gap-free
sequence (PROTOCOL.md 11): an event's position is (shard, seq), its map and
each heartbeat name the shard, and the subscription keeps a cursor per shard
(``cursors``), so each shard's stream is checked, caught up and resumed on its
own. Order holds per key (a key's events are one bucket's, on one shard) and
across keys within a shard; nothing orders two shards' events.

What a near cache (:mod:`smartcache.client.nearfollow`) reads of a subscription besides
its events: ``heard``, per shard, when a publisher last showed the cursor current (a
heartbeat at or below it, the next event in order: never the head read from storage, nor
a heartbeat above the cursor), ``behind`` (the shards with a gap pending), ``on_gap``
(called when a gap is found, before it is read) and ``monitor()`` (the SUB socket's
connects and disconnects).
"""

from __future__ import annotations

import collections
import contextlib
import struct
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import msgpack
import zmq

from smartcache.wire.errors import CursorTooOld, RequestError

if TYPE_CHECKING:
    from smartcache.client.base import Reply
    from smartcache.wire.keys import CurveKeys

SEQ = struct.Struct("!Q")
#: events per catch-up read (the most EVENTS_READ gives)
CATCH_UP_LIMIT = 1000
#: messages the SUB socket holds before ZeroMQ drops (then a gap: caught up from storage)
RCVHWM = 100_000
#: messages taken off the socket per wake-up
DRAIN_MAX = 1000
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 1.0
#: transport errors that will not go away by asking again
FINAL = frozenset({"BAD_HEADER", "UNSUPPORTED_VERSION", "UNKNOWN_SYSTEM", "UNKNOWN_TYPE", "BAD_BODY", "FORBIDDEN"})


class Caller(Protocol):
    """What a subscription needs from a client: one request, one reply (smartcache.client.clients.Client)."""

    def call(
        self,
        type_name: str,
        body: Any = None,
        *,
        session_id: Any = None,
        lifetime_ms: int = 0,
        timeout_s: float | None = None,
    ) -> Reply: ...

    def close(self, linger_ms: int = 200) -> None: ...


@dataclass(frozen=True, slots=True)
class Event:
    """One event of the log: its sequence (the cursor), topic, key, time in storage (ms), payload, and in a
    sharded cluster the shard whose log it is in (its sequence is that shard's)."""

    seq: int
    topic: str
    key: str
    time_ms: int
    payload: Any
    shard: str = ""

    @classmethod
    def from_map(cls, m: dict[str, Any], shard: str = "") -> Event:
        return cls(
            int(m["seq"]), m["topic"], m.get("key", ""), int(m.get("time_ms", 0)), m.get("payload"),
            m.get("shard") or shard,
        )  # fmt: skip


@dataclass(slots=True)
class Counts:
    """What a subscription did: events delivered, caught up from storage, duplicates dropped, gaps seen."""

    delivered: int = 0
    caught_up: int = 0
    duplicates: int = 0
    gaps: int = 0
    catch_up_reads: int = 0


class Subscription:
    """An iterator of :class:`Event` (blocking), or ``poll(timeout_s)``; ``close()`` when done."""

    def __init__(
        self,
        client: Caller,
        publishers: str | Sequence[str],
        topics: Sequence[str] = (),
        from_seq: int | Mapping[str, int] | None = None,
        *,
        curve: CurveKeys | None = None,
        context: zmq.Context[Any] | None = None,
        retry_s: float = 30.0,
    ) -> None:
        """publishers: the PUB endpoints (comma-separated, or a list); topics: prefixes (none: every event);
        from_seq: the first sequence wanted (None: from now on), in a sharded cluster per shard
        ``{shard: seq}`` (a shard left out: from its first event); retry_s: how long a catch-up retries
        transient failures before the error is raised."""
        self.client = client
        self.topics = tuple(topics)
        self.counts = Counts()
        self._retry_s = retry_s
        self._buffer: collections.deque[Event] = collections.deque()
        ctx = context or zmq.Context.instance()
        self._sub = ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.RCVHWM, RCVHWM)
        if curve is not None:
            curve.apply(self._sub)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")  # every topic: see the module docstring
        endpoints = publishers.split(",") if isinstance(publishers, str) else publishers
        for e in endpoints:
            self._sub.connect(e.strip())
        #: per shard ("" with one replica set): every event up to here was delivered or skipped by the filter
        self.cursors: dict[str, int] = {}
        #: the shards whose log is read with EVENTS_READ before their stream is taken
        self._behind: set[str] = set()
        #: per shard, when (time.monotonic) a publisher last showed the cursor current: a heartbeat at or below it, or
        #: the next event in order (a near cache serves a shard's copies only while this is recent)
        self.heard: dict[str, float] = {}
        #: called with the shard when a gap is found, before it is read (a near cache stops serving the shard)
        self.on_gap: Callable[[str], None] | None = None
        self.sharded = False
        try:
            self._start(from_seq)
        except BaseException:
            self.close()  # the head could not be read: nothing is left open
            raise

    def _start(self, from_seq: int | Mapping[str, int] | None) -> None:
        """The cursors to begin from: the heads (None), from_seq - 1, or each shard's from its map."""
        #: from_seq was one number: the cluster must be one replica set (checked at the first read)
        self._one_log = isinstance(from_seq, int)
        if isinstance(from_seq, int):
            self.cursors[""] = max(0, from_seq - 1)
            self._behind.add("")
            return
        first = self._read("", None)
        shards = [str(x) for x in first.get("shards") or ()]
        self.sharded = bool(shards)
        if from_seq is None:
            for shard in shards or [""]:
                head = first if shard == first.get("shard", "") else self._read(shard, None)
                self.cursors[shard] = int(head["head_seq"])
            return
        wanted = {str(k): int(v) for k, v in from_seq.items()}
        for shard in shards or [""]:
            self.cursors[shard] = max(0, wanted.get(shard, 1) - 1)
            self._behind.add(shard)

    @property
    def cursor(self) -> int:
        """The cursor of a cluster of one replica set (a sharded one's are ``cursors``)."""
        if self.sharded:
            raise ValueError(f"a sharded cluster has a cursor per shard: see cursors ({self.cursors})")
        return self.cursors[""]

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        while True:
            event = self.poll(3600.0)
            if event is not None:
                return event

    def poll(self, timeout_s: float) -> Event | None:
        """The next event, or None when none came within timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._buffer:
                self.counts.delivered += 1
                return self._buffer.popleft()
            if self._behind:
                if not self._catch_up(min(self._behind), deadline):
                    return None
                continue
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not self._sub.poll(left_ms):
                return None
            for _ in range(DRAIN_MAX):  # what is queued already, without a poll per message
                try:
                    frames = self._sub.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._receive(frames)

    @property
    def behind(self) -> frozenset[str]:
        """The shards with a gap pending: their log is read with EVENTS_READ before their stream is taken again."""
        return frozenset(self._behind)

    def monitor(self) -> zmq.Socket[Any]:
        """A socket that receives the SUB socket's connection events (``zmq.utils.monitor.recv_monitor_message``):
        a near cache stops serving at a disconnect, before the silent stream would tell. Read it from this
        subscription's thread."""
        monitor: zmq.Socket[Any] = self._sub.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECTED)
        return monitor

    def close(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self._sub.disable_monitor()
        self._sub.close(linger=0)
        self.client.close(linger_ms=0)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _matches(self, topic: str) -> bool:
        return not self.topics or any(topic.startswith(t) for t in self.topics)

    def _receive(self, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != SEQ.size:
            return  # not ours: a publisher speaks only this format
        seq = SEQ.unpack(frames[1])[0]
        body: dict[str, Any] | None = None
        shard = ""
        if self.sharded and frames[2]:
            body = msgpack.unpackb(frames[2], raw=False)
            shard = str(body.get("shard") or "") if isinstance(body, dict) else ""
        cursor = self.cursors.get(shard)
        if cursor is None:  # a shard added since the subscription began: its log from its first event
            self.cursors[shard] = 0
            self._gap(shard)
            return
        if not frames[0]:  # heartbeat: everything up to seq (of the shard) was published
            if seq > cursor:
                self._gap(shard)
            elif shard not in self._behind:
                self.heard[shard] = time.monotonic()
            return
        if seq <= cursor:
            self.counts.duplicates += 1
            return
        if seq > cursor + 1 or shard in self._behind:
            self._gap(shard)  # the catch-up reads this one too
            return
        self.cursors[shard] = seq
        self.heard[shard] = time.monotonic()
        topic = frames[0].decode()
        if self._matches(topic):
            m = body if body is not None else msgpack.unpackb(frames[2], raw=False)
            self._buffer.append(Event.from_map(m, shard))

    def _gap(self, shard: str) -> None:
        if shard not in self._behind:
            self.counts.gaps += 1
            self._behind.add(shard)
            if self.on_gap is not None:
                self.on_gap(shard)

    def _catch_up(self, shard: str, deadline: float) -> bool:
        """Read a shard's log from its cursor to the head; False when the deadline came first (it goes on at
        the next poll)."""
        while True:
            r = self._read(shard, self.cursors[shard], deadline)
            if r is None:
                return False
            for m in r["events"]:
                self._buffer.append(Event.from_map(m, shard))
            self.counts.caught_up += len(r["events"])
            # The cursor to go on from, never beyond the head (PROTOCOL.md 11): a cursor ahead of the log
            # (a from_seq beyond it, a log restored from a copy) moves back to the head, or it would skip
            # the events numbered up to it when they come.
            self.cursors[shard] = int(r["last_seq"])
            if self.cursors[shard] >= int(r["head_seq"]):
                self._behind.discard(shard)
                return True
            if self._buffer:
                return True  # deliver these first; the rest at the next poll

    def _read(self, shard: str, after_seq: int | None, deadline: float | None = None) -> Any:
        """One EVENTS_READ of a shard's log ("": the cluster's one, or a sharded cluster's first), retried
        through transient failures (within retry_s, or until deadline: None)."""
        body: dict[str, Any] = {"after_seq": after_seq, "topics": list(self.topics) or None, "limit": CATCH_UP_LIMIT}
        if shard:
            body["shard"] = shard
        give_up = time.monotonic() + self._retry_s
        pause = RETRY_FIRST_S
        while True:
            try:
                reply = self.client.call("EVENTS_READ", body)
            except RequestError as e:
                if e.transport_error in FINAL or time.monotonic() + pause > give_up:
                    raise
                if deadline is not None and time.monotonic() + pause > deadline:
                    return None
                time.sleep(pause)
                pause = min(RETRY_MAX_S, pause * 2)
                continue
            self.counts.catch_up_reads += 1
            if self._one_log and reply.body.get("shards"):
                raise ValueError(
                    "a sharded cluster has a sequence per shard: give from_seq as {shard: seq} "
                    f"(shards: {', '.join(map(str, reply.body['shards']))})"
                )
            if reply.status == "CURSOR_TOO_OLD":
                raise CursorTooOld(self.cursors.get(shard, 0), int(reply.body["oldest_seq"]))
            if not reply.ok:
                raise RequestError(reply.status, str(reply.body.get("message", "")), reply.body)
            return reply.body
