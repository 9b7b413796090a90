"""The storage cluster as an operator sees it: ``smartcache-cli cluster status|switchover|rejoin|init|add|remove``.

Talks to every Tarantool instance directly (as the operator user) and calls
``sc.role``, ``sc.switchover``, ``sc.rejoin`` and ``sc.topology_*``
(lua/smartcache/failover/procedures.lua). It never changes a role or the
membership by itself: a switchover is asked of the leader, which hands its etcd
key to the candidate; a rejoin is asked of the instance to rebuild, which
restarts empty and copies the leader; a membership change (init, add, remove) is
asked of the leader, which writes the topology in etcd by compare-and-swap and
waits for the others (lua/README.md, "Topology"). ``status`` shows the etcd
members beside the instances (service/smartcache/cli/etcd.py), and the topology: the
registered members and any live instance that is not one.

The instances asked are ``--tarantool``'s, and, once etcd can be read, every
member of the topology and every live member record that no answer already
covers (an instance is known by the address it advertises, ``uri``), so an
instance added with ``cluster add`` is seen without changing ``--tarantool``.
The cluster's name (the etcd prefix) is ``--cluster`` or, by default, the one
the first instance that answers reports.

An instance that stops answering in the middle of a switchover or a rejoin (the
leader killed during the hand-over: the connector's NetworkError, errno 104) is
an answer too: ``{"error": "CONNECTION_LOST"}`` with who leads now, never a
traceback; the hand-over may or may not have happened, and the status after it
says which.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import tarantool

from smartcache.cli import etcd
from smartcache.wire import topology

CONNECT_TIMEOUT_S = 2.0
#: what the connector raises when an instance cannot be reached or stops answering
CONNECTION_ERRORS = (tarantool.error.Error, OSError)


@dataclass(frozen=True)
class Access:
    """How to reach the instances: addresses and the service user's credentials."""

    addresses: Sequence[str]
    user: str
    password: str
    timeout_s: float = CONNECT_TIMEOUT_S
    #: etcd's client endpoints (empty: do not ask etcd)
    etcd: Sequence[str] = ()
    #: the cluster's name (SC_CLUSTER); None: the one the instances report
    cluster: str | None = None


@contextlib.contextmanager
def _connect(access: Access, address: str, answer_timeout_s: float | None = None) -> Iterator[tarantool.Connection]:
    """A connection whose calls wait answer_timeout_s (default: the access timeout) for an answer."""
    conn = connection(access, address, answer_timeout_s)
    try:
        yield conn
    finally:
        conn.close()


def connection(access: Access, address: str, answer_timeout_s: float | None = None) -> tarantool.Connection:
    """A connected connection (the caller closes it); raises one of CONNECTION_ERRORS."""
    host, _, port = address.rpartition(":")
    conn = tarantool.Connection(
        host,
        int(port),
        user=access.user,
        password=access.password,
        connect_now=False,
        connection_timeout=access.timeout_s,
        socket_timeout=answer_timeout_s or access.timeout_s,
        reconnect_max_attempts=0,
        fetch_schema=False,
    )
    conn.connect()
    return conn


def _call(
    access: Access, address: str, procedure: str, *args: Any, answer_timeout_s: float | None = None
) -> dict[str, Any]:
    with _connect(access, address, answer_timeout_s) as conn:
        result: dict[str, Any] = conn.call(f"sc.{procedure}", [None, *args]).data[0]
        return result


def role(access: Access, address: str) -> dict[str, Any]:
    """One instance's answer to sc.role(), or {"address", "error"} when it cannot be asked."""
    started = time.monotonic()
    try:
        out = _call(access, address, "role")
    except CONNECTION_ERRORS as e:
        return {"address": address, "reachable": False, "error": f"{type(e).__name__}: {e}"}
    out.pop("status", None)
    return {"address": address, "reachable": True, "rtt_ms": round((time.monotonic() - started) * 1000, 1), **out}


