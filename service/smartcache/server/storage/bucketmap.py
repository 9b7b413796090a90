"""Which bucket a call is about, and which shard holds a bucket: the routing rules and the bucket map.

A call's bucket comes from its own arguments, by the same rules storage applies
(lua/smartcache/api.lua's ROUTE: the client id, a session id's bucket, a device id, an
object's name, the cache key of the global namespace); the bucket map (etcd's
``/smartcache/<cluster>/buckets``) names the shard. No I/O: :mod:`.shards` reads the map and
sends the calls.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from smartcache.wire import buckets


@dataclass(frozen=True, slots=True)
class BucketMap:
    """etcd's bucket map: ``{"version", "buckets", "shards", "ranges": [[first, last, shard], ...]}``."""

    version: int
    buckets: int
    shards: tuple[str, ...]
    firsts: tuple[int, ...]
    owners: tuple[str, ...]

    @classmethod
    def parse(cls, value: bytes | str) -> BucketMap:
        """The map from its JSON; ValueError saying what is wrong (every bucket must have one owner)."""
        try:
            doc = json.loads(value)
        except ValueError as e:
            raise ValueError(f"the bucket map is not JSON: {e}") from e
        if not isinstance(doc, dict):
            raise ValueError("the bucket map is not a JSON object")  # noqa: TRY004 (a bad value, as the rest)
        count, version, shards = doc.get("buckets"), doc.get("version"), doc.get("shards")
        if not isinstance(count, int) or not 1 <= count <= buckets.MAX_BUCKETS:
            raise ValueError(f"buckets must be 1..{buckets.MAX_BUCKETS}, not {count!r}")
        if not isinstance(version, int) or version < 1:
            raise ValueError(f"version must be a positive integer, not {version!r}")
        if not isinstance(shards, list) or not shards or not all(isinstance(s, str) and s for s in shards):
            raise ValueError("shards must be a list of shard names")
        ranges = sorted(doc.get("ranges") or [], key=lambda r: r[0] if isinstance(r, list) and r else -1)
        expected, firsts, owners = 0, [], []
        for r in ranges:
            if not (isinstance(r, list) and len(r) == 3 and isinstance(r[0], int) and isinstance(r[1], int)):
                raise ValueError(f"a range is [first, last, shard], not {r!r}")
            first, last, shard = r
            if first != expected or last < first or last >= count:
                raise ValueError(f"the ranges must cover buckets 0..{count - 1} once, in order: {r!r} after {expected}")
            if shard not in shards:
                raise ValueError(f"range {r!r} names a shard the map does not list")
            firsts.append(first)
            owners.append(shard)
            expected = last + 1
        if expected != count:
            raise ValueError(f"the ranges leave buckets {expected}..{count - 1} without a shard")
        return cls(version, count, tuple(shards), tuple(firsts), tuple(owners))

    def shard_of(self, bucket: int) -> str:
        return self.owners[bisect.bisect_right(self.firsts, bucket) - 1]


#: procedure -> (kind, index of the argument): 'key' routes by the argument's text, 'session' by a session id;
#: the cache's calls route by the session when it is set, else by the key (the global namespace)
_BY_FIRST_KEY = (
    "session_list", "session_delete_client", "device_bind", "device_lookup",
    "prewarm_acquire", "prewarm_complete", "prewarm_fail", "prewarm_wait",
    "counter_get", "counter_add", "counter_cas", "register_get", "register_cas",
    "sequence_reserve", "sequence_get", "semaphore_acquire", "semaphore_release", "semaphore_renew",
    "semaphore_get", "latch_create", "latch_count_down", "latch_await", "latch_get",
    "queue_put", "queue_take", "queue_ack", "queue_release", "queue_stats",
)  # fmt: skip
_BY_SESSION = ("session_get", "session_touch", "session_update", "session_rotate", "session_rekey")
ROUTE: Mapping[str, tuple[str, int]] = {
    **dict.fromkeys(_BY_SESSION, ("session", 0)),
    **dict.fromkeys(_BY_FIRST_KEY, ("key", 0)),
    **dict.fromkeys(("cache_put", "cache_get", "cache_delete"), ("cache", 0)),
    "session_create": ("key", 1),
    "event_publish": ("key", 1),
    # by the header's session, or by handle with its client: the client's bucket (a session's bucket is its
    # client's), as api.lua's delete_call
    "session_delete": ("delete", 0),
}
#: where session_delete by handle has its client_id
_DELETE_CLIENT_ARG = 3


def bucket_of_call(procedure: str, args: Sequence[Any], count: int) -> int | None:
    """The call's bucket, or None: not about one key (PING, STATS, an event with no key), or a session id made
    before sharding (it carries none: located by asking the shards)."""
    route = ROUTE.get(procedure)
    if route is None:
        return None
    kind, index = route
    value = args[index] if index < len(args) else None
    if kind == "cache":
        if value:
            kind = "session"
        else:
            kind, value = "key", args[1] if len(args) > 1 else None
    elif kind == "delete":
        if value:
            kind = "session"
        else:
            kind, value = "key", args[_DELETE_CLIENT_ARG] if len(args) > _DELETE_CLIENT_ARG else None
    if value is None or value == "":
        return None
    if kind == "session":
        text = str(value).replace("-", "")
        return buckets.session_bucket(bytes.fromhex(text)) if len(text) == 32 else None
    return buckets.bucket_of(str(value), count)


def session_argument(procedure: str, args: Sequence[Any]) -> str | None:
    """The session id a call is about, if it routes by one."""
    route = ROUTE.get(procedure)
    if route is None or route[0] not in ("session", "cache", "delete") or not args or not args[0]:
        return None
    return str(args[0])
