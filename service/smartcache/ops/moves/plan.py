"""Plans: which buckets move where so that the shards hold as many (rebalance, drain); a shard that joins empty."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from smartcache.ops.access import Access
from smartcache.ops.audit import UNATTENDED, Actor, audited, shards
from smartcache.ops.moves.bucketmap import change_map, owners, read_map
from smartcache.ops.moves.errors import MoveError
from smartcache.ops.moves.link import Link


def plan_even(doc: dict[str, Any], shards: Sequence[str], *, away: Sequence[str] = ()) -> list[tuple[int, str]]:
    """Moves (bucket, destination) that leave the shards holding the buckets evenly by count (within one), every
    bucket of away moved to the others; the fewest moves (a shard gives only what it holds above its share)."""
    owner = owners(doc)
    keep = [s for s in shards if s not in away]
    if not keep:
        raise MoveError("no shard would be left to hold the buckets")
    held: dict[str, list[int]] = {s: [] for s in keep}
    pool: list[int] = []
    for b, s in enumerate(owner):
        held.get(s, pool).append(b)
    base, extra = divmod(len(owner), len(keep))
    by_size = sorted(keep, key=lambda x: -len(held[x]))
    target = {s: base + (1 if i < extra else 0) for i, s in enumerate(by_size)}
    for s in keep:
        while len(held[s]) > target[s]:
            pool.append(held[s].pop())
    moves: list[tuple[int, str]] = []
    for b in pool:
        s = max(keep, key=lambda x: target[x] - len(held[x]))
        held[s].append(b)
        moves.append((b, s))
    return moves


def shard_add(access: Access, name: str, *, actor: Actor = UNATTENDED) -> dict[str, Any]:
    """A new shard (its replica set running as SC_CLUSTER=<cluster>.<name>) joins the map holding no bucket, and
    its leader learns the bucket count; rebalance then fills it. Written to the audit (on the map's shards)."""
    doc, _ = read_map(access)
    return audited(
        shards(access, doc["shards"]), actor, "cluster.shard_add", name, lambda: _shard_add(access, doc, name)
    )


def _shard_add(access: Access, doc: dict[str, Any], name: str) -> dict[str, Any]:
    link = Link(access, name)
    try:
        init = link.call("buckets_init", doc["buckets"], [])
    finally:
        link.close()
    if init.get("status") != "OK":
        return {"status": init.get("status"), "message": f"shard {name}: {init.get('message') or init}"}

    def change(d: dict[str, Any]) -> dict[str, Any] | None:
        return None if name in d["shards"] else {**d, "shards": [*d["shards"], name]}

    new = change_map(access, change)
    return {"status": "OK", "shard": name, "shards": new["shards"], "map_version": new["version"]}
