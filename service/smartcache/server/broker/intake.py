"""Intake: the one door every client message enters the broker through.

Every message a client sends passes :meth:`Intake.accept`: the header is
validated (the body only for PING, which is answered here), bad input is
answered with its precise transport error and counted, a type the client's
CURVE key may not send is answered FORBIDDEN, a stopping service answers
SHUTTING_DOWN, and everything else becomes a :class:`Holder` in the priority
queue -- or is refused QUEUE_FULL at once. Internal messages (a worker's
prewarm fetches) enter through :meth:`Intake.enqueue_internal`. Answers leave
through :class:`~smartcache.server.broker.replies.Replies`; what happens to a
queued message next is :mod:`.dispatch`'s.

Bad input costs the broker a reply each; a client that sends garbage at full
speed must not be served first. So bad input is answered at most
``bad_input_per_peer_per_s`` times a second per connection and
``bad_input_per_s`` in all; beyond that it is dropped unanswered and counted
(``smartcache_bad_input_throttled_total``), as PROTOCOL.md says. A peer that had
``not_found_per_peer_per_s`` answers saying a session is not live in its second
has its requests that name a session refused ``QUEUE_FULL`` until the second ends
(guessing a session id: :mod:`.misses`).
"""

from __future__ import annotations

import itertools
import time

from smartcache.server.broker.misses import SessionMisses
from smartcache.server.broker.queue import Holder, PriorityQueue, QueueFull
from smartcache.server.broker.replies import Replies
from smartcache.server.config import Settings
from smartcache.server.metrics import Metrics, label
from smartcache.server.security import KeyRing
from smartcache.wire import (
    FLAG_NO_REPLY,
    NO_SESSION,
    REGISTRY,
    STATUS,
    Header,
    decode_body,
    decode_header,
    encode_body,
    encode_header,
    frame_no_reply,
    loose_header,
)
from smartcache.wire.errors import ProtocolError

_PING = REGISTRY.types["PING"].id
_INTERNAL = frozenset(t.id for t in REGISTRY.types.values() if t.internal)
_NEVER_ANSWERED = frozenset(t.id for t in REGISTRY.types.values() if not t.answered)
_MAX_LIFETIME_S = REGISTRY.max_lifetime_ms / 1000
#: names a session with a zero header id: SESSION_DELETE by handle
_BY_HANDLE = REGISTRY.types["SESSION_DELETE"].id
#: connections whose bad-input budget is tracked at once (the oldest are forgotten beyond)
PEERS_TRACKED = 10_000


class RateLimit:
    """Token buckets: ``rate`` per second, bursts up to ``rate``, per key and in all."""

    def __init__(self, per_key: int, total: int) -> None:
        self._per_key, self._total = per_key, total
        self._buckets: dict[bytes, tuple[float, float]] = {}
        self._all = (float(total), time.monotonic())

    def _take(self, bucket: tuple[float, float], rate: int, now: float) -> tuple[bool, tuple[float, float]]:
        tokens, last = bucket
        tokens = min(float(rate), tokens + max(0.0, now - last) * rate)  # a clock read earlier never drains it
        if tokens < 1:
            return False, (tokens, now)
        return True, (tokens - 1, now)

    def allow(self, key: bytes, now: float) -> bool:
        if len(self._buckets) >= PEERS_TRACKED and key not in self._buckets:
            self._buckets.clear()  # rare: forget everyone rather than grow without bound
        ok, self._buckets[key] = self._take(self._buckets.get(key, (float(self._per_key), now)), self._per_key, now)
        if not ok:
            return False
        ok, self._all = self._take(self._all, self._total, now)
        return ok


