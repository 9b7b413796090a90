"""How smartcache-cli prints: a human layout on a terminal, JSON for scripts.

Every command builds one JSON-able document; ``--json`` (or standard output not being a terminal: a
pipe, a file, a test) prints it as one JSON line, as scripts expect; otherwise it is laid out for a
person: ``info`` in sections of ``key:value`` lines like ``redis-cli INFO``, ``cluster status`` as
tables like ``patronictl list``, every other answer as ``key: value`` lines. The exit codes do not
depend on the layout.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: INFO's sections, in order: (title, key of the reply or None for the top-level scalars)
INFO_SECTIONS = (
    ("Service", None),
    ("Queue", "queue"),
    ("Workers", "workers"),
    ("Messages", "messages"),
    ("Storage", "storage"),
    ("Storage statistics", "storage_stats"),
    ("Settings", "settings"),
)


def _scalar(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str | int | float):
        return str(value)
    return json.dumps(value, default=str, separators=(",", ":"))


def _flat(doc: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """Nested maps as dotted keys; lists and scalars as values."""
    out: list[tuple[str, str]] = []
    for k, v in doc.items():
        if isinstance(v, Mapping) and v:
            out += _flat(v, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", _scalar(v)))
    return out


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, Callable[[Mapping[str, Any]], Any]]]) -> str:
    cells = [[title for title, _ in columns]] + [[_scalar(get(r)) for _, get in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def info(doc: Mapping[str, Any]) -> str:
    parts = []
    for title, key in INFO_SECTIONS:
        if key is None:
            section = {k: v for k, v in doc.items() if not isinstance(v, Mapping | list)}
        elif isinstance(doc.get(key), list):
            section = {str(i): v for i, v in enumerate(doc[key])}
        else:
            section = doc.get(key) or {}
        if section:
            parts.append(f"# {title}\n" + "\n".join(f"{k}:{v}" for k, v in _flat(section)))
    return "\n\n".join(parts)


def _instance_columns() -> list[tuple[str, Callable[[Mapping[str, Any]], Any]]]:
    return [
        ("NAME", lambda i: i.get("name")),
        ("ADDRESS", lambda i: i.get("address")),
        ("ROLE", lambda i: i.get("role") or ("unreachable" if not i.get("reachable", True) else None)),
        ("TERM", lambda i: i.get("term")),
        ("WRITABLE", lambda i: i.get("writable")),
        ("LEASE LEFT", lambda i: f"{i['lease_left_ms'] / 1000:.1f} s" if i.get("lease_left_ms") else None),
        ("QUORUM", lambda i: i.get("quorum") if i.get("role") == "leader" else None),
        ("ID", lambda i: i.get("instance_id")),
        ("PROBLEM", _problem),
    ]


def _problem(i: Mapping[str, Any]) -> Any:
    """What is wrong with one instance, and, where it does not mend itself, what a person must check."""
    keys = ("diverged", "fence_reason", "dcs_regressed", "upstream_problem", "error")
    problem = next((i[k] for k in keys if i.get(k)), None)
    if problem and i.get("rejoin_refused"):
        return f"{problem}; not rebuilding by itself: {i['rejoin_refused']}"
    return problem


def cluster_status(doc: Mapping[str, Any]) -> str:
    """The head line (the cluster's name, as --cluster takes it; its health; who leads), the instances, etcd, the
    topology. No instance answering as leader is "no leader": a dead one is never named (ops/status.py)."""
    health = "healthy" if doc.get("healthy") else "NOT healthy"
    topology = doc.get("topology")
    name = topology.get("cluster") if isinstance(topology, Mapping) else None
    leader = f"leader {doc['leader']} (term {_scalar(doc.get('term'))})" if doc.get("leader") else "no leader"
    head = f"cluster {name + ' ' if name else ''}{health}; {leader}"
    parts = [head, _table(doc.get("instances") or [], _instance_columns())]
    etcd = doc.get("etcd")
    if isinstance(etcd, Mapping):
        if "skipped" in etcd:
            parts.append(f"etcd: {etcd['skipped']}")
        else:
            etcd_health = "healthy" if etcd.get("healthy") else "NOT healthy"
            parts.append(f"etcd {etcd_health}; leader {_scalar(etcd.get('leader'))}")
            member_columns: list[tuple[str, Callable[[Mapping[str, Any]], Any]]] = [
                ("MEMBER", lambda m: m.get("name")),
                ("ENDPOINT", lambda m: m.get("endpoint")),
                ("STATE", lambda m: m.get("state")),
                ("PROBLEM", lambda m: m.get("error")),
            ]
            parts.append(_table(etcd.get("members") or [], member_columns))
    if isinstance(topology, Mapping):
        parts.append(_topology(topology))
    return "\n\n".join(parts)


def sharded_status(doc: Mapping[str, Any]) -> str:
    """A sharded cluster: the bucket map in a line, then each shard as cluster status shows one replica set."""
    b = doc.get("buckets") or {}
    ranges = ", ".join(f"{r[2]} {r[0]}..{r[1]}" for r in b.get("ranges") or [])
    head = (
        f"sharded cluster {_scalar(doc.get('cluster'))} {'healthy' if doc.get('healthy') else 'NOT healthy'}; "
        f"{_scalar(b.get('count'))} buckets (map version {_scalar(b.get('version'))}): {ranges}"
    )
    parts = [head]
    for name, shard in (doc.get("shards") or {}).items():
        held = shard.get("buckets") or {}
        if "error" in held:
            line = f"buckets: not known ({held['error']})"
        else:
            moving = held.get("moving") or []
            line = f"buckets: {_scalar(held.get('active'))} active here, {len(moving)} moving" + "".join(
                f"\n  bucket {m['bucket']} {m['state']} (generation {m['generation']}, peer {m['peer']}, "
                f"{m['for_s']} s)"
                for m in moving
            )
        parts.append(f"== shard {name}\n{line}\n" + cluster_status(shard))
    return "\n\n".join(parts)


def _topology(t: Mapping[str, Any]) -> str:
    """The members as etcd lists them (cluster init/add/remove), each with what the instance itself says."""
    if "skipped" in t:
        return f"topology: {t['skipped']}"
    if t.get("error"):
        return f"topology: {t['error']}"
    members = t.get("members") or []
    if not members:
        return f"topology of cluster {_scalar(t.get('cluster'))}: " + str(t.get("note") or "none in etcd")
    head = f"topology version {_scalar(t.get('version'))}: {len(members)} members, majority {len(members) // 2 + 1}"
    columns: list[tuple[str, Callable[[Mapping[str, Any]], Any]]] = [
        ("MEMBER", lambda m: m.get("address")),
        ("ELIGIBLE", lambda m: m.get("eligible")),
        ("STATE", lambda m: "leaving" if m.get("leaving") else "member"),
        ("ROLE", lambda m: m.get("role") or ("unreachable" if not m.get("reachable", True) else None)),
        ("ACTS ON", lambda m: m.get("topology_version")),
    ]
    out = [head, _table(members, columns)]
    unregistered = t.get("unregistered") or []
    if unregistered:
        names = ", ".join(
            str(u.get("address") or u.get("uri") or u) if isinstance(u, Mapping) else str(u) for u in unregistered
        )
        out.append(f"not members (waiting for cluster add): {names}")
    return "\n".join(out)


def plain(doc: Mapping[str, Any]) -> str:
    return "\n".join(f"{k}: {v}" for k, v in _flat(doc))


def event(doc: Mapping[str, Any]) -> str:
    """One event a line: seq, topic, key, payload."""
    return f"{doc.get('seq')}  {doc.get('topic')}  {doc.get('key') or '-'}  {_scalar(doc.get('payload'))}"


def audit_entry(doc: Mapping[str, Any]) -> str:
    """One audit entry a line: time, [shard:]seq, who, action, target, phase and status, the reason quoted."""
    given = doc.get("details")
    details: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    seq = f"{doc['shard']}:{doc.get('seq')}" if doc.get("shard") else str(doc.get("seq"))
    phase = " ".join(str(details[k]) for k in ("phase", "status") if details.get(k))
    cells = (doc.get("time"), seq, doc.get("who"), doc.get("action"), doc.get("target") or "-", phase or "-")
    return "  ".join(_scalar(c) for c in cells) + f"  {json.dumps(doc.get('reason') or '')}"


def render(doc: Mapping[str, Any], kind: str, *, as_json: bool) -> str:
    """The document as the command prints it; kind: the command ("info", "cluster-status", "event"...)."""
    if as_json:
        return json.dumps(doc, default=str)
    if "error" in doc and kind != "event":
        return plain(doc)
    if kind == "info":
        return info(doc)
    if kind == "cluster-status" and "instances" in doc:
        return cluster_status(doc)
    if kind == "cluster-status" and "shards" in doc:
        return sharded_status(doc)
    if kind == "event" and "seq" in doc:
        return event(doc)
    if kind == "audit" and "seq" in doc:
        return audit_entry(doc)
    return plain(doc)
