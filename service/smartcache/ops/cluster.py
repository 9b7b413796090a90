"""The storage cluster's operations: switchover, rejoin, topology changes, a sharded cluster's map; and its status.

The one name the CLI, the console and the service import for the cluster
(``from smartcache.ops import cluster``): the operations are here, the rest is re-exported from
:mod:`.access`, :mod:`.instances` and :mod:`.status`.

It never changes a role or the membership by itself: a switchover is asked of the leader,
which hands its etcd key to the candidate; a rejoin is asked of the instance to rebuild,
which restarts empty and copies the leader; a membership change (init, add, remove) is asked
of the leader, which writes the topology in etcd by compare-and-swap and waits for the
others (docs/storage-failover.md, "Topology"); the procedures are lua/smartcache/failover/procedures.lua's.

An instance that stops answering in the middle of a switchover or a rejoin (the leader
killed during the hand-over: the connector's NetworkError, errno 104) is an answer too:
``{"error": "CONNECTION_LOST"}`` with who leads now, never a traceback; the hand-over may or
may not have happened, and the status after it says which.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from smartcache.ops import etcd
from smartcache.ops.access import CONNECT_TIMEOUT_S, Access
from smartcache.ops.audit import UNATTENDED, Actor, audited, replica_set, shards
from smartcache.ops.instances import (
    CONNECTION_ERRORS,
    Registry,
    call,
    connection,
    find,
    leader_now,
    leader_of,
    registry,
    role,
)
from smartcache.ops.status import bucket_map, etcd_status, sharded_cluster_of, status, topology_status
from smartcache.wire import topology

__all__ = [
    "CHANGE_ANSWER_MARGIN_S",
    "CONNECTION_ERRORS",
    "CONNECT_TIMEOUT_S",
    "LEADER_POLL_S",
    "LEADER_WAIT_S",
    "Access",
    "Actor",
    "Registry",
    "bucket_map",
    "connection",
    "etcd_status",
    "find",
    "leader_of",
    "registry",
    "rejoin",
    "role",
    "sharded_cluster_of",
    "shards_init",
    "status",
    "switchover",
    "topology_add",
    "topology_init",
    "topology_remove",
    "topology_status",
]

#: how long a membership change may take beyond its own timeout before the CLI stops waiting for the answer
CHANGE_ANSWER_MARGIN_S = 10.0
#: how long a membership change looks for a leader before it answers NO_LEADER, and how often
LEADER_WAIT_S = 10.0
LEADER_POLL_S = 0.5


def _lost(access: Access, address: str, what: str, e: BaseException) -> dict[str, Any]:
    """The answer when an instance stopped answering during an operation: what is known now."""
    after = leader_now(access)
    return {
        "error": "CONNECTION_LOST",
        "address": address,
        "message": f"{address} stopped answering during the {what} ({type(e).__name__}: {e}); it may or may not "
        "have happened: see the leader and term now (smartcache-cli cluster status)",
        "leader": after["leader"],
        "term": after["term"],
    }


def switchover(access: Access, candidate: str | None, timeout_ms: int, *, actor: Actor = UNATTENDED) -> dict[str, Any]:
    """Ask the leader to hand over to candidate (or to the most up-to-date follower); reports the write pause."""
    now = leader_now(access)
    if now["leader"] is None:
        return {"status": "NO_LEADER", "message": "no instance leads now: nothing to hand over", **now}
    uuid = None
    if candidate:
        target = find(access, candidate)
        if not target.get("reachable"):
            return {"status": "UNREACHABLE", "address": target["address"], "message": target.get("error")}
        uuid = target["instance_uuid"]

    def act() -> dict[str, Any]:
        # the leader answers once the candidate has taken over or timeout_ms has passed
        try:
            result = call(access, now["leader"], "switchover", uuid, timeout_ms, answer_timeout_s=timeout_ms / 1000 + 5)
        except CONNECTION_ERRORS as e:
            return _lost(access, now["leader"], "switchover", e)
        return {"from": now["leader"], **result}

    details = {"from": now["leader"], "timeout_ms": timeout_ms}
    return audited(replica_set(access), actor, "cluster.switchover", candidate or "", act, details=details)


def rejoin(access: Access, instance: str, *, force: bool, actor: Actor = UNATTENDED) -> dict[str, Any]:
    """Ask an instance (diverged, or any follower with force) to rebuild itself from the leader."""
    target = find(access, instance)
    if not target.get("reachable"):
        return {"status": "UNREACHABLE", "address": target["address"], "message": target.get("error")}

    def act() -> dict[str, Any]:
        try:
            result = call(access, target["address"], "rejoin", target["instance_uuid"], force, answer_timeout_s=30.0)
        except CONNECTION_ERRORS as e:
            return _lost(access, target["address"], "rejoin", e)
        return {"address": target["address"], **result}

    return audited(replica_set(access), actor, "cluster.rejoin", target["address"], act, details={"force": force})


def _on_leader(
    access: Access, what: str, procedure: str, *args: Any, wait_s: float, actor: Actor | None, target: str = ""
) -> dict[str, Any]:
    """A membership change, asked of the leader (the only one that changes the topology). No leader now: asked
    again for up to LEADER_WAIT_S (a leader holds its writes for a moment after a topology or quorum change, and
    an election takes a TTL and a bit), then NO_LEADER. Written to the audit once a leader is found (actor None:
    a step of an operation that is written as a whole, shards_init's buckets_init)."""
    deadline = time.monotonic() + LEADER_WAIT_S
    now = leader_now(access)
    while now["leader"] is None and time.monotonic() < deadline:
        time.sleep(LEADER_POLL_S)
        now = leader_now(access)
    if now["leader"] is None:
        return {
            "status": "NO_LEADER",
            "message": f"no instance leads now (asked for {LEADER_WAIT_S:g} s): the {what} goes through the leader",
            **now,
        }

    def act() -> dict[str, Any]:
        try:
            result = call(access, now["leader"], procedure, *args, answer_timeout_s=wait_s + CHANGE_ANSWER_MARGIN_S)
        except CONNECTION_ERRORS as e:
            return _lost(access, now["leader"], what, e)
        return {"leader": now["leader"], **result}

    if actor is None:
        return act()
    return audited(replica_set(access), actor, f"cluster.{procedure}", target, act, details={"arguments": list(args)})


def topology_init(access: Access, *, force: bool = False, actor: Actor = UNATTENDED) -> dict[str, Any]:
    """The cluster's first topology, made by the leader from the live members; OK (created false) if one exists."""
    return _on_leader(access, "topology init", "topology_init", force, wait_s=5.0, actor=actor)


def topology_add(
    access: Access, address: str, *, http_port: int | None, eligible: bool, actor: Actor = UNATTENDED
) -> dict[str, Any]:
    """Make address a member (an instance waiting for it then joins); seeds the first topology if there is none."""
    return _on_leader(
        access, "member add", "topology_add", address, http_port, eligible, wait_s=5.0, actor=actor, target=address
    )


def topology_remove(access: Access, address: str, timeout_ms: int, *, actor: Actor = UNATTENDED) -> dict[str, Any]:
    """Take address out: first it stops replicating and counting in the quorum, then the list shrinks."""
    return _on_leader(
        access, "member removal", "topology_remove", address, timeout_ms, wait_s=timeout_ms / 1000 + 5, actor=actor,
        target=address,
    )  # fmt: skip


def shards_init(
    access: Access, names: Sequence[str], buckets_count: int, *, actor: Actor = UNATTENDED
) -> dict[str, Any]:
    """A sharded cluster's bucket map (created once in etcd: the buckets split in equal ranges over the shards,
    in the order given), then each shard's leader takes its buckets (sc.buckets_init). Idempotent: an existing
    map is kept as it is and each shard is given the buckets that map names (docs/design/sharding.md)."""
    if access.cluster is None:
        return {"status": "BAD_REQUEST", "message": "--cluster names the sharded cluster"}
    details = {"shards": list(names), "buckets": buckets_count}
    return audited(
        shards(access, names), actor, "cluster.shards_init", access.cluster,
        lambda: _shards_init(access, names, buckets_count), details=details,
    )  # fmt: skip


def _shards_init(access: Access, names: Sequence[str], buckets_count: int) -> dict[str, Any]:
    assert access.cluster is not None
    step, ranges = -(-buckets_count // len(names)), []
    for i, name in enumerate(names):
        first, last = i * step, min(buckets_count, (i + 1) * step) - 1
        if first <= last:
            ranges.append([first, last, name])
    doc = {"version": 1, "buckets": buckets_count, "shards": list(names), "ranges": ranges}
    stored, created = etcd.create(
        access.etcd, topology.buckets_key(access.cluster), json.dumps(doc).encode(), access.timeout_s
    )
    held = json.loads(stored)
    out: dict[str, Any] = {"status": "OK", "map": held, "created": created, "shards": {}}
    for name in held["shards"]:
        mine = [b for first, last, s in held["ranges"] if s == name for b in range(first, last + 1)]
        shard_access = replace(access, cluster=topology.shard_cluster(access.cluster, name), addresses=())
        answer = _on_leader(shard_access, "buckets init", "buckets_init", held["buckets"], mine, wait_s=5.0, actor=None)
        out["shards"][name] = answer
        if answer.get("status") != "OK":
            out["status"] = answer.get("status") or "ERROR"
    return out
