"""The storage cluster's members as etcd holds them: the keys and their JSON, for the CLI and the service.

Tarantool writes them (lua/smartcache/failover/topology.lua and membership.lua,
whose docs/storage-failover.md section "Topology" is the reference); smartcache-cli reads
them for ``cluster status`` and the service for its list of instances. Both
need the same key names and the same reading of a value, and the server may
not import the CLI, so this small parser lives here with the other formats the
programs share. No I/O.

* ``/smartcache/<cluster>/topology``: ``{"version": N, "members": [{"address",
  "http_port", "eligible", "leaving"}]}``, changed only by the leader, by
  compare-and-swap; absent in a cluster that never had one (membership is then
  SC_CLUSTER_SIZE's, as before);
* ``/smartcache/<cluster>/members/<uuid>``: each live instance's record on its
  lease (``uri``, ``role``, ``http_port``, ``registered``, ``topology_version``...).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

#: what SC_CLUSTER and SMARTCACHE_CLUSTER may be (it becomes part of etcd keys)
CLUSTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def prefix(cluster: str) -> str:
    return f"/smartcache/{cluster}/"


def topology_key(cluster: str) -> str:
    return prefix(cluster) + "topology"


def buckets_key(cluster: str) -> str:
    """A sharded cluster's bucket map (service/smartcache/server/storage/shards.py, docs/design/sharding.md)."""
    return prefix(cluster) + "buckets"


def shard_cluster(cluster: str, shard: str) -> str:
    """The name a shard's replica set runs under (its SC_CLUSTER: its keys live under this prefix)."""
    return f"{cluster}.{shard}"


def members_prefix(cluster: str) -> str:
    return prefix(cluster) + "members/"


def leader_key(cluster: str) -> str:
    return prefix(cluster) + "leader"


@dataclass(frozen=True)
class Member:
    """One member of the topology."""

    address: str
    http_port: int | None = None
    eligible: bool = True
    #: marked by the first step of a removal: it replicates from nobody, its acknowledgements do not count
    leaving: bool = False


@dataclass(frozen=True)
class Topology:
    version: int
    members: tuple[Member, ...]

    @property
    def addresses(self) -> tuple[str, ...]:
        """The members that serve: every one but those being removed."""
        return tuple(m.address for m in self.members if not m.leaving)

    def find(self, address: str) -> Member | None:
        return next((m for m in self.members if m.address == address), None)


def parse(value: bytes | str) -> Topology:
    """The topology key's value; ValueError when it is not one."""
    try:
        doc = json.loads(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"the topology is not JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("members"), list) or not doc["members"]:
        raise ValueError("the topology has no members list")
    members = []
    for m in doc["members"]:
        if not isinstance(m, dict) or not isinstance(m.get("address"), str) or ":" not in m["address"]:
            raise ValueError(f"a topology member without an address: {m!r}")
        port = m.get("http_port")
        members.append(
            Member(
                address=m["address"],
                http_port=port if isinstance(port, int) else None,
                eligible=m.get("eligible") is not False,
                leaving=m.get("leaving") is True,
            )
        )
    version = doc.get("version")
    return Topology(version=version if isinstance(version, int) else 0, members=tuple(members))


def parse_record(value: bytes | str) -> dict[str, Any] | None:
    """A member record (``members/<uuid>``) as a dict with a ``uri``; None when it is not one."""
    try:
        doc = json.loads(value)
    except (TypeError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("uri"), str):
        return None
    return doc
