"""The storage cluster as an operator sees it: ``smartcache-cli cluster status|switchover|rejoin``.

Talks to every Tarantool instance directly (as the service's user, which may
only execute the stored procedures) and calls ``sc.role``, ``sc.switchover``
and ``sc.rejoin`` (lua/smartcache/failover.lua). It never changes a role by
itself: a switchover is asked of the leader, which hands its etcd key to the
candidate; a rejoin is asked of the instance to rebuild, which restarts empty
and copies the leader.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import tarantool

CONNECT_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Access:
    """How to reach the instances: addresses and the service user's credentials."""

    addresses: Sequence[str]
    user: str
    password: str
    timeout_s: float = CONNECT_TIMEOUT_S


@contextlib.contextmanager
def _connect(access: Access, address: str, answer_timeout_s: float | None = None) -> Iterator[tarantool.Connection]:
    """A connection whose calls wait answer_timeout_s (default: the access timeout) for an answer."""
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
    try:
        conn.connect()
        yield conn
    finally:
        conn.close()


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
    except (tarantool.error.Error, OSError) as e:
        return {"address": address, "reachable": False, "error": f"{type(e).__name__}: {e}"}
    out.pop("status", None)
    return {"address": address, "reachable": True, "rtt_ms": round((time.monotonic() - started) * 1000, 1), **out}


def status(access: Access) -> dict[str, Any]:
    """Every instance's role, term, lease, vclock and replication, and who leads."""
    instances = [role(access, a) for a in access.addresses]
    writable = [i["address"] for i in instances if i.get("writable")]
    leaders = [i for i in instances if i.get("role") == "leader"]
    leader = max(leaders, key=lambda i: i.get("term") or 0, default=None)
    return {
        "leader": leader["address"] if leader else (writable[0] if len(writable) == 1 else None),
        "term": leader.get("term") if leader else None,
        "writable": writable,
        "healthy": len(writable) == 1 and all(i.get("reachable") and not i.get("diverged") for i in instances),
        "instances": instances,
    }


def find(access: Access, instance: str) -> dict[str, Any]:
    """An instance by address or uuid, with its role; raises LookupError."""
    found: list[dict[str, Any]] = status(access)["instances"]
    for i in found:
        if instance in (i["address"], i.get("instance_uuid"), i.get("uri")):
            return i
    raise LookupError(f"no instance {instance!r} among {', '.join(access.addresses)}")


def switchover(access: Access, candidate: str | None, timeout_ms: int) -> dict[str, Any]:
    """Ask the leader to hand over to candidate (or to the most up-to-date follower); reports the write pause."""
    now = status(access)
    if now["leader"] is None:
        return {"status": "NO_LEADER", "message": "no instance leads now: nothing to hand over", **now}
    uuid = find(access, candidate)["instance_uuid"] if candidate else None
    # the leader answers once the candidate has taken over or timeout_ms has passed
    result = _call(access, now["leader"], "switchover", uuid, timeout_ms, answer_timeout_s=timeout_ms / 1000 + 5)
    return {"from": now["leader"], **result}


def rejoin(access: Access, instance: str, *, force: bool) -> dict[str, Any]:
    """Ask an instance (diverged, or any follower with force) to rebuild itself from the leader."""
    target = find(access, instance)
    if not target.get("reachable"):
        return {"status": "UNREACHABLE", "address": target["address"], "message": target.get("error")}
    result = _call(access, target["address"], "rejoin", target["instance_uuid"], force, answer_timeout_s=30.0)
    return {"address": target["address"], **result}
