"""The storage instances one by one: a connection, a call, each one's role, the ones etcd knows, who leads.

Talks to every Tarantool instance directly (as the operator user). The instances known are
the access's addresses and, once etcd can be read, every member of the topology and every
live member record that no answer already covers (an instance is known by the address it
advertises, ``uri``), so an instance added with ``cluster add`` is seen without changing
``--tarantool``. The cluster's name (the etcd prefix) is the access's or, by default, the one
the first instance that answers reports.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import tarantool

from smartcache.ops import etcd
from smartcache.ops.access import Access
from smartcache.wire import topology

#: what the connector raises when an instance cannot be reached or stops answering
CONNECTION_ERRORS = (tarantool.error.Error, OSError)


def answered_error(e: BaseException) -> bool:
    """Whether e is an error the instance answered (access denied, a Lua error), not a connection lost or
    refused: asking again, or another instance, changes nothing."""
    return isinstance(e, tarantool.error.DatabaseError) and not isinstance(e, tarantool.error.NetworkError)


def connection(access: Access, address: str, answer_timeout_s: float | None = None) -> tarantool.Connection:
    """A connected connection whose calls wait answer_timeout_s (default: the access timeout) for an answer (the
    caller closes it); raises one of CONNECTION_ERRORS."""
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


@contextlib.contextmanager
def connected(access: Access, address: str, answer_timeout_s: float | None = None) -> Iterator[tarantool.Connection]:
    """A connection for the block, closed after it."""
    conn = connection(access, address, answer_timeout_s)
    try:
        yield conn
    finally:
        conn.close()


def call(
    access: Access, address: str, procedure: str, *args: Any, answer_timeout_s: float | None = None
) -> dict[str, Any]:
    """sc.<procedure>(nil, *args) on one instance, on a connection of its own; raises one of CONNECTION_ERRORS."""
    with connected(access, address, answer_timeout_s) as conn:
        result: dict[str, Any] = conn.call(f"sc.{procedure}", [None, *args]).data[0]
        return result


def role(access: Access, address: str) -> dict[str, Any]:
    """One instance's answer to sc.role(), or {"address", "error"} when it cannot be asked."""
    started = time.monotonic()
    try:
        out = call(access, address, "role")
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


def known(access: Access, *, discover: bool) -> tuple[list[dict[str, Any]], Registry | None]:
    """Every instance's sc.role: the access's, then (discover) the topology's and the live records' that no
    answer covers yet (an instance is known by its address or by the uri it advertises)."""
    instances = [role(access, a) for a in access.addresses]
    if not discover or not access.etcd:
        return instances, None
    reg = registry(access, instances)
    seen = {i["address"] for i in instances} | {i["uri"] for i in instances if i.get("uri")}
    more = [m.address for m in reg.topology.members] if reg.topology else []
    more += [r["uri"] for r in reg.records]
    for address in dict.fromkeys(more):
        if address not in seen:
            answer = role(access, address)
            instances.append(answer)
            seen |= {address, answer.get("uri") or address}
    return instances, reg


def find(access: Access, instance: str) -> dict[str, Any]:
    """An instance by address or uuid, with its role; raises LookupError."""
    found, _ = known(access, discover=True)
    for i in found:
        if instance in (i["address"], i.get("instance_uuid"), i.get("uri")):
            return i
    raise LookupError(f"no instance {instance!r} among {', '.join(access.addresses)}")


def leader_now(access: Access) -> dict[str, Any]:
    """Who leads now, among every instance known (the access's and etcd's): {"leader", "term"}. A writable
    standalone instance (no SC_ETCD: the legacy master) counts too, so that an operation is asked of it and
    answers plainly that failover is not configured."""
    instances, _ = known(access, discover=True)
    leaders = [i for i in instances if i.get("role") in ("leader", "standalone") and i.get("writable")]
    leader = max(leaders, key=lambda i: i.get("term") or 0, default=None)
    return {"leader": leader["address"] if leader else None, "term": leader.get("term") if leader else None}


def leader_of(access: Access) -> str | None:
    """The address of the instance that leads now (None: none does)."""
    leader: str | None = leader_now(access)["leader"]
    return leader
