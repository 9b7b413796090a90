"""The etcd members as ``smartcache-cli cluster status`` shows them: who is a member, who leads, who is healthy.

Standard library only (urllib and a thread per member): it runs where only the
client is installed, and a down or frozen member costs one timeout, asked in
parallel with the others. Each endpoint (``--etcd`` / ``$SMARTCACHE_ETCD``,
default make run's three members) is asked two questions of the v3 JSON gateway,
and the first one that answers a third:

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

``cluster status`` also reads two keys of the storage cluster's own
(service/smartcache/wire/topology.py): the topology and the live member records, with
``POST /v3/kv/range`` on the first endpoint that answers (:func:`read`).
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

ASK_TIMEOUT_S = 2.0


class EtcdUnavailable(Exception):
    """No endpoint answered a read: the caller shows what it knows without etcd."""


def _request(url: str, body: dict[str, Any] | None, timeout_s: float) -> tuple[int, Any]:
    """(status, decoded JSON) of a GET (body None) or a JSON POST; raises OSError/ValueError when no answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:  # noqa: S310 - the operator's endpoints
            return int(r.status), json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:  # an answer all the same (health false is a 503)
        return int(e.code), json.loads(e.read() or b"null")


def _reason(e: BaseException) -> str:
    if isinstance(e, urllib.error.URLError) and e.reason is not None:
        return f"{type(e).__name__}: {e.reason}"
    return f"{type(e).__name__}: {e}"


def _normal(url: str) -> str:
    url = url.strip().rstrip("/")
    return url if "://" in url else "http://" + url


def endpoints_of(text: str) -> list[str]:
    """The comma-separated endpoints of --etcd / SMARTCACHE_ETCD (scheme http:// when none is given)."""
    return [_normal(e) for e in text.split(",") if e.strip()]


def ask_member(endpoint: str, timeout_s: float) -> dict[str, Any]:
    """One endpoint's status and health, or {"reachable": False, "error"}."""
    started = time.monotonic()
    try:
        code, status = _request(endpoint + "/v3/maintenance/status", {}, timeout_s)
    except (OSError, ValueError) as e:
        return {"endpoint": endpoint, "reachable": False, "error": _reason(e)}
    if code != 200 or not isinstance(status, dict):
        return {"endpoint": endpoint, "reachable": False, "error": f"HTTP {code}: {status!r}"[:300]}
    rtt_ms = round((time.monotonic() - started) * 1000, 1)
    try:
        _, health = _request(endpoint + "/health", None, timeout_s)
        healthy = isinstance(health, dict) and str(health.get("health")) == "true"
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
            code, doc = _request(e + "/v3/cluster/member/list", {}, timeout_s)
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
    by_id = {a["id"]: a for a in answers if a["reachable"]}
    by_url = {a["endpoint"]: a for a in answers}
    members: list[dict[str, Any]] = []
    for m in listed:
        urls = [_normal(u) for u in m.get("clientURLs", [])]
        answer = by_id.get(str(m.get("ID"))) or next((by_url[u] for u in urls if u in by_url), None)
        entry = {"name": m.get("name") or None, "id": str(m.get("ID")), "client_urls": urls}
        entry.update(answer or {"endpoint": None, "reachable": False, "error": "not among the endpoints asked"})
        entry["id"] = str(m.get("ID"))  # a member that does not answer is known by the list
        members.append(entry)
    known = {m.get("endpoint") for m in members}
    members += [{"name": None, **a} for a in answers if a["endpoint"] not in known]  # nothing listed them
    votes: dict[str, int] = {}
    for m in members:
        if m.get("reachable") and m.get("follows", "0") != "0":
            votes[m["follows"]] = votes.get(m["follows"], 0) + 1
    size = len(listed) or len(endpoints)
    # the leader a majority of the members follow (a member cut off from the others may still name an old one)
    leader_id = next((k for k, n in votes.items() if n > size // 2), None)
    for m in members:
        if m.get("reachable"):
            m["leader"] = m["id"] == leader_id
            healthy = bool(m.get("healthy"))
            m["state"] = ("leader" if m["leader"] else "follower") if healthy else "unhealthy"
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


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _prefix_end(prefix: str) -> str:
    """etcd's range_end for every key that starts with prefix (prefix ends in '/', never 0xff)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _ask_first(endpoints: Sequence[str], path: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """The JSON answer to a POST of body to path from the first endpoint that answers it (HTTP 200); raises
    EtcdUnavailable saying what each endpoint did when none does."""
    errors = []
    for e in endpoints:
        try:
            code, doc = _request(e + path, body, timeout_s)
        except (OSError, ValueError) as err:
            errors.append(f"{e}: {_reason(err)}")
            continue
        if code != 200 or not isinstance(doc, dict):
            errors.append(f"{e}: HTTP {code}")
            continue
        return doc
    raise EtcdUnavailable("; ".join(errors) or "no etcd endpoint given")


def read(endpoints: Sequence[str], key: str, timeout_s: float, *, prefix: bool = False) -> list[tuple[str, bytes]]:
    """The key (or every key under it, prefix=True) as [(key, value)], from the first endpoint that answers;
    [] when absent. Raises EtcdUnavailable when none does."""
    body = {"key": _b64(key)}
    if prefix:
        body["range_end"] = _b64(_prefix_end(key))
    doc = _ask_first(endpoints, "/v3/kv/range", body, timeout_s)
    return [
        (base64.b64decode(kv.get("key", "")).decode(), base64.b64decode(kv.get("value", "")))
        for kv in doc.get("kvs", [])
    ]


def create(endpoints: Sequence[str], key: str, value: bytes, timeout_s: float) -> tuple[bytes, bool]:
    """Put key only if it does not exist (a transaction comparing its create_revision with 0); the value etcd
    holds afterwards (ours, or the one that was there) and whether this call put it. Raises EtcdUnavailable
    when no endpoint answers."""
    body = {
        "compare": [{"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
        "success": [{"request_put": {"key": _b64(key), "value": base64.b64encode(value).decode()}}],
        "failure": [{"request_range": {"key": _b64(key)}}],
    }
    doc = _ask_first(endpoints, "/v3/kv/txn", body, timeout_s)
    if doc.get("succeeded"):
        return value, True
    kvs = ((doc.get("responses") or [{}])[0].get("response_range") or {}).get("kvs") or []
    return (base64.b64decode(kvs[0].get("value", "")), False) if kvs else (value, False)


def read_revision(endpoints: Sequence[str], key: str, timeout_s: float) -> tuple[bytes | None, int]:
    """The key's value and its mod_revision ((None, 0) when absent), from the first endpoint that answers a
    linearizable read. Raises EtcdUnavailable when none does."""
    kvs = _ask_first(endpoints, "/v3/kv/range", {"key": _b64(key)}, timeout_s).get("kvs") or []
    if not kvs:
        return None, 0
    return base64.b64decode(kvs[0].get("value", "")), int(kvs[0].get("mod_revision", 0))


def put_if(endpoints: Sequence[str], key: str, value: bytes, mod_revision: int, timeout_s: float) -> bool:
    """Put key only if its mod_revision is still mod_revision (a compare-and-swap): whether it was put. A member
    that does not answer is passed over for the next: if the swap happened there after all, the next compares
    an older revision and answers False, and the caller reads the key again. Raises EtcdUnavailable."""
    body = {
        "compare": [{"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(mod_revision)}],
        "success": [{"request_put": {"key": _b64(key), "value": base64.b64encode(value).decode()}}],
    }
    return bool(_ask_first(endpoints, "/v3/kv/txn", body, timeout_s).get("succeeded"))
