"""Which Tarantool instances there are, read from etcd: ``SMARTCACHE_ETCD`` + ``SMARTCACHE_CLUSTER``.

The cluster's members live in etcd (service/smartcache/wire/topology.py; Tarantool keeps
them, docs/storage-failover.md "Topology"): the topology key's members, but those being
removed; in a cluster that has no topology, the uris of the live member records
(an instance publishes one on its lease in HA mode). :class:`Discovery` reads
them; a Storage's :class:`~smartcache.server.storage.membership.Membership` asks it every
``DISCOVERY_INTERVAL_S`` and starts an ``Instance`` for a new address and closes
the one of an address gone.

Polled, not watched. One range read per second per storage connection is
nothing for etcd, and a topology changes a few times a year, by an operator: a
second's delay means nothing next to an instance's join (seconds) or to a
removal (the member stops taking part before it leaves the list, and the
service sends it nothing either way: it is not the leader). etcd's JSON
gateway does offer a watch (``POST /v3/watch``, a chunked stream), but it needs
a stream held open per connection, a new one after each member failover or
compaction, and a read of the current state before it anyway: more code than
the poll for no gain here. The poll moves between the members like the
instances' own client (the member that answered last first, each at most once
per read), so one member down costs at most one timeout now and then.

Through the asyncio face of the one etcd client (smartcache.ops.etcd.aio, on aiohttp): a
blocking read on the service's event loop would stall every request for as long as an etcd
member takes not to answer. The server imports ops, never the CLI or the console
(import-linter contracts in pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Sequence

from smartcache.ops.etcd import EtcdUnavailable
from smartcache.ops.etcd.aio import AsyncEtcd
from smartcache.wire import topology

#: how often the storage connection reads the members
DISCOVERY_INTERVAL_S = 1.0
#: one read of one etcd member: a member that does not answer costs this much, then the next is asked
ASK_TIMEOUT_S = 1.0
#: where the members came from: the topology, or (none there) the live member records
TOPOLOGY, RECORDS = "topology", "records"


class DiscoveryError(Exception):
    """etcd could not say which instances there are (no member answered, or the topology is unreadable): the
    caller keeps the instances it has."""


class Discovery:
    """Reads a cluster's instances from etcd. One per event loop (an aiohttp session belongs to one)."""

    def __init__(self, *, endpoints: Sequence[str], cluster: str, timeout_s: float = ASK_TIMEOUT_S) -> None:
        self.endpoints = list(endpoints)
        self.cluster = cluster
        self._etcd = AsyncEtcd(self.endpoints, timeout_s)

    async def addresses(self) -> tuple[tuple[str, ...], str]:
        """(the instances' addresses, TOPOLOGY or RECORDS); raises DiscoveryError."""
        found = await self._range(topology.topology_key(self.cluster))
        if found:
            try:
                return topology.parse(found[0]).addresses, TOPOLOGY
            except ValueError as e:
                raise DiscoveryError(f"the topology in etcd cannot be read: {e}") from e
        records = await self._range(topology.members_prefix(self.cluster), prefix=True)
        uris = {r["uri"] for v in records if (r := topology.parse_record(v)) is not None}
        return tuple(sorted(uris)), RECORDS

    async def bucket_map(self) -> bytes | None:
        """The cluster's bucket map as etcd holds it (None: the cluster is not sharded); raises DiscoveryError."""
        found = await self._range(topology.buckets_key(self.cluster))
        return found[0] if found else None

    async def close(self) -> None:
        await self._etcd.close()

    async def _range(self, key: str, *, prefix: bool = False) -> list[bytes]:
        """The values of key (or of every key under it), from the first member that answers."""
        try:
            return [kv.value for kv in await self._etcd.range(key, prefix=prefix)]
        except EtcdUnavailable as e:
            raise DiscoveryError(f"no etcd member answered: {e}") from e
