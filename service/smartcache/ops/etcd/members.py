"""The etcd members as ``smartcache-cli cluster status`` shows them: who is a member, who leads, who is healthy.

A thread per member: a down or frozen member costs one timeout, asked in parallel with
the others. Each endpoint (``--etcd`` / ``$SMARTCACHE_ETCD``, default make run's three
members) is asked two questions of the v3 JSON gateway, and the first one that answers
a third:

* ``POST /v3/maintenance/status``: its member id, the leader it follows (a member
  id; absent while it has none), raft term and index, database size, version,
  and ``errors`` (``etcdserver: no leader``);
* ``GET /health``: ``{"health": "true"}`` while it has a leader and answers a
  linearizable read (etcd's own probe; 3.4 answers 503 and "false" otherwise);
* ``POST /v3/cluster/member/list``: every member's id, name, peer and client URLs.

A member that does not answer is shown ``"reachable": false`` with the error in
words, never as a traceback. The cluster is ``healthy`` when every member listed
answers, says healthy, and all follow one leader; it has ``quorum`` while a
majority of the members listed are healthy (the Tarantool leader can keep its
lease).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from smartcache.ops.etcd import core
from smartcache.ops.etcd.core import ASK_TIMEOUT_S
from smartcache.ops.etcd.sync import request


def ask_member(endpoint: str, timeout_s: float) -> dict[str, Any]:
    """One endpoint's status and health, or {"reachable": False, "error"}."""
    started = time.monotonic()
    try:
        code, status = request(endpoint + core.STATUS.path, core.STATUS.body, timeout_s)
    except (OSError, ValueError) as e:
        return {"endpoint": endpoint, "reachable": False, "error": core.reason(e)}
    if code != 200 or not isinstance(status, dict):
        return {"endpoint": endpoint, "reachable": False, "error": f"HTTP {code}: {status!r}"[:300]}
    rtt_ms = round((time.monotonic() - started) * 1000, 1)
    try:
        healthy = core.healthy(request(endpoint + core.HEALTH.path, core.HEALTH.body, timeout_s)[1])
    except (OSError, ValueError):
        healthy = False
    header = status.get("header", {})
    return {
        "endpoint": endpoint,
        "reachable": True,
        "healthy": healthy,
        "id": str(header.get("member_id", "")),
        "follows": str(status.get("leader", "0")),
        "raft_term": int(status.get("raftTerm", 0)),
        "raft_index": int(status.get("raftIndex", 0)),
        "version": status.get("version"),
        "db_size_bytes": int(status.get("dbSize", 0)),
        "errors": list(status.get("errors", [])),
        "rtt_ms": rtt_ms,
    }


def member_list(endpoints: Sequence[str], timeout_s: float) -> list[dict[str, Any]]:
    """The members as the first endpoint that answers lists them ([] when none does)."""
    for e in endpoints:
        try:
            code, doc = request(e + core.MEMBER_LIST.path, core.MEMBER_LIST.body, timeout_s)
        except (OSError, ValueError):
            continue
        if code == 200 and isinstance(doc, dict):
            return list(doc.get("members", []))
    return []


def status(endpoints: Sequence[str], timeout_s: float = ASK_TIMEOUT_S) -> dict[str, Any]:
    """Every member: reachable, healthy, leader or not; who leads; healthy and quorum for the cluster."""
    with ThreadPoolExecutor(max_workers=max(1, len(endpoints))) as pool:
        answers = list(pool.map(lambda e: ask_member(e, timeout_s), endpoints))
    listed = member_list([a["endpoint"] for a in answers if a["reachable"]], timeout_s)
    members = _joined(listed, answers)
    size = len(listed) or len(endpoints)
    leader_id = _leader_id(members, size)
    for m in members:
        if m.get("reachable"):
            m["leader"] = m["id"] == leader_id
            m["state"] = ("leader" if m["leader"] else "follower") if m.get("healthy") else "unhealthy"
        else:
            m["state"] = "down"
    leader = next((m for m in members if m.get("leader")), None)
    up = sum(1 for m in members if m.get("reachable") and m.get("healthy"))
    return {
        "endpoints": list(endpoints),
        "leader": (leader.get("name") or leader["id"]) if leader else None,
        "leader_endpoint": leader.get("endpoint") if leader else None,
        "members_healthy": f"{up} of {size}",
        "quorum": up > size // 2,
        "healthy": bool(listed) and leader is not None and all(m["state"] in ("leader", "follower") for m in members),
        "members": members,
    }


def _joined(listed: list[dict[str, Any]], answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each member listed with its endpoint's answer (by id, else by client URL), then the answers no member
    list names."""
    by_id = {a["id"]: a for a in answers if a["reachable"]}
    by_url = {a["endpoint"]: a for a in answers}
    members: list[dict[str, Any]] = []
    for m in listed:
        urls = [core.normal(u) for u in m.get("clientURLs", [])]
        answer = by_id.get(str(m.get("ID"))) or next((by_url[u] for u in urls if u in by_url), None)
        entry = {"name": m.get("name") or None, "id": str(m.get("ID")), "client_urls": urls}
        entry.update(answer or {"endpoint": None, "reachable": False, "error": "not among the endpoints asked"})
        entry["id"] = str(m.get("ID"))  # a member that does not answer is known by the list
        members.append(entry)
    known = {m.get("endpoint") for m in members}
    return members + [{"name": None, **a} for a in answers if a["endpoint"] not in known]


def _leader_id(members: list[dict[str, Any]], size: int) -> str | None:
    """The leader a majority of the members follow (a member cut off from the others may still name an old one)."""
    votes: dict[str, int] = {}
    for m in members:
        if m.get("reachable") and m.get("follows", "0") != "0":
            votes[m["follows"]] = votes.get(m["follows"], 0) + 1
    return next((k for k, n in votes.items() if n > size // 2), None)
