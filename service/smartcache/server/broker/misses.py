"""Guessing a session id, slowed: ``NOT_FOUND`` answers about sessions counted per peer, and a peer beyond
``SMARTCACHE_NOT_FOUND_PER_PEER_PER_S`` in its second refused ``QUEUE_FULL`` for what names a session.

Storage holds only HMACs of session ids (issue 37), so a guess can be tested only online, one
request each; PROTOCOL.md 4 (*Guessing a session id*) has the numbers. A worker marks a reply
that says a session is not live (:data:`smartcache.server.broker.inproc.MISS`); the dispatcher
counts it for the message's peer, and the intake refuses that peer's next requests that name a
session (a header session id, or ``SESSION_DELETE`` by handle) until its second ends: not
executed, answered ``QUEUE_FULL``, counted. Dropping the ``NOT_FOUND`` answers instead, as bad
input is dropped, would not slow a guesser: a hit would still be answered, and a silence would
be a miss.

The peer is the client's CURVE public key when CURVE is on (a reconnect gets no new allowance),
else its connection. Each second is a fixed window from the peer's first miss in it; at most
:data:`PEERS_TRACKED` peers are remembered (beyond, everyone is forgotten at once, as the
bad-input rate does).
"""

from __future__ import annotations

from smartcache.server.metrics import Metrics

#: peers whose misses are counted at once
PEERS_TRACKED = 10_000
#: the window a peer's misses are counted in
WINDOW_S = 1.0


class SessionMisses:
    """Per peer: [start of its window, misses in it] (broker thread only)."""

    def __init__(self, *, per_peer_per_s: int, metrics: Metrics) -> None:
        self._limit = per_peer_per_s
        self._peers: dict[bytes, list[float]] = {}
        self._missed = metrics.session_not_found
        self._refused = metrics.session_not_found_throttled

    def missed(self, peer: bytes, now: float) -> None:
        """A reply saying a session is not live went to ``peer``."""
        self._missed.inc()
        window = self._peers.get(peer)
        if window is not None and now - window[0] < WINDOW_S:
            window[1] += 1
            return
        if window is None and len(self._peers) >= PEERS_TRACKED:
            self._peers.clear()
        self._peers[peer] = [now, 1]

    def throttled(self, peer: bytes, now: float) -> bool:
        """Whether ``peer`` had its allowance of misses in its current second (counted as a refusal)."""
        window = self._peers.get(peer)
        if window is None or window[1] < self._limit:
            return False
        if now - window[0] >= WINDOW_S:
            del self._peers[peer]
            return False
        self._refused.inc()
        return True
