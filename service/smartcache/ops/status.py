"""The storage cluster as ``cluster status`` and the console show it: instances, etcd, topology, shards.

Every instance's ``sc.role`` (role, term, lease, vclock, replication) and who leads; the
etcd members beside them (:mod:`smartcache.ops.etcd.members`), and the topology: the
registered members and any live instance that is not one. A sharded cluster (a bucket map
in etcd) is each shard's status, with what its leader holds and moves.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from smartcache.ops import etcd
from smartcache.ops.access import Access
from smartcache.ops.instances import CONNECTION_ERRORS, Registry, call, known
from smartcache.wire import topology


def bucket_map(access: Access) -> dict[str, Any] | None:
    """The cluster's bucket map as etcd holds it (None: not sharded, or no etcd or cluster name given)."""
    if not access.etcd or not access.cluster:
        return None
    try:
        found = etcd.read(access.etcd, topology.buckets_key(access.cluster), access.timeout_s)
    except etcd.EtcdUnavailable:
        return None
    doc = json.loads(found[0][1]) if found else None
    return doc if isinstance(doc, dict) else None


def sharded_cluster_of(access: Access, replica_set: str) -> str | None:
    """The sharded cluster a replica set is a shard of: for ``<cluster>.<shard>``, <cluster> when etcd holds its
    bucket map; None for any other name (a cluster of its own, a dotted name with no map, etcd not asked)."""
    whole, dot, _ = replica_set.rpartition(".")
    if not dot or bucket_map(replace(access, cluster=whole)) is None:
        return None
    return whole


def status(access: Access, *, with_etcd: bool = True) -> dict[str, Any]:
    """Every instance's role, term, lease, vclock and replication, and who leads; etcd's members beside them,
    and the topology (registered members, live instances that are not). A sharded cluster: each shard's."""
    sharded = bucket_map(access) if with_etcd else None
    if sharded is not None and access.cluster is not None:
        return _sharded(access, sharded)
    instances, reg = known(access, discover=with_etcd)
    if access.cluster is None and reg is not None and reg.cluster:
        # The instances asked are one shard's (<cluster>.<shard>): the status of the whole sharded cluster.
        whole = sharded_cluster_of(access, reg.cluster)
        if whole is not None:
            return status(replace(access, cluster=whole))
    _http_ports(instances, reg)
    writable = [i["address"] for i in instances if i.get("writable")]
    leaders = [i for i in instances if i.get("role") == "leader"]
    leader = max(leaders, key=lambda i: i.get("term") or 0, default=None)
    counted = instances
    if reg is not None and reg.topology is not None:  # with a topology, its members make the health
        members = set(reg.topology.addresses)
        counted = [i for i in instances if (i.get("uri") or i["address"]) in members or i["address"] in members]
    storage_healthy = len(writable) == 1 and all(i.get("reachable") and not i.get("diverged") for i in counted)
    out: dict[str, Any] = {
        "leader": leader["address"] if leader else (writable[0] if len(writable) == 1 else None),
        "term": leader.get("term") if leader else None,
        "writable": writable,
        "healthy": storage_healthy,
        "instances": instances,
    }
    if with_etcd:
        out["etcd"] = etcd_status(access, instances)
        out["topology"] = topology_status(reg, instances)
        out["healthy"] = storage_healthy and out["etcd"].get("healthy", True)
    return out


def _http_ports(instances: Sequence[dict[str, Any]], reg: Registry | None) -> None:
    """Each instance's operator HTTP port, as its member record in etcd publishes it (the console reads sessions
    there: by handle, without refreshing them); none for a standalone instance, which publishes no record."""
    if reg is None:
        return
    ports = {r["uri"]: r.get("http_port") for r in reg.records}
    for i in instances:
        port = ports.get(i.get("uri") or i["address"]) or ports.get(i["address"])
        if isinstance(port, int):
            i["http_port"] = port


def _sharded(access: Access, sharded: dict[str, Any]) -> dict[str, Any]:
    """Each shard's status (its replica set runs as <cluster>.<shard>), what its leader holds, and the map."""
    assert access.cluster is not None
    per = {
        name: status(replace(access, cluster=topology.shard_cluster(access.cluster, name), addresses=()))
        for name in sharded.get("shards", [])
    }
    for name, shard in per.items():
        shard["buckets"] = _held(access, name, shard.get("leader"))
    return {
        "healthy": bool(per) and all(p["healthy"] for p in per.values()),
        "cluster": access.cluster,
        "buckets": {"count": sharded.get("buckets"), "version": sharded.get("version"),
                    "ranges": sharded.get("ranges")},
        "shards": per,
    }  # fmt: skip


