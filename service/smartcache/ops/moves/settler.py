"""Settling what drivers left: moves finished or given up with no person, in every service instance.

A driver may die mid-move (a killed CLI, a leader change, a partition). :func:`settle` is one
pass over every shard: it finishes the moves past send_done, gives up those stalled before it,
deletes stale copies, collects garbage, and makes the map name the shard each bucket is
active on. The :class:`Settler` runs it every few seconds in a thread of each service
instance. Any number of them may act on one bucket at once: each transition is checked by
storage against the bucket's status and generation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from smartcache.ops import etcd, instances
from smartcache.ops.access import Access
from smartcache.ops.moves.bucketmap import assign, owners, read_map
from smartcache.ops.moves.engine import give_up
from smartcache.ops.moves.errors import MoveError, NotSharded, ok
from smartcache.ops.moves.link import Links

#: a move that has made no progress for this long is given up by the settler (its driver is gone); longer
#: than a driver's call may take to find a new leader, so that a driver riding out a failover is not overtaken
STALL_S = 15.0
#: how often the settler's thread looks at the clock (its interval may be changed while it runs)
SETTLER_TICK_S = 0.5


def settle(access: Access, links: Links, *, stall_s: float | None = None) -> dict[str, Any]:
    """One pass over every shard: finish the moves past send_done, give up those stalled (no progress for
    stall_s, default STALL_S) before it, delete stale copies, collect garbage, and make the map name the shard
    each bucket is active on. Returns what it did, and how many buckets each shard serves and moves."""
    doc, _ = read_map(access)
    pass_ = _Pass(access, links, doc, STALL_S if stall_s is None else stall_s)
    held: dict[str, dict[str, Any]] = {}
    for shard in doc["shards"]:
        try:
            held[shard] = ok(links[shard].call("buckets_held"), f"buckets of {shard}")
        except MoveError as e:
            pass_.did.append(f"{shard} not asked: {e}")
    for shard, h in held.items():
        for b, generation in h["active"]:
            pass_.active_on[b], pass_.active_gen[b] = shard, generation
    for shard, h in held.items():
        for m in h["moving"]:
            if m.get("peer") and not m.get("pending"):
                pass_.one(shard, m, h["now_ms"])
    wrong = {b: s for b, s in pass_.active_on.items() if pass_.owner[b] != s}
    if wrong:
        assign(access, wrong, was={b: pass_.owner[b] for b in wrong})
        pass_.did.append(f"the map names the shard {len(wrong)} bucket(s) are active on: {sorted(wrong)[:10]}")
    counts = {s: {"active": len(h["active"]), "moving": len(h["moving"])} for s, h in held.items()}
    return {"status": "OK", "did": pass_.did, "map_version": doc["version"], "held": counts}


@dataclass
class _Pass:
    """One settle pass: what it knows of the map and of who serves what, and what it did."""

    access: Access
    links: Links
    doc: dict[str, Any]
    stall_s: float
    did: list[str] = field(default_factory=list)
    active_on: dict[int, str] = field(default_factory=dict)
    #: bucket -> the generation it is active at (on active_on's shard)
    active_gen: dict[int, int] = field(default_factory=dict)
    owner: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.owner = owners(self.doc)

    def state(self, shard: str, bucket: int) -> dict[str, Any] | None:
        """The bucket's row on a shard's leader, committed (None: the shard cannot be asked now, or a write of
        the row still waits for its quorum: nothing is decided on a guess)."""
        if shard not in self.doc["shards"]:
            return None
        try:
            r = ok(self.links[shard].call("bucket_state", bucket), f"bucket {bucket} on {shard}")
        except MoveError:
            return None
        return None if r.get("pending") else r

    def one(self, shard: str, m: dict[str, Any], now_ms: int) -> None:
        """A bucket of shard between states, against its peer's row; a refused step is noted, not raised."""
        try:
            other = self.state(m["peer"], m["bucket"])
            if m["state"] == "sending":
                self._sending(shard, m, now_ms, other)
            elif other is None:
                return
            elif m["state"] in ("sent", "garbage"):
                self._sent(shard, m, other)
            elif m["state"] in ("receiving", "aborting"):
                self._receiving(shard, m, other)
        except (MoveError, *instances.CONNECTION_ERRORS, etcd.EtcdUnavailable) as e:
            self.did.append(f"bucket {m['bucket']} on {shard}: not settled now: {e}")

    def _sending(self, shard: str, m: dict[str, Any], now_ms: int, other: dict[str, Any] | None) -> None:
        """The source of a move: given up once quiet for stall_s on both clocks (each shard's own since and now):
        a move that makes progress on either is alive."""
        quiet_ms = now_ms - (m.get("since") or 0)
        if other is not None:
            quiet_ms = min(quiet_ms, (other.get("now_ms") or 0) - (other.get("since") or 0))
        if quiet_ms > self.stall_s * 1000:
            b, peer = m["bucket"], m["peer"]
            outcome = give_up(self.links, b, shard, peer, m["generation"])
            self.did.append(f"bucket {b} {shard} -> {peer}: {outcome}, {quiet_ms / 1000:.0f} s without progress")

    def _sent(self, shard: str, m: dict[str, Any], other: dict[str, Any]) -> None:
        """The source past send_done: the destination made active if it is not yet, the map told, the source's
        copy collected once the bucket is active elsewhere at this generation or later."""
        b, gen, peer = m["bucket"], m["generation"], m["peer"]
        o_status, o_gen = other.get("state"), other.get("generation")
        if o_status == "receiving" and o_gen == gen:
            ok(self.links[peer].call("bucket_recv_done", b, gen), "recv_done")
            self.active_on[b], self.active_gen[b] = peer, gen
            self.did.append(f"bucket {b} {shard} -> {peer}: made active on {peer} (the source was sent)")
            o_status = "active"
        moved_on = b in self.active_on and self.active_on[b] != shard and self.active_gen[b] >= gen
        if (o_status == "active" and o_gen == gen) or moved_on:
            if o_status == "active" and o_gen == gen and self.owner[b] != peer:
                assign(self.access, {b: peer}, was={b: self.owner[b]})
                self.owner[b] = peer
            ok(self.links[shard].call("bucket_gc", b, gen), "gc")
            self.did.append(f"bucket {b}: garbage on {shard} deleted")

    def _receiving(self, shard: str, m: dict[str, Any], other: dict[str, Any]) -> None:
        """A copy the source no longer backs (it holds nothing of the bucket, or moved on to a later generation):
        deleted."""
        b, status, gen = m["bucket"], m["state"], m["generation"]
        o_status, o_gen = other.get("state"), other.get("generation")
        stale = o_gen is not None and (o_gen > gen or (o_gen == gen and o_status == "active"))
        if status == "aborting" or o_status is None or (stale and o_status in ("active", "sending")):
            ok(self.links[shard].call("bucket_recv_abort", b, gen), "recv_abort")
            self.did.append(f"bucket {b}: a stale copy on {shard} (generation {gen}) deleted")


