"""The blocking face of the etcd client: the standard library only (urllib), so it runs where only the client is.

:class:`Etcd` keeps its endpoints' rotation across calls (the member that answered last is
asked first); the module functions are one call each on a fresh one (the first endpoint first),
as the CLI and the move engine use them.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from smartcache.ops.etcd import core
from smartcache.ops.etcd.core import ASK_TIMEOUT_S, Call, KeyValue


def request(url: str, body: dict[str, Any] | None, timeout_s: float) -> tuple[int, Any]:
    """(status, decoded JSON) of a GET (body None) or a JSON POST; raises OSError/ValueError when no answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:  # noqa: S310 - the operator's endpoints
            return int(r.status), json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:  # an answer all the same (health false is a 503)
        return int(e.code), json.loads(e.read() or b"null")


def ask_one(endpoint: str, call: Call, timeout_s: float = ASK_TIMEOUT_S) -> Any:
    """One member's decoded answer to call, whatever its HTTP status; None when it does not answer."""
    try:
        return request(endpoint + call.path, call.body, timeout_s)[1]
    except (OSError, ValueError):
        return None


class Etcd:
    """The cluster's endpoints, asked in turn: each call goes to the first that answers."""

    def __init__(self, endpoints: Sequence[str], timeout_s: float = ASK_TIMEOUT_S) -> None:
        self.rotation = core.Rotation(endpoints)
        self.timeout_s = timeout_s

    def ask(self, call: Call) -> dict[str, Any]:
        """The answer of the first endpoint that answers call (HTTP 200, a JSON object); raises EtcdUnavailable
        saying what each endpoint did when none does."""
        attempt = self.rotation.attempt()
        for endpoint in attempt:
            try:
                code, doc = request(endpoint + call.path, call.body, self.timeout_s)
            except (OSError, ValueError) as e:
                attempt.failed(endpoint, e)
                continue
            if attempt.answered(endpoint, code, doc):
                answer: dict[str, Any] = doc
                return answer
        raise attempt.unavailable()

    def range(self, key: str, *, prefix: bool = False) -> list[KeyValue]:
        """The key (or every key under it); [] when absent."""
        return core.kvs(self.ask(core.range_call(key, prefix=prefix)))

    def create(self, key: str, value: bytes) -> tuple[bytes, bool]:
        """Put key only if it does not exist: the value etcd holds afterwards, and whether this call put it."""
        return core.created(self.ask(core.create_call(key, value)), value)

    def put_if(self, key: str, value: bytes, mod_revision: int) -> bool:
        """Put key only if its mod_revision is still mod_revision: whether it was put."""
        return core.succeeded(self.ask(core.put_if_call(key, value, mod_revision)))


# --- one call each, the first endpoint first ---


def read(endpoints: Sequence[str], key: str, timeout_s: float, *, prefix: bool = False) -> list[tuple[str, bytes]]:
    """The key (or every key under it, prefix=True) as [(key, value)], from the first endpoint that answers;
    [] when absent. Raises EtcdUnavailable when none does."""
    return [(kv.key, kv.value) for kv in Etcd(endpoints, timeout_s).range(key, prefix=prefix)]


def read_revision(endpoints: Sequence[str], key: str, timeout_s: float) -> tuple[bytes | None, int]:
    """The key's value and its mod_revision ((None, 0) when absent), from the first endpoint that answers a
    linearizable read. Raises EtcdUnavailable when none does."""
    found = Etcd(endpoints, timeout_s).range(key)
    return (found[0].value, found[0].mod_revision) if found else (None, 0)


def create(endpoints: Sequence[str], key: str, value: bytes, timeout_s: float) -> tuple[bytes, bool]:
    """Put key only if it does not exist (a transaction comparing its create_revision with 0); the value etcd
    holds afterwards (ours, or the one that was there) and whether this call put it. Raises EtcdUnavailable
    when no endpoint answers."""
    return Etcd(endpoints, timeout_s).create(key, value)


def put_if(endpoints: Sequence[str], key: str, value: bytes, mod_revision: int, timeout_s: float) -> bool:
    """Put key only if its mod_revision is still mod_revision (a compare-and-swap): whether it was put. A member
    that does not answer is passed over for the next: if the swap happened there after all, the next compares
    an older revision and answers False, and the caller reads the key again. Raises EtcdUnavailable."""
    return Etcd(endpoints, timeout_s).put_if(key, value, mod_revision)
