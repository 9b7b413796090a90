"""Which cluster `smartcache-cli cluster` is about (issue 36): a name etcd holds nothing of is NOT_FOUND, naming the
clusters it holds (`--cluster wrongname status` answered "cluster healthy"); with no name, the moves find the
sharded cluster from the instances, as `cluster status` does (`cluster drain` wanted `--cluster make-run`)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from smartcache.cli import clustername, exits
from smartcache.cli.main import main
from smartcache.ops import cluster, etcd, status
from smartcache.ops.access import Access

#: the keys make run's sharded cluster keeps in etcd, and another cluster's
KEYS = [
    "/smartcache/make-run/buckets",
    "/smartcache/make-run.s1/leader",
    "/smartcache/make-run.s1/members/u1",
    "/smartcache/make-run.s2/topology",
    "/smartcache/bank/leader",
]


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """etcd answers its keys (keys only) to every range; the calls asked are recorded."""
    calls: list[dict[str, Any]] = []

    def ask(_self: Any, call: etcd.Call) -> dict[str, Any]:
        calls.append({"path": call.path, **(call.body or {})})
        return {"kvs": [{"key": base64.b64encode(k.encode()).decode()} for k in KEYS]}

    monkeypatch.setattr(etcd.Etcd, "ask", ask)
    return calls


def _access(name: str | None, endpoints: tuple[str, ...] = ("http://e1",)) -> Access:
    return Access(addresses=("127.0.0.1:1",), user="operator", password="operator", etcd=endpoints, cluster=name)


def test_etcd_is_asked_for_the_keys_under_smartcache_only(asked: list[dict[str, Any]]) -> None:
    assert clustername.held(["http://e1"], 1.0) == ["bank", "make-run", "make-run.s1", "make-run.s2"]
    (call,) = asked
    assert call["path"] == "/v3/kv/range"
    assert call["keys_only"] is True
    assert base64.b64decode(call["key"]) == b"/smartcache/"


@pytest.mark.parametrize("name", ["make-run", "make-run.s1", "bank"])
def test_a_cluster_or_a_shard_s_replica_set_etcd_holds_is_taken(name: str, asked: list[dict[str, Any]]) -> None:
    assert clustername.unknown(_access(name)) is None


def test_a_name_etcd_holds_nothing_of_is_not_found_naming_those_it_holds(asked: list[dict[str, Any]]) -> None:
    doc = clustername.unknown(_access("wrongname"))
    assert doc is not None
    assert doc["error"] == "NOT_FOUND"
    assert (
        "'wrongname': etcd holds no such cluster (it holds bank, make-run, make-run.s1, make-run.s2)"
        in (doc["message"])
    )
    assert doc["clusters"] == ["bank", "make-run", "make-run.s1", "make-run.s2"]


def test_without_etcd_to_ask_or_answering_the_name_is_taken_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable(_self: Any, _call: etcd.Call) -> dict[str, Any]:
        raise etcd.EtcdUnavailable("http://e1: Connection refused")

    monkeypatch.setattr(etcd.Etcd, "ask", unavailable)
    assert clustername.unknown(_access("wrongname")) is None
    assert clustername.unknown(_access("wrongname", endpoints=())) is None


def test_status_with_a_name_etcd_holds_nothing_of_exits_2_and_asks_no_instance(
    asked: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cluster, "status", lambda *_: pytest.fail("the instances were asked"))
    assert main(["cluster", "--etcd", "http://e1", "--cluster", "wrongname", "status"]) == exits.USAGE
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"] == "NOT_FOUND"
    assert "make-run" in doc["message"]


@pytest.mark.parametrize(
    ("reported", "maps", "found"),
    [
        ("make-run.s1", {"make-run"}, "make-run"),  # a shard's instances: the sharded cluster, as status does
        ("make-run.s1", set(), "make-run.s1"),  # a dotted name that is no shard of a sharded cluster
        ("bank", set(), "bank"),
        (None, set(), None),  # nobody answers with a name
    ],
)
def test_without_a_name_the_instances_say_which_cluster(
    reported: str | None, maps: set[str], found: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster, "role", lambda _a, address: {"address": address, "cluster": reported})
    monkeypatch.setattr(status, "bucket_map", lambda a: {"shards": ["s1"]} if a.cluster in maps else None)
    assert clustername.reported(_access(None)) == found


def test_drain_without_a_name_moves_the_cluster_the_instances_run_in(
    asked: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`cluster drain s2` as make run's banner leaves it: no --cluster, the default instances (shard s1's)."""
    monkeypatch.delenv("SMARTCACHE_CLUSTER", raising=False)
    monkeypatch.setattr(cluster, "role", lambda _a, address: {"address": address, "cluster": "make-run.s1"})
    monkeypatch.setattr(status, "bucket_map", lambda a: {"shards": ["s1", "s2"]} if a.cluster == "make-run" else None)
    read: list[str | None] = []

    def read_map(access: Access) -> tuple[dict[str, Any], int]:
        read.append(access.cluster)
        return {"buckets": 4, "shards": ["s1", "s2"], "ranges": [[0, 1, "s1"], [2, 3, "s2"]]}, 9

    monkeypatch.setattr("smartcache.ops.moves.commands.read_map", read_map)
    assert main(["cluster", "--etcd", "http://e1", "drain", "s2", "--dry-run"]) == exits.OK
    assert read == ["make-run"]
    assert json.loads(capsys.readouterr().out)["moves"] == 2