def _held(access: Access, shard: str, leader: str | None) -> dict[str, Any]:
    """What a shard's leader holds: how many buckets are active there, and the moves in flight (each bucket not
    active, with its state, generation, peer and how long it has been in that state)."""
    if leader is None:
        return {"error": "no leader to ask"}
    shard_access = replace(access, cluster=topology.shard_cluster(access.cluster or "", shard), addresses=())
    try:
        held = call(shard_access, leader, "buckets_held")
    except CONNECTION_ERRORS as e:
        return {"error": f"{type(e).__name__}: {e}"}
    if held.get("status") != "OK":
        return {"error": str(held.get("message") or held.get("status"))}
    now = held.get("now_ms") or 0
    moving = [
        {"bucket": m["bucket"], "state": m.get("state"), "generation": m.get("generation"), "peer": m.get("peer"),
         "for_s": round((now - (m.get("since") or now)) / 1000, 1)}
        for m in held.get("moving") or []
    ]  # fmt: skip
    return {"active": len(held.get("active") or []), "moving": moving}


def topology_status(reg: Registry | None, instances: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The registered members with each one's role, and the live instances that are not members."""
    if reg is None:
        return {"skipped": "no etcd endpoints given (--etcd '')"}
    if reg.cluster is None:
        return {"skipped": "no cluster name: no instance in HA mode answered (--cluster names it)"}
    out: dict[str, Any] = {"cluster": reg.cluster}
    if reg.error:
        out["error"] = reg.error
    if reg.topology is None:
        out["version"] = None
        out["note"] = (
            "no topology: SC_CLUSTER_SIZE makes the majority and every instance counts "
            "(smartcache-cli cluster init makes one from the live members)"
        )
        return out
    by_uri: dict[str, dict[str, Any]] = {}
    for i in instances:
        by_uri.setdefault(i["address"], i)
        if i.get("uri"):
            by_uri[i["uri"]] = i
    records = {r["uri"]: r for r in reg.records}
    members = [
        {
            "address": m.address,
            "http_port": m.http_port,
            "eligible": m.eligible,
            "leaving": m.leaving,
            "role": role_shown(by_uri.get(m.address, {}), records.get(m.address, {})) or "down",
            "reachable": bool(by_uri.get(m.address, {}).get("reachable")),
            "topology_version": by_uri.get(m.address, {}).get("topology_version"),
        }
        for m in reg.topology.members
    ]
    listed = {m.address for m in reg.topology.members}
    unregistered = _unregistered(listed, records, by_uri, instances)
    out.update(version=reg.topology.version, members=members, unregistered=unregistered)
    return out


def role_shown(answer: dict[str, Any], record: dict[str, Any]) -> str | None:
    """An instance's role: the one it answers; else the one its member record in etcd last said, marked as not
    confirmed ("leader? (no answer)"). A killed leader's record outlives it by up to a lease (SC_LEADER_TTL_S):
    shown as plain "leader", it read as a leader while none was elected (issue 36)."""
    said = answer.get("role") or None
    if said is not None:
        return str(said)
    recorded = record.get("role")
    return f"{recorded}? (no answer)" if recorded else None


def _unregistered(
    listed: set[str],
    records: dict[str, dict[str, Any]],
    by_uri: dict[str, dict[str, Any]],
    instances: Sequence[dict[str, Any]],
) -> list[dict[str, Any]]:
    """The live instances (a member record, or an answer) that the topology does not list."""
    live = [i.get("uri") for i in instances if i.get("reachable")]
    out = []
    for uri in dict.fromkeys([*records, *live]):
        if not uri or uri in listed:
            continue
        i, r = by_uri.get(uri, {}), records.get(uri, {})
        out.append(
            {
                "address": uri,
                "uuid": i.get("instance_uuid") or r.get("uuid"),
                "role": role_shown(i, r),
                "reachable": bool(i.get("reachable")),
                "reason": r.get("reason"),
            }
        )
    return out


def etcd_status(access: Access, instances: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """etcd's members, unless none were given or every instance that answers runs standalone (etcd unused)."""
    if not access.etcd:
        return {"skipped": "no etcd endpoints given (--etcd '')"}
    answered = [i for i in instances if i.get("reachable")]
    if answered and all(i.get("role") == "standalone" for i in answered):
        return {"skipped": "the instances run standalone (no SC_ETCD): etcd decides nothing here"}
    return etcd.status(access.etcd, access.timeout_s)
