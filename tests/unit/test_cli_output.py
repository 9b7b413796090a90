"""smartcache-cli's layouts: JSON for scripts (--json, or not a terminal), for a person on a terminal."""

from __future__ import annotations

import json

from smartcache.cli import output

INFO = {
    "status": "OK",
    "version": "0.1.0",
    "queue": {"depth": 0, "capacity": 3000},
    "settings": {"metrics_token": "unset", "workers": 100},
    "storage": [{"address": "127.0.0.1:3301", "leader": True}],
}
STATUS = {
    "leader": "127.0.0.1:3302",
    "term": 4,
    "healthy": False,
    "instances": [
        {"name": "tarantool-1", "address": "127.0.0.1:3301", "role": "follower", "term": 4, "instance_id": 2},
        {"name": "tarantool-2", "address": "127.0.0.1:3302", "role": "leader", "term": 4, "quorum": 3},
        {"address": "127.0.0.1:3303", "reachable": False, "error": "ConnectionRefusedError"},
    ],
    "etcd": {"healthy": True, "leader": "etcd-1", "members": [{"name": "etcd-1", "state": "leader"}]},
}


def test_json_is_one_line_of_the_whole_document() -> None:
    text = output.render(STATUS, "cluster-status", as_json=True)
    assert "\n" not in text
    assert json.loads(text) == STATUS


def test_info_is_sections_of_key_value_lines_like_redis_info() -> None:
    text = output.render(INFO, "info", as_json=False)
    assert "# Service\nstatus:OK\nversion:0.1.0" in text
    assert "# Queue\ndepth:0\ncapacity:3000" in text
    assert "# Settings\nmetrics_token:unset\nworkers:100" in text
    assert "0.address:127.0.0.1:3301" in text


def test_cluster_status_is_a_table_with_the_names_the_instances_were_started_with() -> None:
    lines = output.render(STATUS, "cluster-status", as_json=False).splitlines()
    assert lines[0] == "cluster NOT healthy; leader 127.0.0.1:3302 (term 4)"
    header = next(ln for ln in lines if ln.startswith("NAME"))
    assert header.split() == ["NAME", "ADDRESS", "ROLE", "TERM", "WRITABLE", "LEASE", "LEFT", "QUORUM", "ID", "PROBLEM"]
    row = next(ln for ln in lines if ln.startswith("tarantool-1"))
    assert row.split()[:4] == ["tarantool-1", "127.0.0.1:3301", "follower", "4"]
    assert any("unreachable" in ln and "ConnectionRefusedError" in ln for ln in lines)
    assert "etcd healthy; leader etcd-1" in lines


def test_any_other_answer_is_key_value_lines_and_an_error_says_what() -> None:
    assert output.render({"status": "NOT_FOUND"}, "session-get", as_json=False) == "status: NOT_FOUND"
    error = {"error": "TIMEOUT", "message": "no reply", "endpoint": "tcp://x:1"}
    assert output.render(error, "info", as_json=False) == "error: TIMEOUT\nmessage: no reply\nendpoint: tcp://x:1"


def test_cluster_status_shows_the_topology_its_members_and_who_waits_to_be_added() -> None:
    status = dict(STATUS)
    status["topology"] = {
        "cluster": "bank",
        "version": 5,
        "members": [
            {"address": "127.0.0.1:3301", "eligible": True, "role": "follower", "topology_version": 5},
            {"address": "127.0.0.1:3302", "eligible": True, "leaving": True, "role": "unregistered"},
            {"address": "127.0.0.1:3303", "eligible": False, "leaving": False, "reachable": False},
        ],
        "unregistered": [{"address": "127.0.0.1:3304", "role": "unregistered"}],
    }
    lines = output.render(status, "cluster-status", as_json=False).splitlines()
    assert "topology version 5: 3 members, majority 2" in lines
    row = {ln.split()[0]: ln.split()[1:4] for ln in lines if ln.startswith("127.0.0.1:")}
    assert row["127.0.0.1:3302"] == ["yes", "leaving", "unregistered"]
    assert row["127.0.0.1:3303"] == ["no", "member", "unreachable"]
    assert "not members (waiting for cluster add): 127.0.0.1:3304" in lines


def test_cluster_status_says_when_there_is_no_topology() -> None:
    status = {**STATUS, "topology": {"cluster": "bank", "version": None, "note": "no topology: SC_CLUSTER_SIZE..."}}
    text = output.render(status, "cluster-status", as_json=False)
    assert "topology of cluster bank: no topology: SC_CLUSTER_SIZE..." in text


def test_a_sharded_cluster_shows_its_bucket_map_then_each_shard() -> None:
    doc = {
        "healthy": True,
        "cluster": "bank",
        "buckets": {"count": 1024, "version": 1, "ranges": [[0, 511, "s1"], [512, 1023, "s2"]]},
        "shards": {"s1": STATUS, "s2": STATUS},
    }
    lines = output.render(doc, "cluster-status", as_json=False).splitlines()
    assert lines[0] == "sharded cluster bank healthy; 1024 buckets (map version 1): s1 0..511, s2 512..1023"
    assert lines.count("== shard s1") == lines.count("== shard s2") == 1
    assert sum(ln.startswith("tarantool-1") for ln in lines) == 2


def test_a_sharded_cluster_shows_each_shard_s_buckets_and_the_moves_in_flight() -> None:
    moving = {"bucket": 17, "state": "sending", "generation": 3, "peer": "s2", "for_s": 0.4}
    doc = {
        "healthy": True,
        "cluster": "bank",
        "buckets": {"count": 1024, "version": 9, "ranges": [[0, 1023, "s1"]]},
        "shards": {"s1": {**STATUS, "buckets": {"active": 1023, "moving": [moving]}},
                   "s2": {**STATUS, "buckets": {"error": "no leader to ask"}}},
    }  # fmt: skip
    text = output.render(doc, "cluster-status", as_json=False)
    assert "buckets: 1023 active here, 1 moving\n  bucket 17 sending (generation 3, peer s2, 0.4 s)" in text
    assert "buckets: not known (no leader to ask)" in text


def test_cluster_status_names_the_cluster_and_says_no_leader_rather_than_a_dead_one() -> None:
    """The head line names the cluster as --cluster takes it (make run's banner does not); with no instance
    answering as leader, "no leader" (issue 36: a dead leader read as the leader)."""
    dead = {
        **STATUS,
        "leader": None,
        "term": None,
        "topology": {
            "cluster": "make-run",
            "version": 1,
            "members": [{"address": "127.0.0.1:3301", "role": "leader? (no answer)", "reachable": False}],
        },
    }
    lines = output.render(dead, "cluster-status", as_json=False).splitlines()
    assert lines[0] == "cluster make-run NOT healthy; no leader"
    row = next(ln for ln in lines if ln.startswith("127.0.0.1:3301"))
    assert "leader? (no answer)" in row