class Settler:
    """Runs :func:`settle` every interval_s in a thread of its own (every service instance has one, so a move
    whose driver died is finished or given up with no person); stopped by stop()."""

    def __init__(
        self,
        access: Access,
        interval_s: float = 5.0,
        log: Callable[[dict[str, Any]], None] | None = None,
        observe: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.access = access
        self.interval_s = interval_s
        self._log = log
        self._observe = observe  # every pass's result (the buckets each shard holds and moves: metrics)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bucket-settler", daemon=True)
        self._failing = ""  # the last pass's failure, logged once per kind

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 1.0) -> None:
        """Ask the thread to end and wait timeout_s for it (a pass under way ends by itself: a daemon thread, its
        connections closed when it does; a service's stop is not held up by an etcd that does not answer)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        links = Links(self.access)
        last = time.monotonic()
        try:
            while not self._stop.wait(min(SETTLER_TICK_S, self.interval_s)):
                if time.monotonic() - last < self.interval_s:
                    continue
                last = time.monotonic()
                self._pass(links)
        finally:
            links.close()

    def _pass(self, links: Links) -> None:
        """One settle pass, its result observed and logged when it did something; a failure logged once per kind."""
        try:
            result = settle(self.access, links)
        except NotSharded:
            return  # one replica set: nothing moves (a map made later is settled from then on)
        except Exception as e:  # the settler lives on; logged once per kind
            error = f"{type(e).__name__}: {e}"
            if error != self._failing and self._log is not None:  # once per kind of failure, not every pass
                self._log({"status": "ERROR", "did": [error]})
            self._failing = error
            return
        self._failing = ""
        if self._observe is not None:
            self._observe(result)
        if result.get("did") and self._log is not None:
            self._log({k: v for k, v in result.items() if k != "held"})
