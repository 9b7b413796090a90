"""Scenarios: what one in-flight slot of the load generator sends next.

A scenario is a small state machine per slot: ``first(slot)`` gives the first
request, ``next(slot, reply)`` the one after a reply. Requests are
(type name, body, session id bytes). Everything is deterministic per seed.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Any

from smartcache.wire import NO_SESSION

Request = tuple[str, dict[str, Any], bytes]
BODY_100 = {"d": "x" * 96}  # msgpack: 100 bytes of session data


@dataclass
class Scenario:
    name: str
    seed: int = 0
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def first(self, slot: int) -> Request:
        raise NotImplementedError

    def next(self, slot: int, status: str, session: bytes) -> Request:
        raise NotImplementedError


class SessionScenario(Scenario):
    """The original's headline: create a session with a 100-byte body, then get it (two requests)."""

    def first(self, slot: int) -> Request:
        return ("SESSION_CREATE", {"client_id": f"c{slot}", "data": BODY_100}, NO_SESSION)

    def next(self, slot: int, status: str, session: bytes) -> Request:
        if session != NO_SESSION and status == "OK" and self._last.get(slot) == "SESSION_CREATE":
            self._last[slot] = "SESSION_GET"
            return ("SESSION_GET", {}, session)
        self._last[slot] = "SESSION_CREATE"
        return self.first(slot)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._last: dict[int, str] = {}


class SessionReadScenario(Scenario):
    """The front tier's shape (issue 25): sessions read far more than written, 20 reads to 1 write.

    Each generator process first creates a pool of sessions (POOL), then reads one at random,
    with a SESSION_UPDATE of one at random every 21st request: each session is read about
    once a second or two at bench rates, as a user tapping through the app reads theirs.
    """

    POOL = 2000
    WRITE_EVERY = 21

    def first(self, slot: int) -> Request:
        return self._pick()

    def next(self, slot: int, status: str, session: bytes) -> Request:
        if session != NO_SESSION and status == "OK" and self._creating:
            self._pool.append(session)
        return self._pick()

    def _pick(self) -> Request:
        self._n += 1
        self._creating = len(self._pool) < self.POOL
        if self._creating:
            return ("SESSION_CREATE", {"client_id": f"r{self.seed}-{self._n}", "data": BODY_100}, NO_SESSION)
        sid = self._pool[self.rng.randrange(len(self._pool))]
        if self._n % self.WRITE_EVERY == 0:
            return ("SESSION_UPDATE", {"set": {"step": self._n}}, sid)
        return ("SESSION_GET", {}, sid)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._pool: list[bytes] = []
        self._n = 0
        self._creating = True


class CacheScenario(Scenario):
    """Global cache: put a 100-byte value under one of 10,000 keys, then get it."""

    def first(self, slot: int) -> Request:
        key = f"k{self.rng.randrange(10_000)}"
        self._key[slot] = key
        return ("CACHE_PUT", {"key": key, "data": BODY_100}, NO_SESSION)

    def next(self, slot: int, status: str, session: bytes) -> Request:
        if self._put.get(slot, True):
            self._put[slot] = False
            return ("CACHE_GET", {"key": self._key[slot]}, NO_SESSION)
        self._put[slot] = True
        return self.first(slot)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._key: dict[int, str] = {}
        self._put: dict[int, bool] = {}


class MixedScenario(Scenario):
    """A front-server day: app starts, logins, session reads and touches, cache traffic, product reads."""

    DEVICES = 2000

    def first(self, slot: int) -> Request:
        return self._pick(slot)

    def next(self, slot: int, status: str, session: bytes) -> Request:
        if session != NO_SESSION and status == "OK":
            self._sessions.append(session)
            if len(self._sessions) > 5000:
                self._sessions = self._sessions[-2500:]
        return self._pick(slot)

    def _pick(self, slot: int) -> Request:
        r, rng = self.rng.random(), self.rng
        device = f"dev{rng.randrange(self.DEVICES)}"
        client = f"client{rng.randrange(self.DEVICES)}"
        sid = rng.choice(self._sessions) if self._sessions else NO_SESSION
        if r < 0.05:
            return ("APP_START", {"device_id": device}, NO_SESSION)
        if r < 0.10 or sid == NO_SESSION:
            return ("SESSION_CREATE", {"client_id": client, "data": BODY_100}, NO_SESSION)
        if r < 0.12:
            return ("DEVICE_BIND", {"device_id": device, "client_id": client}, NO_SESSION)
        if r < 0.50:
            return ("SESSION_GET", {}, sid)
        if r < 0.60:
            return ("SESSION_TOUCH", {}, sid)
        if r < 0.70:
            return ("SESSION_UPDATE", {"data": {"step": rng.randrange(5)}}, sid)
        if r < 0.80:
            return ("CACHE_PUT", {"key": f"p{rng.randrange(50)}", "data": BODY_100}, sid)
        if r < 0.92:
            return ("CACHE_GET", {"key": f"p{rng.randrange(50)}"}, sid)
        return ("PRODUCTS_GET", {"client_id": client, "data_type": 1 + rng.randrange(4)}, NO_SESSION)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._sessions: list[bytes] = []


class ProductsScenario(Scenario):
    """PRODUCTS_GET for a new client every time: every request reaches the (slow) backend."""

    def first(self, slot: int) -> Request:
        self._n += 1
        return ("PRODUCTS_GET", {"client_id": f"o{self.seed}-{self._n}", "data_type": 1}, NO_SESSION)

    def next(self, slot: int, status: str, session: bytes) -> Request:
        return self.first(slot)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._n = 0


class CounterScenario(Scenario):
    """Rate-limit counters (issue 17): COUNTER_ADD of 1 to one of 10,000 windowed counters, every request a write."""

    def first(self, slot: int) -> Request:
        body = {"name": f"otp:c{self.rng.randrange(10_000)}", "delta": 1, "max": 1 << 40, "ttl_ms": 300_000}
        return ("COUNTER_ADD", body, NO_SESSION)

    def next(self, slot: int, status: str, session: bytes) -> Request:
        return self.first(slot)


SCENARIOS: dict[str, type[Scenario]] = {
    "session": SessionScenario,
    "session-read": SessionReadScenario,
    "cache": CacheScenario,
    "mixed": MixedScenario,
    "overload": SessionScenario,  # same requests, driven open-loop at 2-3x capacity
    "slow-backend": ProductsScenario,
    "counter": CounterScenario,
}


def make(name: str, seed: int | None = None) -> Scenario:
    return SCENARIOS[name](name=name, seed=os.getpid() if seed is None else seed)
