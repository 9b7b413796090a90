"""The operator's commands on buckets, each written to the audit: one move, rebalance, drain, a settle pass.

``smartcache-cli cluster move / rebalance / drain / settle`` call these; the primitives they
stand on (:func:`~.engine.move`, :func:`~.engine.run_moves`, :func:`~.settler.settle`) write
nothing, since every service instance's settler and the load tests drive them too. A move, a
rebalance or a drain is written before it acts and with its outcome (:func:`smartcache.ops.audit.audited`:
one pair of entries for the whole plan, not one per bucket); a settle pass, which may find
nothing to do, is written once, after, when it changed something. The entries go to the first
of the map's shards whose leader takes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from smartcache.ops.access import Access
from smartcache.ops.audit import Actor, audited, note, shards
from smartcache.ops.moves.bucketmap import read_map
from smartcache.ops.moves.engine import Progress, move, run_moves
from smartcache.ops.moves.link import Links
from smartcache.ops.moves.plan import plan_even
from smartcache.ops.moves.settler import settle


def move_bucket(access: Access, bucket: int, destination: str, *, actor: Actor) -> dict[str, Any]:
    """One bucket to destination (:func:`~.engine.move`); MoveError as it raises it, recorded as the outcome."""
    doc, _ = read_map(access)

    def act() -> dict[str, Any]:
        links = Links(access)
        try:
            return {"status": "OK", **move(access, links, bucket, destination).as_dict()}
        finally:
            links.close()

    return audited(shards(access, doc["shards"]), actor, "cluster.move", f"bucket {bucket} to {destination}", act)


def plan(access: Access, *, away: Sequence[str] = ()) -> tuple[dict[str, Any], list[tuple[int, str]]]:
    """The map and the moves that leave its shards even (away: shards to empty, a drain)."""
    doc, _ = read_map(access)
    return doc, plan_even(doc, doc["shards"], away=away)


def rebalance(
    access: Access,
    moves: Sequence[tuple[int, str]],
    *,
    actor: Actor,
    drained: str | None = None,
    parallel: int = 2,
    pause_s: float = 0.0,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Do a plan (from :func:`plan`) as one audited command: cluster.drain of the shard drained, else
    cluster.rebalance."""
    doc, _ = read_map(access)
    action, target = ("cluster.drain", drained) if drained else ("cluster.rebalance", access.cluster or "")
    destinations = sorted({s for _, s in moves})
    return audited(
        shards(access, doc["shards"]), actor, action, target,
        lambda: run_moves(access, moves, parallel=parallel, pause_s=pause_s, progress=progress),
        details={"moves": len(moves), "to": destinations, "parallel": parallel, "pause_ms": round(pause_s * 1000)},
    )  # fmt: skip


def settle_once(access: Access, *, actor: Actor) -> dict[str, Any]:
    """One settle pass (:func:`~.settler.settle`), written to the audit when it did something."""
    links = Links(access)
    try:
        result = settle(access, links)
    finally:
        links.close()
    did = result.get("did") or []
    if did:
        doc, _ = read_map(access)
        details = {"did": [str(d)[:300] for d in did[:20]], "steps": len(did)}
        result["audit"] = {
            "done": note(shards(access, doc["shards"]), actor, "cluster.settle", access.cluster or "", details)
        }
    return result
