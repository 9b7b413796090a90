"""Replies: the one door every answer leaves the broker through, and where it is counted.

Both sides of the broker answer clients: intake (PING, bad input, refusals
before a message is queued: :mod:`.intake`) and dispatch (workers' replies,
and refusals of queued or running messages: :mod:`.dispatch`). They all call
:class:`Replies`, which sends without blocking (an answer that cannot be
delivered is dropped and counted, never waited for), counts each outcome per
type, and observes each message's time in the service. :meth:`Replies.refuse`
is the cheap path that runs at overload rates: it patches the request's
header in place of re-encoding it, and reuses encoded error bodies.
"""

from __future__ import annotations

import errno
import time
from typing import Any

import zmq

from smartcache.server.broker.queue import Holder
from smartcache.server.metrics import REJECTION_REASONS, Metrics, label
from smartcache.server.zmqio import send_frames
from smartcache.wire import (
    FLAG_DATA_ERROR,
    REGISTRY,
    TRANSPORT_ERROR,
    Header,
    encode_body,
    encode_header,
    error_body,
    with_transport_error,
)

#: encoded error bodies kept for reuse (refusals with a fixed message)
ERROR_BODIES_KEPT = 256


class Replies:
    """Send, count and time every answer (broker thread only)."""

    def __init__(self, *, metrics: Metrics) -> None:
        self._metrics = metrics
        self._frontend: zmq.Socket[Any] | None = None
        self._type_names = {t.id: t.name for t in REGISTRY.types.values()}
        self._durations = {t.id: metrics.duration.labels(label(t.name)) for t in REGISTRY.types.values()}
        self._outcomes: dict[tuple[int, str], Any] = {}
        self._rejections = {r: metrics.rejections.labels(r) for r in REJECTION_REASONS}
        self._error_bodies: dict[tuple[str, str], bytes] = {}

    def attach(self, frontend: zmq.Socket[Any]) -> None:
        """The client socket answers leave through (bound by the broker)."""
        self._frontend = frontend

    def reply(self, h: Holder, header: bytes, body: bytes, now: float) -> None:
        """A worker's reply to a holder (nothing is sent for a NO_REPLY one); the worker counted it."""
        if not h.no_reply:
            self.send(h.envelope, header, body)
        self._durations[h.type_id].observe(now - h.arrived)

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

    def error(self, envelope: list[bytes], header: Header, error: str, message: str, no_reply: bool) -> None:
        """Answer a message that was never queued (bad input, FORBIDDEN, SHUTTING_DOWN) with a transport error."""
        self.count(header.type, error)
        if no_reply:
            return
        h = header.reply(transport_error=TRANSPORT_ERROR[error], flags=FLAG_DATA_ERROR)
        frame = encode_header(h)
        if header.type in REGISTRY.types_by_id:  # a SESSION_CREATE refusal carries no session id
            frame = with_transport_error(frame, h.transport_error)
        self.send(envelope, frame, encode_body(error_body("ERROR", error, message)))

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

    def rejected(self, reason: str) -> None:
        """Count a message refused without an answer of its own (an internal one at stop)."""
        self._rejections[reason].inc()