class Intake:
    """Validate, answer or queue what clients send (broker thread only)."""

    def __init__(
        self,
        *,
        settings: Settings,
        metrics: Metrics,
        queue: PriorityQueue,
        replies: Replies,
        keyring: KeyRing | None = None,
    ) -> None:
        """keyring: the CURVE client keys and their permissions (None: CURVE off, every type allowed)."""
        self.stopping = False
        self._keyring = keyring
        self._bad_input_limit = RateLimit(settings.bad_input_per_peer_per_s, settings.bad_input_per_s)
        self._settings = settings
        self._metrics = metrics
        self._queue = queue
        self._replies = replies
        self._seq = itertools.count(1)
        self._hops = settings.routing_hops
        #: NOT_FOUND answers about sessions per peer (the dispatcher counts them, the intake refuses beyond)
        self.misses = SessionMisses(per_peer_per_s=settings.not_found_per_peer_per_s, metrics=metrics)

    def accept(self, frames: list[bytes], now: float, user_id: str | None = None) -> None:
        """One message as the client ROUTER received it: ``[identity, (empty delimiter), header, body]``;
        behind the ``--processes`` proxy (``routing_hops`` 2) the proxy's hop comes first:
        ``[hop, identity, (empty delimiter), header, body]``.

        user_id: the client's CURVE public key (z85), as the ZAP handler reported it.
        """
        hops = self._hops
        if len(frames) < hops:  # only a broken proxy sends less than its own routing frames: no one to answer
            self._metrics.bad_input.labels(label("BAD_FRAMES")).inc()
            return
        split = hops + 1 if len(frames) > hops + 1 and frames[hops] == b"" else hops
        envelope, payload = frames[:split], frames[split:]
        if len(payload) != 2:
            first = payload[0] if payload else b""
            self._bad_input(envelope, first, "BAD_FRAMES", f"expected 2 frames (header, body), got {len(payload)}", now)
            return
        header_frame, body = payload
        try:
            header = decode_header(header_frame)
        except ProtocolError as e:
            self._bad_input(envelope, header_frame, e.transport_error, str(e), now)
            return
        if header.transport_error:
            self._bad_input(envelope, header_frame, "BAD_HEADER", "transport_error must be 0 from clients", now)
            return
        if header.type in _INTERNAL:
            self._bad_input(envelope, header_frame, "UNKNOWN_TYPE", f"type {header.type} is internal", now)
            return
        # The NO_REPLY rule (frame_no_reply) on the header decoded already: no second unpack.
        no_reply = bool(header.flags & FLAG_NO_REPLY) or header.type in _NEVER_ANSWERED
        if self._keyring is not None and not self._keyring.allows(user_id, header.type):
            name = REGISTRY.types_by_id[header.type].name
            client = self._keyring.name_of(user_id)
            self._replies.error(envelope, header, "FORBIDDEN", f"key {client!r} may not send {name}", no_reply)
            return
        limit = self._settings.max_body_bytes
        if len(body) > limit:
            self._bad_input(envelope, header_frame, "BODY_TOO_LARGE", f"body is {len(body)} bytes, limit {limit}", now)
            return
        if self.stopping:
            self._replies.error(envelope, header, "SHUTTING_DOWN", "service is stopping", no_reply)
            self._replies.rejected("shutting_down")
            return
        if header.type == _PING:
            self._ping(envelope, header, header_frame, body, now=now, no_reply=no_reply)
            return
        peer = user_id.encode() if user_id else envelope[self._hops - 1]
        if (header.session_id != NO_SESSION or header.type == _BY_HANDLE) and self.misses.throttled(peer, now):
            message = "too many NOT_FOUND answers about sessions from this connection in the last second"
            self._replies.error(envelope, header, "QUEUE_FULL", message, no_reply)
            return
        self._enqueue(envelope, header, header_frame, body, no_reply=no_reply, now=now, peer=peer)

    def enqueue_internal(self, header_frame: bytes, body: bytes, now: float) -> None:
        """Queue a message a worker made (no client, no reply); refused, uncounted but as a rejection, at stop."""
        if self.stopping:
            self._replies.rejected("shutting_down")
            return
        self._enqueue([], decode_header(header_frame), header_frame, body, no_reply=True, now=now)

    def _ping(
        self, envelope: list[bytes], header: Header, header_frame: bytes, body: bytes, *, now: float, no_reply: bool
    ) -> None:
        try:  # its body is checked like any other (its fields are ignored)
            decode_body(body, max_bytes=self._settings.max_body_bytes)
        except ProtocolError as e:
            self._bad_input(envelope, header_frame, e.transport_error, str(e), now)
            return
        replies = self._replies
        if header.session_id != NO_SESSION:  # PING's session rule is "none", as execute checks for the others
            status = "BAD_REQUEST"
            reply = {"status": STATUS[status], "message": "header session_id must be zero for this type"}
        else:
            status = "OK"
            reply = {"status": STATUS[status], "time_ms": int(time.time() * 1000)}
        if not no_reply:
            replies.send(envelope, encode_header(header.reply()), encode_body(reply))
        replies.count(header.type, status)
        replies.observe(header.type, time.monotonic() - now)

    def _enqueue(
        self,
        envelope: list[bytes],
        header: Header,
        header_frame: bytes,
        body: bytes,
        *,
        no_reply: bool,
        now: float,
        peer: bytes = b"",
    ) -> None:
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
            peer=peer,
        )
        try:
            victim = self._queue.push(h)
        except QueueFull:
            self._replies.refuse(h, "QUEUE_FULL", f"queue full ({self._queue.capacity})", "full")
            return
        if victim is not None:
            self._replies.refuse(victim, "QUEUE_FULL", "evicted by a more urgent message", "evicted")

    def allow_bad_input(self, envelope: list[bytes], now: float) -> bool:
        """Whether one more answer to bad input from this connection fits the rate (PROTOCOL.md 4); the
        ones that do not are counted, and their sender gets no answer. Bad bodies found by a worker
        (dispatch) go by the same rate as the ones found here. The connection is the client's identity,
        the last routing frame (not the proxy's hop, which every client behind it shares)."""
        if self._bad_input_limit.allow(envelope[self._hops - 1], now):
            return True
        self._metrics.bad_input_throttled.inc()
        return False

    def _bad_input(self, envelope: list[bytes], header_frame: bytes, error: str, message: str, now: float) -> None:
        self._metrics.bad_input.labels(label(error)).inc()
        if not self.allow_bad_input(envelope, now):
            return
        self._replies.error(envelope, loose_header(header_frame), error, message, frame_no_reply(header_frame))
