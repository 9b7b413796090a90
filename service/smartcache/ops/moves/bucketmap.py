"""The bucket map in etcd: which shard owns which bucket, read and changed by compare-and-swap on its revision.

The map is ``{"version", "buckets", "shards", "ranges": [[first, last, shard], ...]}`` under
the cluster's buckets key (service/smartcache/wire/topology.py); docs/design/sharding.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from smartcache.ops import etcd
from smartcache.ops.access import Access
from smartcache.ops.moves.errors import MoveError, NotSharded
from smartcache.wire import topology

#: how many compare-and-swaps a change of the map tries before it gives up (each lost one re-reads the map)
SWAP_TRIES = 20


def read_map(access: Access) -> tuple[dict[str, Any], int]:
    """etcd's bucket map and its mod_revision; NotSharded when the cluster has none."""
    assert access.cluster is not None
    raw, revision = etcd.read_revision(access.etcd, topology.buckets_key(access.cluster), access.timeout_s)
    if raw is None:
        raise NotSharded(f"cluster {access.cluster} has no bucket map: not sharded (cluster init --shards)")
    doc: dict[str, Any] = json.loads(raw)
    return doc, revision


def owners(doc: dict[str, Any]) -> list[str]:
    """The map as one owner per bucket."""
    out = [""] * int(doc["buckets"])
    for first, last, shard in doc["ranges"]:
        out[first : last + 1] = [shard] * (last - first + 1)
    return out


def ranges_of(owner: Sequence[str]) -> list[list[Any]]:
    """Owners per bucket as [first, last, shard] ranges."""
    out: list[list[Any]] = []
    for b, shard in enumerate(owner):
        if out and out[-1][2] == shard and out[-1][1] == b - 1:
            out[-1][1] = b
        else:
            out.append([b, b, shard])
    return out


def change_map(access: Access, change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> dict[str, Any]:
    """Apply change to the map by compare-and-swap (read, change, put if unchanged since; again on a race).
    change returns the new map, or None when the map already says what it should."""
    assert access.cluster is not None
    key = topology.buckets_key(access.cluster)
    for _ in range(SWAP_TRIES):
        doc, revision = read_map(access)
        new = change(doc)
        if new is None:
            return doc
        new["version"] = int(doc["version"]) + 1
        if etcd.put_if(access.etcd, key, json.dumps(new).encode(), revision, access.timeout_s):
            return new
    raise MoveError(f"the bucket map changed under every one of {SWAP_TRIES} compare-and-swaps")


def assign(access: Access, buckets: dict[int, str], was: dict[int, str] | None = None) -> dict[str, Any]:
    """The map names these owners for these buckets (one swap for all); with was, only for the buckets whose owner
    in the map is still the one the caller saw (a caller with an older view never undoes a newer move)."""

    def change(doc: dict[str, Any]) -> dict[str, Any] | None:
        owner = owners(doc)
        todo = {b: s for b, s in buckets.items() if owner[b] != s and (was is None or owner[b] == was.get(b))}
        if not todo:
            return None
        for b, s in todo.items():
            owner[b] = s
        shards = list(doc["shards"]) + sorted(set(todo.values()) - set(doc["shards"]))
        return {**doc, "shards": shards, "ranges": ranges_of(owner)}

    return change_map(access, change)
