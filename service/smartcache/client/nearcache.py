"""A near cache: session reads (and device lookups) answered from the front server's memory, never staler
than the event stream.

Every change of a session or a device binding writes an event in the change's own transaction, into
its shard's gap-free log (PROTOCOL.md 11). A read through the service answers its *position* in that
log (revision 12: ``seq``, ``shard``, and the session's ``handle``, the name its events carry): every
change the answer does not show has an event with a larger sequence. So a copy kept from that answer
is exact until the first later event that names it, and this cache drops it there. What it holds:

* **entries**, keyed by what the read was asked with (a session: its raw id *and* the binding the
  request carried, so a hit never skips storage's binding check; a device: its id), each with the
  name its events use, the shard and ``seq`` of the read, and the reply's body as msgpack bytes
  (decoded again per hit: a caller that changes what it got changes no other caller's copy). LRU by
  entries and by bytes.
* **a stream per shard**: the last event applied (``applied``), when the stream last showed that
  cursor current (``heard_at``: a heartbeat, an event in order, a catch-up that reached the head), a
  gap pending, and a **ring** of the names of the last ``ring_events`` events applied. A reply that
  arrives after the stream passed its ``seq`` is kept only if the ring reaches back to ``seq`` and
  names no event of it in between (an invalidation that overtook the reply); otherwise it is
  answered and not kept.

An entry is served only while its shard's stream is **current**: no gap pending, nothing buffered,
and heard from within ``max_lag_s`` (2 s: the publishers send a heartbeat every second). On a gap, a
disconnect, or a silent stream (a publisher gone, a storage failover under way) the shard's entries
are not served, reads go to the service, and the catch-up that closes the gap applies the missing
events one by one, which drop exactly what they touched. A ``bucket.sent`` drops the bucket's entries
(its later events are in another shard's log).

A session's sliding expiry is kept as a service read keeps it: the reply says in how long a read would
write the next refresh (``refresh_in_ms``); a hit after that asks the follower for a ``SESSION_TOUCH``
(batched, in the background), whose answer moves the local deadlines. The idle and the absolute
deadline are checked locally too, measured from when the read was *sent* (so they are never later
than storage's). This module has no I/O: :mod:`smartcache.client.nearfollow` feeds it from the event
stream, the client asks it first. One lock; a hit costs a dict look-up, a msgpack decode and a copy.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from smartcache.client.base import Reply
from smartcache.wire import Header, decode_body, encode_body

log = logging.getLogger("smartcache.client.nearcache")

DEFAULT_MAX_ENTRIES = 100_000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
#: how long a shard's stream may be silent before its entries stop being served (publishers beat every 1 s)
DEFAULT_MAX_LAG_S = 2.0
#: events per shard whose names are kept, to accept a reply that the stream overtook
DEFAULT_RING_EVENTS = 4096
#: what an entry costs besides its body (the key, the name, the bookkeeping): counted against max_bytes
ENTRY_OVERHEAD_BYTES = 200
#: a name no key has: an event that touches every entry of its shard's bucket(s) (bucket.sent, bucket.received)
ANY = "\0any"
#: how long this client's own write fences off the replies of reads sent before it (longer than any lifetime)
FENCE_KEEP_S = 65.0
#: fences kept at most; beyond, one fence for everything (every read sent before it is answered, not kept)
FENCES_MAX = 100_000

SESSION = "s"
DEVICE = "d"


def _bucket_of_session(sid: bytes) -> int | None:
    """A version 8 session id carries its bucket in bytes 0-1 (PROTOCOL.md 4); a version 4 one none."""
    if len(sid) == 16 and sid[6] >> 4 == 8 and sid[8] >> 6 == 0b10:
        return int.from_bytes(sid[0:2], "big")
    return None


def names_of(topic: str, key: str, payload: Any) -> tuple[str, ...]:
    """The entry names an event invalidates: a session's handle (and a rotation's old one), a device id, or ANY
    for a bucket that moved; none for the rest (products, application events)."""
    if topic.startswith("session."):
        if topic == "session.rotated" and isinstance(payload, dict) and payload.get("old_handle"):
            return (key, str(payload["old_handle"]))
        return (key,)
    if topic == "device.bound":
        return (key,)
    if topic.startswith("bucket."):
        return (ANY,)
    return ()


@dataclass(slots=True)
class Entry:
    kind: str
    key: Any
    name: str
    shard: str
    seq: int
    #: the kept reply's header, and its body as msgpack (seq and shard taken out)
    header: Header
    body: bytes
    size: int
    #: monotonic deadlines (inf: none)
    idle_at: float = math.inf
    absolute_at: float = math.inf
    refresh_at: float = math.inf
    bucket: int | None = None
    client_id: str | None = None
    touching: bool = False

    @property
    def index(self) -> tuple[Any, ...]:
        """What finds it: its name (events), its session id and its client (this client's own writes)."""
        if self.kind == SESSION:
            return (self.name, ("sid", self.key[0]), ("client", self.client_id))
        return (self.name,)


@dataclass(slots=True)
class Stream:
    """One shard's log as this cache has applied it."""

    applied: int
    #: every sequence in (ring_floor, applied] is in the ring
    ring_floor: int
    ring: collections.deque[tuple[int, tuple[str, ...]]] = field(default_factory=collections.deque)
    heard_at: float = -math.inf
    #: a disconnect or a gap at this time: only a later proof of currency serves again
    blocked_at: float = -math.inf
    gap: bool = False


@dataclass(slots=True)
class Stats:
    hits: int = 0
    misses: int = 0
    #: entries dropped by an event (or this client's own write)
    invalidations: int = 0
    gaps: int = 0
    #: a copy was there but its shard's stream was not current: the read went to the service
    not_served_stale: int = 0
    #: a reply not kept (its stream not current, overtaken by an event, no position)
    not_kept: int = 0
    #: entries dropped for room (LRU)
    evictions: int = 0
    #: entries dropped at their local idle or absolute deadline
    expired: int = 0
    touches: int = 0
    disconnects: int = 0


class NearCache:
    """``Client(endpoint, near_cache=NearCache(publishers=..., max_entries=..., max_bytes=..., max_lag_s=2.0))``.

    publishers: the services' events endpoints (SMARTCACHE_EVENTS_LISTEN), comma-separated; None: the cache
    stays disabled (and says so once in the log). max_entries, max_bytes: the LRU's bounds; max_lag_s: how
    long a shard's stream may be silent before its copies stop being served; devices: keep DEVICE_LOOKUP
    replies too. ``stats()`` counts hits, misses, invalidations, gaps and reads not served because the stream
    was not current; a reply from memory says so (``Reply.near``).
    """

    def __init__(
        self,
        *,
        publishers: str | None = None,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_lag_s: float = DEFAULT_MAX_LAG_S,
        ring_events: int = DEFAULT_RING_EVENTS,
        devices: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 1 or max_bytes < 1 or max_lag_s <= 0 or ring_events < 1:
            raise ValueError("max_entries, max_bytes, ring_events must be >= 1 and max_lag_s > 0")
        self.publishers = publishers
        self.max_entries, self.max_bytes, self.max_lag_s = max_entries, max_bytes, max_lag_s
        self.ring_events = ring_events
        self.devices = devices
        self.clock = clock
        self.counts = Stats()
        self.enabled = publishers is not None
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[Any, Entry] = collections.OrderedDict()
        #: name (a handle, a device id), ("sid", id) or ("client", id) -> the keys of the entries it finds
        self._index: dict[Any, set[Any]] = {}
        #: the same -> when this client's own write last dropped it: a reply of a read sent before is not kept
        self._fences: dict[Any, float] = {}
        self._fence_all = -math.inf
        self._bytes = 0
        self._streams: dict[str, Stream] = {}
        self._touches: dict[Any, Entry] = {}
        self._disabled_logged = False
        #: set by the client it is given to (the follower thread)
        self.follower: Any = None

    # -- what the client asks ------------------------------------------------------------------------------

    def lookup(self, key: Any) -> Reply | None:
        """The cached reply for key if it may be served now; None: ask the service (and ``offer`` its reply)."""
        now = self.clock()
        with self._lock:
            e = self._entries.get(key)
            if e is None:
                self.counts.misses += 1
                return None
            if not self._serving(self._streams.get(e.shard), now):
                self.counts.not_served_stale += 1
                self.counts.misses += 1
                return None
            if now >= e.idle_at or now >= e.absolute_at:
                self._drop(e)
                self.counts.expired += 1
                self.counts.misses += 1
                return None
            self._entries.move_to_end(key)
            self.counts.hits += 1
            if now >= e.refresh_at and not e.touching:
                e.touching = True
                self._touches[key] = e
            kind, header, body = e.kind, e.header, e.body
            deadlines = [
                ("expires_in_ms", e.idle_at),
                ("absolute_expires_in_ms", e.absolute_at),
                ("refresh_in_ms", e.refresh_at),
            ]
        fresh = decode_body(body)
        if kind == SESSION:  # counted down from when the read was sent
            for field_name, at in deadlines:
                if at != math.inf:
                    fresh[field_name] = max(0, int((at - now) * 1000))
        return Reply(header, fresh, near=True)

    def offer(self, kind: str, key: Any, reply: Reply, sent_at: float) -> bool:
        """Keep a reply the service gave to a read sent at ``sent_at`` (this cache's clock), if it may be kept:
        whether it was."""
        b = reply.body
        seq = b.get("seq")
        name = b.get("handle") if kind == SESSION else (key if kind == DEVICE else None)
        if not self.enabled or not reply.ok or reply.data_error:
            return False  # nothing to keep
        if (
            not isinstance(seq, int)
            or not isinstance(name, str)
            or (kind == SESSION and (b.get("rotated") or b.get("refresh_failed") or not name.startswith("h")))
        ):
            with self._lock:
                self.counts.not_kept += 1
            return False
        shard = str(b.get("shard") or "")
        body = encode_body({k: v for k, v in b.items() if k not in ("seq", "shard")})
        e = Entry(kind, key, name, shard, seq, reply.header, body, len(body) + ENTRY_OVERHEAD_BYTES)
        if kind == SESSION:
            e.bucket = _bucket_of_session(key[0])
            e.client_id = b.get("client_id")
            e.idle_at = _deadline(sent_at, b.get("expires_in_ms"))
            e.absolute_at = _deadline(sent_at, b.get("absolute_expires_in_ms"))
            e.refresh_at = _deadline(sent_at, b.get("refresh_in_ms"))
        now = self.clock()
        with self._lock:
            s = self._streams.get(shard)
            if (
                s is None
                or e.size > self.max_bytes
                or not self._serving(s, now)
                or not self._clear_since(s, seq, name, e.bucket)
                or self._fenced(e, sent_at)
            ):
                self.counts.not_kept += 1
                return False
            old = self._entries.get(key)
            if old is not None:
                self._drop(old)
            self._entries[key] = e
            for i in e.index:
                self._index.setdefault(i, set()).add(key)
            self._bytes += e.size
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries.values())))
                self.counts.evictions += 1
            return True

    def forget_name(self, name: str) -> None:
        """Drop the entries of a handle or a device id (this client ended that session, bound that device), and
        keep the replies of reads sent before out."""
        self._forget(name)

    def forget_session(self, sid: bytes) -> None:
        """Drop every entry of a session id, whatever binding it was read with (this client writes it)."""
        self._forget(("sid", sid))

    def forget_client(self, client_id: str) -> None:
        """Drop every session entry of a client (this client logged it out everywhere)."""
        self._forget(("client", client_id))

    def applied(self, shard: str) -> int | None:
        """The last event of shard's log applied here (None: a shard not followed)."""
        with self._lock:
            s = self._streams.get(shard)
            return None if s is None else s.applied

    def stats(self) -> dict[str, Any]:
        """Counters since start, and what the cache holds now (entries, bytes, shards being served)."""
        now = self.clock()
        with self._lock:
            out: dict[str, Any] = {k: getattr(self.counts, k) for k in self.counts.__slots__}
            out.update(
                enabled=self.enabled,
                entries=len(self._entries),
                bytes=self._bytes,
                shards={k: self._serving(s, now) for k, s in self._streams.items()},
            )
        lookups = out["hits"] + out["misses"]
        out["hit_ratio"] = out["hits"] / lookups if lookups else 0.0
        return out

    # -- what the follower tells ---------------------------------------------------------------------------

    def start_stream(self, shard: str, cursor: int) -> None:
        """Follow shard's log from cursor (the subscription's start, or again after its cursor was too old):
        the shard's entries are dropped, its ring starts empty."""
        with self._lock:
            self._reset(shard, cursor)

    def apply(self, shard: str, seq: int, topic: str, key: str, payload: Any) -> None:
        """One event of shard's log, in order (the subscription drops duplicates and closes gaps)."""
        with self._lock:
            s = self._streams.get(shard)
            if s is None:
                s = self._streams[shard] = Stream(applied=seq - 1, ring_floor=seq - 1)
            if seq <= s.applied:
                # The log went back (a leader without SC_SYNC lost events): nothing of this shard is known.
                log.warning("near_cache_log_went_back shard=%s seq=%d applied=%d", shard, seq, s.applied)
                self._reset(shard, seq - 1)
                s = self._streams[shard]
            names = names_of(topic, key, payload)
            s.applied = seq
            s.ring.append((seq, names))
            if len(s.ring) > self.ring_events:
                s.ring_floor = s.ring.popleft()[0]
            for name in names:
                if name == ANY:
                    self._drop_bucket(shard, payload)
                    continue
                for k in list(self._index.get(name, ())):
                    e = self._entries[k]
                    if e.shard != shard or seq > e.seq:
                        self._drop(e)
                        self.counts.invalidations += 1

    def stream_state(self, shard: str, *, current: bool, heard_at: float) -> None:
        """What the follower saw of shard after a poll: current (no gap pending, nothing buffered) and when the
        stream last showed it so."""
        with self._lock:
            s = self._streams.get(shard)
            if s is None:
                return
            if not current and not s.gap:
                s.gap = True
                self.counts.gaps += 1
            elif current:
                s.gap = False
            s.heard_at = heard_at

    def gap(self, shard: str) -> None:
        """The subscription found a gap in shard's log: its entries are not served until it is read."""
        with self._lock:
            s = self._streams.get(shard)
            if s is not None and not s.gap:
                s.gap = True
                self.counts.gaps += 1

    def disconnected(self) -> None:
        """A publisher's connection dropped: no shard is served until its stream shows it current again."""
        now = self.clock()
        with self._lock:
            self.counts.disconnects += 1
            for s in self._streams.values():
                s.blocked_at = now

    def take_touches(self) -> list[Entry]:
        """The sessions whose hits found their refresh due, once each until ``touched``."""
        with self._lock:
            out = list(self._touches.values())
            self._touches.clear()
            return out

    def touched(self, key: Any, sent_at: float, body: dict[str, Any] | None) -> None:
        """A touch sent at sent_at was answered OK with body (new deadlines), or not (None: the session is gone
        or refused it: dropped)."""
        with self._lock:
            e = self._entries.get(key)
            if e is None:
                return
            self.counts.touches += 1
            if body is None:
                self._drop(e)
                self.counts.invalidations += 1
                return
            e.touching = False
            e.idle_at = _deadline(sent_at, body.get("expires_in_ms"))
            e.absolute_at = _deadline(sent_at, body.get("absolute_expires_in_ms"))
            e.refresh_at = _deadline(sent_at, body.get("refresh_in_ms"))

    def untouched(self, entries: Iterable[Entry]) -> None:
        """Touches that got no answer: asked again at the next hit."""
        with self._lock:
            for e in entries:
                e.touching = False

    def disable(self, why: str) -> None:
        """No stream to follow: nothing is kept or served; said once."""
        with self._lock:
            self.enabled = False
            self._entries.clear()
            self._index.clear()
            self._bytes = 0
            if self._disabled_logged:
                return
            self._disabled_logged = True
        log.warning("near_cache_disabled: %s; every read goes to the service", why)

    # -- inside the lock ------------------------------------------------------------------------------------

    def _serving(self, s: Stream | None, now: float) -> bool:
        return (
            self.enabled
            and s is not None
            and not s.gap
            and s.heard_at > s.blocked_at
            and now - s.heard_at <= self.max_lag_s
        )

    def _clear_since(self, s: Stream, seq: int, name: str, bucket: int | None) -> bool:
        """No event the stream applied after seq names name (nor moved a bucket): a reply at seq is current."""
        if seq >= s.applied:
            return True
        if seq < s.ring_floor:
            return False  # the ring does not reach back that far
        for q, names in reversed(s.ring):
            if q <= seq:
                break
            if name in names or ANY in names:
                return False
        return True

    def _forget(self, index: Any) -> None:
        now = self.clock()
        with self._lock:
            for k in list(self._index.get(index, ())):
                self._drop(self._entries[k])
                self.counts.invalidations += 1
            self._fences[index] = now
            if len(self._fences) > FENCES_MAX:
                self._fences = {i: t for i, t in self._fences.items() if t > now - FENCE_KEEP_S}
                if len(self._fences) > FENCES_MAX // 2:  # a burst of writes: one fence for all
                    self._fences.clear()
                    self._fence_all = now

    def _fenced(self, e: Entry, sent_at: float) -> bool:
        """A write of this client's dropped what e is about after its read was sent: its reply may predate it."""
        if sent_at <= self._fence_all:
            return True
        return any(self._fences.get(i, -math.inf) >= sent_at for i in e.index)

    def _drop(self, e: Entry) -> None:
        del self._entries[e.key]
        self._touches.pop(e.key, None)
        for i in e.index:
            keys = self._index.get(i)
            if keys is not None:
                keys.discard(e.key)
                if not keys:
                    del self._index[i]
        self._bytes -= e.size

    def _drop_bucket(self, shard: str, payload: Any) -> None:
        """A bucket left (or reached) shard: its entries there go (and every one whose bucket is not known)."""
        bucket = payload.get("bucket") if isinstance(payload, dict) else None
        for e in [e for e in self._entries.values() if e.shard == shard]:
            if bucket is None or e.bucket is None or e.bucket == bucket:
                self._drop(e)
                self.counts.invalidations += 1

    def _reset(self, shard: str, cursor: int) -> None:
        for e in [e for e in self._entries.values() if e.shard == shard]:
            self._drop(e)
        old = self._streams.get(shard)
        s = self._streams[shard] = Stream(applied=cursor, ring_floor=cursor)
        if old is not None:
            s.blocked_at, s.gap = old.blocked_at, old.gap


def _deadline(sent_at: float, in_ms: Any) -> float:
    return sent_at + in_ms / 1000 if isinstance(in_ms, int) else math.inf