@dataclass(frozen=True)
class Registry:
    """What etcd says of the cluster's membership: its topology (None: none) and the live member records."""

    cluster: str | None
    topology: topology.Topology | None = None
    records: tuple[dict[str, Any], ...] = ()
    #: why it could not be read (etcd unavailable, an unreadable topology); None when it was
    error: str | None = None


def registry(access: Access, instances: Sequence[dict[str, Any]]) -> Registry:
    """The topology and the member records of the cluster (its name given, or reported by an instance)."""
    cluster = access.cluster or next((i["cluster"] for i in instances if i.get("cluster")), None)
    if not access.etcd or cluster is None:
        return Registry(cluster, error=None if access.etcd else "no etcd endpoints given")
    try:
        found = etcd.read(access.etcd, topology.topology_key(cluster), access.timeout_s)
        records = etcd.read(access.etcd, topology.members_prefix(cluster), access.timeout_s, prefix=True)
    except etcd.EtcdUnavailable as e:
        return Registry(cluster, error=f"etcd unavailable: {e}")
    parsed = [r for _, v in records if (r := topology.parse_record(v)) is not None]
    try:
        topo = topology.parse(found[0][1]) if found else None
    except ValueError as e:
        return Registry(cluster, records=tuple(parsed), error=str(e))
    return Registry(cluster, topo, tuple(parsed))


def _instances(access: Access, *, discover: bool) -> tuple[list[dict[str, Any]], Registry | None]:
    """Every instance's sc.role: --tarantool's, then (discover) the topology's and the live records' that no
    answer covers yet (an instance is known by its address or by the uri it advertises)."""
    instances = [role(access, a) for a in access.addresses]
    if not discover or not access.etcd:
        return instances, None
    reg = registry(access, instances)
    known = {i["address"] for i in instances} | {i["uri"] for i in instances if i.get("uri")}
    more = [m.address for m in reg.topology.members] if reg.topology else []
    more += [r["uri"] for r in reg.records]
    for address in dict.fromkeys(more):
        if address not in known:
            answer = role(access, address)
            instances.append(answer)
            known |= {address, answer.get("uri") or address}
    return instances, reg


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


def status(access: Access, *, with_etcd: bool = True) -> dict[str, Any]:
    """Every instance's role, term, lease, vclock and replication, and who leads; etcd's members beside them,
    and the topology (registered members, live instances that are not). A sharded cluster: each shard's."""
    sharded = bucket_map(access) if with_etcd else None
    if sharded is not None and access.cluster is not None:
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
    instances, reg = _instances(access, discover=with_etcd)
    if access.cluster is None and reg is not None and reg.cluster and "." in reg.cluster:
        # The instances asked are one shard's (<cluster>.<shard>): the status of the whole sharded cluster.
        whole = replace(access, cluster=reg.cluster.rsplit(".", 1)[0])
        if bucket_map(whole) is not None:
            return status(whole)
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


def _held(access: Access, shard: str, leader: str | None) -> dict[str, Any]:
    """What a shard's leader holds: how many buckets are active there, and the moves in flight (each bucket not
    active, with its state, generation, peer and how long it has been in that state)."""
    if leader is None:
        return {"error": "no leader to ask"}
    shard_access = replace(access, cluster=topology.shard_cluster(access.cluster or "", shard), addresses=())
    try:
        held = _call(shard_access, leader, "buckets_held")
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
    by_uri: dict[str, dict[str, Any]] = {}
    for i in instances:
        by_uri.setdefault(i["address"], i)
        if i.get("uri"):
            by_uri[i["uri"]] = i
    records = {r["uri"]: r for r in reg.records}
    if reg.topology is None:
        out["version"] = None
        out["note"] = (
            "no topology: SC_CLUSTER_SIZE makes the majority and every instance counts "
            "(smartcache-cli cluster init makes one from the live members)"
        )
        return out
    members = []
    for m in reg.topology.members:
        i = by_uri.get(m.address, {})
        members.append(
            {
                "address": m.address,
                "http_port": m.http_port,
                "eligible": m.eligible,
                "leaving": m.leaving,
                "role": i.get("role") or records.get(m.address, {}).get("role") or "down",
                "reachable": bool(i.get("reachable")),
                "topology_version": i.get("topology_version"),
            }
        )
    listed = {m.address for m in reg.topology.members}
    unregistered = []
    for uri in dict.fromkeys([*records, *(i.get("uri") for i in instances if i.get("reachable"))]):
        if not uri or uri in listed:
            continue
        i, r = by_uri.get(uri, {}), records.get(uri, {})
        unregistered.append(
            {
                "address": uri,
                "uuid": i.get("instance_uuid") or r.get("uuid"),
                "role": i.get("role") or r.get("role"),
                "reachable": bool(i.get("reachable")),
                "reason": r.get("reason"),
            }
        )
    out.update(version=reg.topology.version, members=members, unregistered=unregistered)
    return out


