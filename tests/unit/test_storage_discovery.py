"""Discovery without I/O: the topology's JSON, and how the storage connection follows what etcd lists
(service/smartcache/wire/topology.py, service/smartcache/server/storage/discovery.py, membership.Membership.apply)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from smartcache.server.config import Settings
from smartcache.server.metrics import Metrics
from smartcache.server.storage import discovery
from smartcache.server.storage.discovery import RECORDS, TOPOLOGY, Discovery, DiscoveryError
from smartcache.server.storage.instances import Instance
from smartcache.server.storage.routing import Storage
from smartcache.wire import topology
from tests.unit.stubs import sample

TOPOLOGY_DOC = {
    "version": 3,
    "members": [
        {"address": "t1:3301", "http_port": 8301, "eligible": True, "leaving": False},
        {"address": "t2:3301", "http_port": None, "eligible": False, "leaving": False},
        {"address": "t3:3301", "leaving": True},
    ],
}


def test_a_topology_lists_its_members_and_serves_every_one_but_those_leaving() -> None:
    t = topology.parse(json.dumps(TOPOLOGY_DOC))
    assert t.version == 3
    assert t.addresses == ("t1:3301", "t2:3301")
    t2 = t.find("t2:3301")
    assert t2 is not None
    assert (t2.eligible, t2.http_port) == (False, None)


@pytest.mark.parametrize(
    "value",
    ["", "[]", '{"members": []}', '{"members": [{"http_port": 1}]}', '{"members": [{"address": "nocolon"}]}'],
)
def test_anything_else_is_not_a_topology(value: str) -> None:
    with pytest.raises(ValueError, match="topology"):
        topology.parse(value)


def test_a_member_record_needs_a_uri() -> None:
    assert topology.parse_record('{"uri": "t1:3301", "role": "follower"}') == {"uri": "t1:3301", "role": "follower"}
    assert topology.parse_record('{"role": "follower"}') is None
    assert topology.parse_record("nope") is None


class FakeDiscovery(Discovery):
    """etcd's answers by key: what _range would have read."""

    def __init__(self, values: dict[str, list[bytes]]) -> None:
        super().__init__(endpoints=["http://etcd:2379"], cluster="c")
        self.values = values

    async def _range(self, key: str, *, prefix: bool = False) -> list[bytes]:
        if key not in self.values:
            raise DiscoveryError("down")
        return self.values[key]


def test_discovery_reads_the_topology_and_without_one_the_live_records() -> None:
    with_topology = FakeDiscovery({topology.topology_key("c"): [json.dumps(TOPOLOGY_DOC).encode()]})
    assert asyncio.run(with_topology.addresses()) == (("t1:3301", "t2:3301"), TOPOLOGY)
    records = [json.dumps({"uri": u}).encode() for u in ("t2:3301", "t1:3301", "t2:3301")] + [b"junk"]
    without = FakeDiscovery({topology.topology_key("c"): [], topology.members_prefix("c"): records})
    assert asyncio.run(without.addresses()) == (("t1:3301", "t2:3301"), RECORDS)
    unreadable = FakeDiscovery({topology.topology_key("c"): [b"{}"]})
    with pytest.raises(DiscoveryError, match="cannot be read"):
        asyncio.run(unreadable.addresses())


@pytest.fixture
def no_connections(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Instances that never connect: start and close only recorded."""
    calls: list[str] = []

    def start(self: Instance) -> None:
        calls.append(f"start {self.address}")

    async def close(self: Instance) -> None:
        calls.append(f"close {self.address}")

    monkeypatch.setattr(Instance, "start", start)
    monkeypatch.setattr(Instance, "close", close)
    return calls


def _storage(tarantool: tuple[str, ...]) -> tuple[Storage, Metrics]:
    metrics = Metrics()
    s = Settings(tarantool=tarantool, etcd=("http://etcd:2379",), cluster="c")
    return Storage(settings=s, metrics=metrics), metrics


def _addresses(storage: Storage) -> list[str]:
    return [i.address for i in storage.instances]


def test_new_members_get_an_instance_and_those_gone_from_the_topology_are_closed(no_connections: list[str]) -> None:
    async def run() -> dict[str, Any]:
        storage, metrics = _storage(("t1:3301", "t2:3301"))
        await storage._membership.apply(("t1:3301", "t2:3301", "t4:3301"), TOPOLOGY)
        after_add = _addresses(storage)
        await storage._membership.apply(("t1:3301", "t4:3301"), TOPOLOGY)
        return {
            "after_add": after_add,
            "after_remove": _addresses(storage),
            "added": sample(metrics.storage_discovery_changes, change="added"),
            "removed": sample(metrics.storage_discovery_changes, change="removed"),
            "gauge": sample(metrics.storage_instances, suffix=""),
        }

    r = asyncio.run(run())
    assert r["after_add"] == ["t1:3301", "t2:3301", "t4:3301"]
    assert r["after_remove"] == ["t1:3301", "t4:3301"]
    assert no_connections == ["start t4:3301", "close t2:3301"]
    assert (r["added"], r["removed"], r["gauge"]) == (1, 1, 2)


def test_records_only_add_and_an_empty_list_changes_nothing(no_connections: list[str]) -> None:
    async def run() -> tuple[list[str], list[str]]:
        storage, _ = _storage(("t1:3301", "t2:3301"))
        await storage._membership.apply(("t1:3301", "t3:3301"), RECORDS)  # t2's record expired: it may be down a while
        after_records = _addresses(storage)
        await storage._membership.apply((), TOPOLOGY)
        return after_records, _addresses(storage)

    after_records, after_empty = asyncio.run(run())
    assert after_records == ["t1:3301", "t2:3301", "t3:3301"]
    assert after_empty == after_records
    assert no_connections == ["start t3:3301"]


def test_the_discovery_interval_is_a_second() -> None:
    assert discovery.DISCOVERY_INTERVAL_S == 1.0
