"""Admission: the broker's client-facing side.

Every message a client sends passes :meth:`Admission.accept`: the header is
validated (the body only for PING, which is answered here), bad input is
answered with its precise transport error and counted, a type the client's
CURVE key may not send is answered FORBIDDEN, a stopping service answers
SHUTTING_DOWN, and everything else becomes a :class:`Holder` in the priority
queue -- or is refused QUEUE_FULL at once.

Bad input costs the broker a reply each; a client that sends garbage at full
speed must not be served first. So bad input is answered at most
``bad_input_per_peer_per_s`` times a second per connection and
``bad_input_per_s`` in all; beyond that it is dropped unanswered and counted
(``smartcache_bad_input_throttled_total``), as PROTOCOL.md says. Every answer a client
gets leaves through :meth:`Admission.send`, and every refusal through
:meth:`Admission.refuse`, the cheap path that runs at overload rates (it
patches the request's header in place of re-encoding it, and reuses encoded
error bodies). What happens to a queued message next is the broker's.
"""

from __future__ import annotations

import errno
import itertools
import time
from typing import Any

import zmq

from service.config import Settings
from service.errors import ProtocolError
from service.metrics import REJECTION_REASONS, Metrics, label
from service.protocol import (
    FLAG_DATA_ERROR,
    FLAG_NO_REPLY,
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
from service.security import KeyRing
from service.zmqio import send_frames

_PING = REGISTRY.types["PING"].id
_INTERNAL = frozenset(t.id for t in REGISTRY.types.values() if t.internal)
_NEVER_ANSWERED = frozenset(t.id for t in REGISTRY.types.values() if not t.answered)
_MAX_LIFETIME_S = REGISTRY.max_lifetime_ms / 1000
#: encoded error bodies kept for reuse (refusals with a fixed message)
ERROR_BODIES_KEPT = 256
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
        tokens = min(float(rate), tokens + (now - last) * rate)
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


class Admission:
    """Validate, answer or queue what clients send; send every answer (broker thread only)."""

    def __init__(
        self, *, settings: Settings, metrics: Metrics, queue: PriorityQueue, keyring: KeyRing | None = None
    ) -> None:
        """keyring: the CURVE client keys and their permissions (None: CURVE off, every type allowed)."""
        self.stopping = False
        self._keyring = keyring
        self._bad_input_limit = RateLimit(settings.bad_input_per_peer_per_s, settings.bad_input_per_s)
        self._settings = settings
        self._metrics = metrics
        self._queue = queue
        self._frontend: zmq.Socket[Any] | None = None
        self._seq = itertools.count(1)
        self._type_names = {t.id: t.name for t in REGISTRY.types.values()}
        self._durations = {t.id: metrics.duration.labels(label(t.name)) for t in REGISTRY.types.values()}
        self._outcomes: dict[tuple[int, str], Any] = {}
        self._rejections = {r: metrics.rejections.labels(r) for r in REJECTION_REASONS}
        self._error_bodies: dict[tuple[str, str], bytes] = {}

    def attach(self, frontend: zmq.Socket[Any]) -> None:
        """The client socket answers leave through (bound by the broker)."""
        self._frontend = frontend

    def accept(self, frames: list[bytes], now: float, user_id: str | None = None) -> None:
        """One message as the client ROUTER received it: ``[identity, (empty delimiter), header, body]``.

        user_id: the client's CURVE public key (z85), as the ZAP handler reported it.
        """
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
        # The NO_REPLY rule (protocol.frame_no_reply) on the header decoded already: no second unpack.
        no_reply = bool(header.flags & FLAG_NO_REPLY) or header.type in _NEVER_ANSWERED
        if self._keyring is not None and not self._keyring.allows(user_id, header.type):
            name = REGISTRY.types_by_id[header.type].name
            client = self._keyring.name_of(user_id)
            self._answer_error(envelope, header, "FORBIDDEN", f"key {client!r} may not send {name}", no_reply)
            return
        limit = self._settings.max_body_bytes
        if len(body) > limit:
            self._bad_input(envelope, header_frame, "BODY_TOO_LARGE", f"body is {len(body)} bytes, limit {limit}")
            return
        if self.stopping:
            self._answer_error(envelope, header, "SHUTTING_DOWN", "service is stopping", no_reply)
            self._rejections["shutting_down"].inc()
            return
        if header.type == _PING:
            self._ping(envelope, header, header_frame, body, now=now, no_reply=no_reply)
            return
        self.enqueue(envelope, header, header_frame, body, no_reply=no_reply, now=now)

    def _ping(
        self, envelope: list[bytes], header: Header, header_frame: bytes, body: bytes, *, now: float, no_reply: bool
    ) -> None:
        try:  # its body is checked like any other (its fields are ignored)
            decode_body(body, max_bytes=self._settings.max_body_bytes)
        except ProtocolError as e:
            self._bad_input(envelope, header_frame, e.transport_error, str(e))
            return
        if not no_reply:
            reply = {"status": STATUS["OK"], "time_ms": int(time.time() * 1000)}
            self.send(envelope, encode_header(header.reply()), encode_body(reply))
        self.count(header.type, "OK")
        self.observe(header.type, time.monotonic() - now)

    def enqueue(
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
            victim = self._queue.push(h)
        except QueueFull:
            self.refuse(h, "QUEUE_FULL", f"queue full ({self._queue.capacity})", "full")
            return
        if victim is not None:
            self.refuse(victim, "QUEUE_FULL", "evicted by a more urgent message", "evicted")

    def refuse(self, h: Holder, error: str, message: str, reason: str | None, *, cache: bool = True) -> None:
        """Answer a holder with a transport error.

        ``reason`` counts a queue rejection; ``cache`` keeps the encoded body
        for the next refusal with the same message (only fixed messages).
        """
        if reason is not None:
            self._rejections[reason].inc()
        self.count(h.type_id, error)
        if not h.no_reply:
            body = self._error_bodies.get((error, message)) if cache else None
            if body is None:
                body = encode_body(error_body("ERROR", error, message))
                if cache and len(self._error_bodies) < ERROR_BODIES_KEPT:
                    self._error_bodies[(error, message)] = body
            self.send(h.envelope, with_transport_error(h.header, TRANSPORT_ERROR[error]), body)
        self.observe(h.type_id, time.monotonic() - h.arrived)

    def reply(self, h: Holder, header: bytes, body: bytes, now: float) -> None:
        """A worker's reply to a holder (nothing is sent for a NO_REPLY one)."""
        if not h.no_reply:
            self.send(h.envelope, header, body)
        self._durations[h.type_id].observe(now - h.arrived)

    def send(self, envelope: list[bytes], header: bytes, body: bytes) -> None:
        """Send one answer without blocking; one that cannot be delivered is counted."""
        assert self._frontend is not None
        try:
            send_frames(self._frontend, [*envelope, header, body], block=False)
        except zmq.Again:
            self._metrics.dropped_replies.labels("client_backlog").inc()
        except zmq.ZMQError as e:
            if e.errno != errno.EHOSTUNREACH:
                raise
            self._metrics.dropped_replies.labels("client_gone").inc()

    def count(self, type_id: int, outcome: str) -> None:
        key = (type_id, outcome)
        child = self._outcomes.get(key)
        if child is None:
            name = self._type_names.get(type_id, "UNKNOWN")
            child = self._outcomes[key] = self._metrics.messages.labels(label(name), label(outcome))
        child.inc()

    def observe(self, type_id: int, seconds: float) -> None:
        self._durations[type_id].observe(seconds)

    def _bad_input(self, envelope: list[bytes], header_frame: bytes, error: str, message: str) -> None:
        self._metrics.bad_input.labels(label(error)).inc()
        if not self._bad_input_limit.allow(envelope[0], time.monotonic()):
            self._metrics.bad_input_throttled.inc()
            return
        self._answer_error(envelope, loose_header(header_frame), error, message, frame_no_reply(header_frame))

    def _answer_error(self, envelope: list[bytes], header: Header, error: str, message: str, no_reply: bool) -> None:
        self.count(header.type, error)
        if no_reply:
            return
        h = header.reply(transport_error=TRANSPORT_ERROR[error], flags=FLAG_DATA_ERROR)
        frame = encode_header(h)
        if header.type in REGISTRY.types_by_id:  # a SESSION_CREATE refusal carries no session id
            frame = with_transport_error(frame, h.transport_error)
        self.send(envelope, frame, encode_body(error_body("ERROR", error, message)))