def etcd_status(access: Access, instances: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """etcd's members, unless none were given or every instance that answers runs standalone (etcd unused)."""
    if not access.etcd:
        return {"skipped": "no etcd endpoints given (--etcd '')"}
    answered = [i for i in instances if i.get("reachable")]
    if answered and all(i.get("role") == "standalone" for i in answered):
        return {"skipped": "the instances run standalone (no SC_ETCD): etcd decides nothing here"}
    return etcd.status(access.etcd, access.timeout_s)


def find(access: Access, instance: str) -> dict[str, Any]:
    """An instance by address or uuid, with its role; raises LookupError."""
    found, _ = _instances(access, discover=True)
    for i in found:
        if instance in (i["address"], i.get("instance_uuid"), i.get("uri")):
            return i
    raise LookupError(f"no instance {instance!r} among {', '.join(access.addresses)}")


def _lost(access: Access, address: str, what: str, e: BaseException) -> dict[str, Any]:
    """The answer when an instance stopped answering during an operation: what is known now."""
    after = _leader_now(access)
    return {
        "error": "CONNECTION_LOST",
        "address": address,
        "message": f"{address} stopped answering during the {what} ({type(e).__name__}: {e}); it may or may not "
        "have happened: see the leader and term now (smartcache-cli cluster status)",
        "leader": after["leader"],
        "term": after["term"],
    }


def _leader_now(access: Access) -> dict[str, Any]:
    """Who leads now, among every instance known (--tarantool's and etcd's). A writable standalone instance (no
    SC_ETCD: the legacy master) counts too, so that the operation is asked of it and answers plainly that
    failover is not configured."""
    instances, _ = _instances(access, discover=True)
    leaders = [i for i in instances if i.get("role") in ("leader", "standalone") and i.get("writable")]
    leader = max(leaders, key=lambda i: i.get("term") or 0, default=None)
    return {"leader": leader["address"] if leader else None, "term": leader.get("term") if leader else None}


def leader_of(access: Access) -> str | None:
    """The address of the instance that leads now (None: none does)."""
    leader: str | None = _leader_now(access)["leader"]
    return leader


def switchover(access: Access, candidate: str | None, timeout_ms: int) -> dict[str, Any]:
    """Ask the leader to hand over to candidate (or to the most up-to-date follower); reports the write pause."""
    now = _leader_now(access)
    if now["leader"] is None:
        return {"status": "NO_LEADER", "message": "no instance leads now: nothing to hand over", **now}
    uuid = None
    if candidate:
        target = find(access, candidate)
        if not target.get("reachable"):
            return {"status": "UNREACHABLE", "address": target["address"], "message": target.get("error")}
        uuid = target["instance_uuid"]
    # the leader answers once the candidate has taken over or timeout_ms has passed
    try:
        result = _call(access, now["leader"], "switchover", uuid, timeout_ms, answer_timeout_s=timeout_ms / 1000 + 5)
    except CONNECTION_ERRORS as e:
        return _lost(access, now["leader"], "switchover", e)
    return {"from": now["leader"], **result}


def rejoin(access: Access, instance: str, *, force: bool) -> dict[str, Any]:
    """Ask an instance (diverged, or any follower with force) to rebuild itself from the leader."""
    target = find(access, instance)
    if not target.get("reachable"):
        return {"status": "UNREACHABLE", "address": target["address"], "message": target.get("error")}
    try:
        result = _call(access, target["address"], "rejoin", target["instance_uuid"], force, answer_timeout_s=30.0)
    except CONNECTION_ERRORS as e:
        return _lost(access, target["address"], "rejoin", e)
    return {"address": target["address"], **result}


#: how long a membership change may take beyond its own timeout before the CLI stops waiting for the answer
CHANGE_ANSWER_MARGIN_S = 10.0
#: how long a membership change looks for a leader before it answers NO_LEADER, and how often
LEADER_WAIT_S = 10.0
LEADER_POLL_S = 0.5


def _on_leader(access: Access, what: str, procedure: str, *args: Any, wait_s: float) -> dict[str, Any]:
    """A membership change, asked of the leader (the only one that changes the topology). No leader now: asked
    again for up to LEADER_WAIT_S (a leader holds its writes for a moment after a topology or quorum change, and
    an election takes a TTL and a bit), then NO_LEADER."""
    deadline = time.monotonic() + LEADER_WAIT_S
    now = _leader_now(access)
    while now["leader"] is None and time.monotonic() < deadline:
        time.sleep(LEADER_POLL_S)
        now = _leader_now(access)
    if now["leader"] is None:
        return {
            "status": "NO_LEADER",
            "message": f"no instance leads now (asked for {LEADER_WAIT_S:g} s): the {what} goes through the leader",
            **now,
        }
    try:
        result = _call(access, now["leader"], procedure, *args, answer_timeout_s=wait_s + CHANGE_ANSWER_MARGIN_S)
    except CONNECTION_ERRORS as e:
        return _lost(access, now["leader"], what, e)
    return {"leader": now["leader"], **result}


def topology_init(access: Access, *, force: bool = False) -> dict[str, Any]:
    """The cluster's first topology, made by the leader from the live members; OK (created false) if one exists."""
    return _on_leader(access, "topology init", "topology_init", force, wait_s=5.0)


def topology_add(access: Access, address: str, *, http_port: int | None, eligible: bool) -> dict[str, Any]:
    """Make address a member (an instance waiting for it then joins); seeds the first topology if there is none."""
    return _on_leader(access, "member add", "topology_add", address, http_port, eligible, wait_s=5.0)


def topology_remove(access: Access, address: str, timeout_ms: int) -> dict[str, Any]:
    """Take address out: first it stops replicating and counting in the quorum, then the list shrinks."""
    return _on_leader(access, "member removal", "topology_remove", address, timeout_ms, wait_s=timeout_ms / 1000 + 5)


def shards_init(access: Access, shards: Sequence[str], buckets_count: int) -> dict[str, Any]:
    """A sharded cluster's bucket map (created once in etcd: the buckets split in equal ranges over the shards,
    in the order given), then each shard's leader takes its buckets (sc.buckets_init). Idempotent: an existing
    map is kept as it is and each shard is given the buckets that map names (docs/design/sharding.md)."""
    if access.cluster is None:
        return {"status": "BAD_REQUEST", "message": "--cluster names the sharded cluster"}
    step, ranges = -(-buckets_count // len(shards)), []
    for i, name in enumerate(shards):
        first, last = i * step, min(buckets_count, (i + 1) * step) - 1
        if first <= last:
            ranges.append([first, last, name])
    doc = {"version": 1, "buckets": buckets_count, "shards": list(shards), "ranges": ranges}
    stored, created = etcd.create(
        access.etcd, topology.buckets_key(access.cluster), json.dumps(doc).encode(), access.timeout_s
    )
    held = json.loads(stored)
    out: dict[str, Any] = {"status": "OK", "map": held, "created": created, "shards": {}}
    for name in held["shards"]:
        mine = [b for first, last, s in held["ranges"] if s == name for b in range(first, last + 1)]
        shard_access = replace(access, cluster=topology.shard_cluster(access.cluster, name), addresses=())
        answer = _on_leader(shard_access, "buckets init", "buckets_init", held["buckets"], mine, wait_s=5.0)
        out["shards"][name] = answer
        if answer.get("status") != "OK":
            out["status"] = answer.get("status") or "ERROR"
    return out
