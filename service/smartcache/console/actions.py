"""The console's actions: each behind the operator token, each with a reason, each written to the audit first.

POST, JSON (app.py checks the token: 401 without, 403 with a wrong one, 403 for every one when
the console has none):

* ``/api/actions/switchover`` ``{"candidate"?, "timeout_ms"?, "reason"}``: the CLI's ``cluster switchover``;
* ``/api/actions/rejoin`` ``{"instance", "force"?, "reason"}``: the CLI's ``cluster rejoin``;
* ``/api/actions/reveal`` ``{"query", "reason"}``: the sessions of a client id, or the one a handle
  names, with their data (a lookup shows it masked);
* ``/api/actions/logout`` ``{"client_id", "reason"}``: log out everywhere: every session of the client
  ended (SESSION_DELETE_CLIENT through the service, as a front server asks it).

Each needs a reason (400 without: :data:`NO_REASON`); who is the token's id (the first 12 hex of
its SHA-256, never the token). Each is written to the audit before it acts and with its
outcome (smartcache.ops.audit) and refused (AUDIT_UNAVAILABLE) when the first entry cannot be
written; a planner here checks the arguments and returns the call to run on the action pool.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from smartcache.client import Client
from smartcache.console import sessions
from smartcache.console.settings import Settings
from smartcache.ops import audit, cluster

#: a switchover's answer comes once the candidate took over or its timeout passed; beyond that, this margin
ACTION_MARGIN_S = 15.0
NO_REASON = f"reason: say why, at most {audit.MAX_REASON_BYTES} bytes (written to the audit log with your token's id)"
#: the call to run and how long to wait for it; or why the arguments are refused
Planned = tuple[Callable[[], dict[str, Any]], float] | str


@dataclass(frozen=True)
class Asked:
    """What an action is given: the console's settings, the last cluster status, who asks and why."""

    settings: Settings
    status: dict[str, Any]
    actor: audit.Actor
    body: dict[str, Any]


def reason_of(body: dict[str, Any]) -> str | None:
    """The reason given, stripped; None when there is none (or it is no text, or too long)."""
    reason = body.get("reason")
    if not isinstance(reason, str) or not reason.strip() or len(reason.strip().encode()) > audit.MAX_REASON_BYTES:
        return None
    return reason.strip()


def places(settings: Settings, status: dict[str, Any]) -> audit.Places:
    """Where the console's entries go: the replica set's leader, or a sharded cluster's first shard that takes
    them."""
    if "shards" in status and status.get("cluster"):
        return audit.shards(replace(settings.access, cluster=status["cluster"]), list(status["shards"]))
    return audit.replica_set(settings.access)


def switchover(a: Asked) -> Planned:
    candidate = a.body.get("candidate") or None
    timeout_ms = a.body.get("timeout_ms", 5000)
    if candidate is not None and not isinstance(candidate, str):
        return "candidate: an instance address or uuid"
    if not isinstance(timeout_ms, int) or not 100 <= timeout_ms <= 60_000:
        return "timeout_ms: 100..60000"
    access, actor = a.settings.access, a.actor
    return (lambda: cluster.switchover(access, candidate, timeout_ms, actor=actor)), timeout_ms / 1000 + ACTION_MARGIN_S


def rejoin(a: Asked) -> Planned:
    instance, force = a.body.get("instance"), bool(a.body.get("force", False))
    if not isinstance(instance, str) or not instance:
        return "instance: the address or uuid of the instance to rebuild"
    access, actor = a.settings.access, a.actor
    return (lambda: cluster.rejoin(access, instance, force=force, actor=actor)), 30.0 + ACTION_MARGIN_S


def reveal(a: Asked) -> Planned:
    query = a.body.get("query")
    if not isinstance(query, str):
        return "query: a client id or a session's handle"
    try:
        kind, value = sessions.query_of(query)
    except sessions.Refused as e:
        return str(e)
    s = a.settings
    sets = sessions.replica_sets(a.status)

    def act() -> dict[str, Any]:
        found = sessions.lookup(sets, kind, value, token=s.http_token, timeout_s=s.answer_timeout_s, reveal=True)
        return {"status": found.get("error", "OK"), kind: value, **found}

    target = f"{kind} {value}"
    wait_s = s.answer_timeout_s * (len(sets) * 3 + 2) + ACTION_MARGIN_S
    return (lambda: audit.audited(places(s, a.status), a.actor, "console.reveal", target, act)), wait_s


def logout(a: Asked) -> Planned:
    client_id = a.body.get("client_id")
    if not isinstance(client_id, str) or not client_id.strip():
        return "client_id: the client whose sessions all end"
    try:
        kind, _ = sessions.query_of(client_id)
    except sessions.Refused as e:
        return str(e)
    if kind != "client_id":
        return "client_id: a client id, not a session's handle (a handle names one session)"
    s = a.settings
    if not s.services:
        return "no service instance configured (--service): log out everywhere is asked of the service"
    endpoint = ",".join(svc.endpoint for svc in s.services)

    def act() -> dict[str, Any]:
        with Client(endpoint, timeout_s=s.answer_timeout_s) as c:
            reply = c.session_delete_client(client_id)
        return {"status": str(reply.status), "client_id": client_id, "deleted": reply.body.get("deleted")}

    target = f"client_id {client_id}"
    return (lambda: audit.audited(places(s, a.status), a.actor, "console.logout_everywhere", target, act)), (
        s.answer_timeout_s * 2 + ACTION_MARGIN_S
    )


#: route -> (the action's name in the log, its planner)
ROUTES: dict[str, tuple[str, Callable[[Asked], Planned]]] = {
    "/api/actions/switchover": ("switchover", switchover),
    "/api/actions/rejoin": ("rejoin", rejoin),
    "/api/actions/reveal": ("reveal", reveal),
    "/api/actions/logout": ("logout", logout),
}
