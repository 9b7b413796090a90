"""What both faces of the etcd client share: the calls as data, base64 of keys, reading the answers, the endpoints.

etcd 3.4's v3 JSON gateway takes a POST of a JSON body per RPC (``/v3/kv/range``,
``/v3/kv/txn``, ``/v3/maintenance/status``...), keys and values base64-encoded, and
answers JSON (64-bit numbers as strings). A :class:`Call` is one such request; the
functions below build the ones we make and read their answers, so the blocking face
(:mod:`.sync`, urllib) and the asyncio face (:mod:`.aio`, aiohttp) only move bytes.

:class:`Attempt` is the one loop over the endpoints both faces run: the member that
answered last first, each at most once per call, what each one did kept for the
error; :class:`Rotation` remembers who answered last across calls.
"""

from __future__ import annotations

import base64
import urllib.error
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

#: one request to one member: a member that does not answer costs this much, then the next is asked
ASK_TIMEOUT_S = 2.0


class EtcdUnavailable(Exception):
    """No endpoint answered (HTTP 200 with a JSON object): the message says what each one did. The caller shows
    what it knows without etcd, or tries again later."""


@dataclass(frozen=True)
class Call:
    """One request of the gateway: a POST of body to path (body None: a GET, as ``/health`` is)."""

    path: str
    body: dict[str, Any] | None = None


@dataclass(frozen=True)
class KeyValue:
    """One key of a range's answer."""

    key: str
    value: bytes
    mod_revision: int = 0


STATUS = Call("/v3/maintenance/status", {})
HEALTH = Call("/health")
MEMBER_LIST = Call("/v3/cluster/member/list", {})


def b64(data: str | bytes) -> str:
    """A key or value as the gateway takes it."""
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def prefix_end(prefix: str) -> str:
    """etcd's range_end for every key that starts with prefix (prefix ends in '/', never 0xff)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def normal(url: str) -> str:
    """An endpoint without its trailing '/', http:// when no scheme is given."""
    url = url.strip().rstrip("/")
    return url if "://" in url else "http://" + url


def endpoints_of(text: str) -> list[str]:
    """The comma-separated endpoints of --etcd / SMARTCACHE_ETCD (scheme http:// when none is given)."""
    return [normal(e) for e in text.split(",") if e.strip()]


# --- the calls ---


def range_call(key: str, *, prefix: bool = False) -> Call:
    """The key (prefix: every key under it), a linearizable read."""
    body = {"key": b64(key)}
    if prefix:
        body["range_end"] = b64(prefix_end(key))
    return Call("/v3/kv/range", body)


def create_call(key: str, value: bytes) -> Call:
    """Put key only if it does not exist (its create_revision is 0); else read it."""
    return Call(
        "/v3/kv/txn",
        {
            "compare": [{"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": [{"request_put": {"key": b64(key), "value": b64(value)}}],
            "failure": [{"request_range": {"key": b64(key)}}],
        },
    )


def put_if_call(key: str, value: bytes, mod_revision: int) -> Call:
    """Put key only if its mod_revision is still mod_revision (a compare-and-swap)."""
    return Call(
        "/v3/kv/txn",
        {
            "compare": [{"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(mod_revision)}],
            "success": [{"request_put": {"key": b64(key), "value": b64(value)}}],
        },
    )


# --- the answers ---


def kvs(doc: dict[str, Any]) -> list[KeyValue]:
    """The keys of a range's answer (or of a txn's request_range)."""
    return [
        KeyValue(
            base64.b64decode(kv.get("key", "")).decode(),
            base64.b64decode(kv.get("value", "")),
            int(kv.get("mod_revision", 0)),
        )
        for kv in doc.get("kvs") or []
    ]


def succeeded(doc: dict[str, Any]) -> bool:
    """Whether a txn's compare held (its success branch ran)."""
    return bool(doc.get("succeeded"))


def created(doc: dict[str, Any], value: bytes) -> tuple[bytes, bool]:
    """A create's answer: the value etcd holds afterwards (ours, or the one that was there) and whether it is ours."""
    if succeeded(doc):
        return value, True
    found = kvs((doc.get("responses") or [{}])[0].get("response_range") or {})
    return (found[0].value, False) if found else (value, False)


def healthy(doc: Any) -> bool:
    """``/health`` says true: the member has a leader and answers a linearizable read."""
    return isinstance(doc, dict) and str(doc.get("health")) == "true"


def reason(e: BaseException) -> str:
    """Why a member did not answer, in words (a URLError's reason rather than its wrapper)."""
    if isinstance(e, urllib.error.URLError) and e.reason is not None:
        return f"{type(e).__name__}: {e.reason}"
    return f"{type(e).__name__}: {e}"


# --- the endpoints ---


class Rotation:
    """The endpoints and which answered last: a call asks that one first (a member down costs one timeout now and
    then, not on every call)."""

    def __init__(self, endpoints: Sequence[str]) -> None:
        self.endpoints = list(endpoints)
        self.first = 0

    def attempt(self) -> Attempt:
        return Attempt(self)


class Attempt:
    """One call's walk over the endpoints: iterate for the next one to ask, tell it what each did."""

    def __init__(self, rotation: Rotation) -> None:
        self._rotation = rotation
        self._errors: list[str] = []

    def __iter__(self) -> Iterator[str]:
        endpoints = self._rotation.endpoints
        n = len(endpoints)
        for i in range(n):
            self._index = (self._rotation.first + i) % n
            yield endpoints[self._index]

    def failed(self, endpoint: str, e: BaseException) -> None:
        """The endpoint did not answer (refused, timed out, not JSON)."""
        self._errors.append(f"{endpoint}: {reason(e)}")

    def answered(self, endpoint: str, code: int, doc: Any) -> bool:
        """Whether this answer is the call's (HTTP 200, a JSON object); else it is noted and the next is asked."""
        if code != 200 or not isinstance(doc, dict):
            self._errors.append(f"{endpoint}: HTTP {code}")
            return False
        self._rotation.first = self._index
        return True

    def unavailable(self) -> EtcdUnavailable:
        """The error once every endpoint was asked; the next call starts with the one after."""
        n = len(self._rotation.endpoints)
        if n:
            self._rotation.first = (self._rotation.first + 1) % n
        return EtcdUnavailable("; ".join(self._errors) or "no etcd endpoint given")
