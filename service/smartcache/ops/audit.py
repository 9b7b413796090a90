"""The audit of operator actions: who changed the cluster, what, on which part, when and why, kept by storage.

Issue 37: nothing recorded who switched the leader over, moved buckets or revealed a
session's data. Storage keeps an append-only, replicated space ``audit`` written and read
only through ``sc.audit_write(who, action, target, reason, details)`` and
``sc.audit_read(after_seq, limit)``, operators only (lua/README.md).

Every operation of :mod:`smartcache.ops` that changes the cluster writes two entries through
:func:`audited`: one before it acts (``details.phase = "asked"``, with the reason the operator
typed) and one with its outcome (``phase = "done"``, its status and the seq of the first). An
operation whose first entry cannot be written does **not** act: it answers
``AUDIT_UNAVAILABLE`` (a bank's reviewer asks that no operator action go unrecorded; every one
of these operations needs the leader the entry goes to anyway). An outcome that cannot be
written (the leader lost in the very switchover it recorded, for longer than
``OUTCOME_WAIT_S``) is said in the answer (``audit.error``): the action happened.

Where an entry goes: to the leader of the replica set the operation is about
(:func:`replica_set`), or for a sharded cluster's operations to the first of its shards whose
leader takes it (:func:`shards`); :func:`read` gathers every shard's entries.

Who: an :class:`~.actors.Actor` (:mod:`.actors`, which needs no connector: the CLI makes one before it
knows whether the server extra is installed). A program that calls without one is written as
:data:`~.actors.UNATTENDED`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from smartcache.ops.access import Access
from smartcache.ops.actors import MAX_REASON_BYTES, UNATTENDED, Actor, cli_who, console_who, token_id
from smartcache.ops.instances import CONNECTION_ERRORS, call, leader_now
from smartcache.wire import topology

#: how long the outcome's entry is tried (a switchover's new leader takes a moment to accept writes)
OUTCOME_WAIT_S = 10.0
OUTCOME_POLL_S = 0.3
#: how many entries one sc.audit_read answers at most (storage's bound: 1000)
READ_PAGE = 500
#: how much of a text (a message, an error) an outcome's entry keeps
MAX_TEXT = 300

__all__ = [
    "MAX_REASON_BYTES", "UNATTENDED", "Actor", "AuditUnavailable", "Caller", "Places", "audited", "cli_who",
    "console_who", "note", "read", "replica_set", "shards", "token_id", "write",
]  # fmt: skip


class AuditUnavailable(Exception):
    """No leader took the entry (none answered, or each refused it); the message says what each said."""


#: sc.<procedure>(nil, *args) on some leader; raises one of CONNECTION_ERRORS
Caller = Callable[..., dict[str, Any]]
#: where an entry may go, in order of preference: (shard name or "", a caller on its leader)
Places = Callable[[], Iterator[tuple[str, Caller]]]


def replica_set(access: Access) -> Places:
    """The leader of the access's replica set, found again at every write (a switchover moves it)."""

    def places() -> Iterator[tuple[str, Caller]]:
        leader = leader_now(access)["leader"]
        if leader is None:
            raise AuditUnavailable("no instance leads now")
        yield "", lambda procedure, *args: call(access, leader, procedure, *args)

    return places


def shards(access: Access, names: Sequence[str]) -> Places:
    """Each shard's leader in turn (a sharded cluster's operations: the first that takes the entry keeps it)."""
    assert access.cluster is not None

    def places() -> Iterator[tuple[str, Caller]]:
        for name in names:
            shard_access = replace(access, cluster=topology.shard_cluster(access.cluster or "", name), addresses=())
            leader = leader_now(shard_access)["leader"]
            if leader is not None:
                yield name, lambda procedure, *args, a=shard_access, at=leader: call(a, at, procedure, *args)

    return places


def write(places: Places, actor: Actor, action: str, target: str, details: Mapping[str, Any]) -> dict[str, Any]:
    """One entry, on the first place that takes it: ``{"seq", "shard"?}``; raises AuditUnavailable."""
    said: list[str] = []
    try:
        for shard, caller in places():
            try:
                r = caller("audit_write", actor.who, action, target, actor.reason, dict(details))
            except CONNECTION_ERRORS as e:
                said.append(f"{shard or 'leader'}: {type(e).__name__}: {e}")
                continue
            if r.get("status") == "OK":
                return {"seq": r.get("seq"), **({"shard": shard} if shard else {})}
            said.append(f"{shard or 'leader'}: {r.get('status')}: {r.get('message') or r}")
    except CONNECTION_ERRORS as e:  # finding the leader: every instance asked, none answered
        said.append(f"{type(e).__name__}: {e}")
    raise AuditUnavailable("; ".join(said) or "no leader to write to")


def _status(result: Mapping[str, Any]) -> str:
    return str(result.get("status") or result.get("error") or "UNKNOWN")


def _outcome(places: Places, actor: Actor, action: str, target: str, details: dict[str, Any]) -> dict[str, Any]:
    """The outcome's entry, tried for OUTCOME_WAIT_S; what happened to it, for the answer."""
    deadline = time.monotonic() + OUTCOME_WAIT_S
    while True:
        try:
            return write(places, actor, action, target, details)
        except AuditUnavailable as e:
            if time.monotonic() > deadline:
                return {"error": f"the outcome was not recorded: {e}"}
        time.sleep(OUTCOME_POLL_S)


def _kept(result: Mapping[str, Any]) -> dict[str, Any]:
    """What the outcome's entry keeps of an answer: its scalar fields (long texts cut), not its lists and maps."""
    out: dict[str, Any] = {}
    for k, v in result.items():
        if isinstance(v, str):
            out[k] = v[:MAX_TEXT]
        elif isinstance(v, bool | int | float):
            out[k] = v
    return out


def audited(
    places: Places,
    actor: Actor,
    action: str,
    target: str,
    act: Callable[[], dict[str, Any]],
    *,
    details: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """act() between its two entries: refused (AUDIT_UNAVAILABLE) when the first cannot be written, else its
    answer with ``audit: {"asked", "done"}`` (each ``{"seq", "shard"?}`` or ``{"error"}``). The outcome keeps the
    answer's scalar fields (its status, message, counts); an exception of act is recorded as the outcome
    (status ERROR) and raised again."""
    try:
        asked = write(places, actor, action, target, {**(details or {}), "phase": "asked"})
    except AuditUnavailable as e:
        return {
            "status": "AUDIT_UNAVAILABLE",
            "message": f"{action} not done: its audit entry could not be written ({e}); every operator action is "
            "recorded before it acts",
        }
    done_details: dict[str, Any] = {"phase": "done", "asked_seq": asked["seq"]}
    try:
        result = act()
    except Exception as e:
        error = f"{type(e).__name__}: {e}"[:MAX_TEXT]
        _outcome(places, actor, action, target, {**done_details, "status": "ERROR", "message": error})
        raise
    done_details.update({**_kept(result), "status": _status(result)})
    done = _outcome(places, actor, action, target, done_details)
    return {**result, "audit": {"asked": asked, "done": done}}


def note(places: Places, actor: Actor, action: str, target: str, details: Mapping[str, Any]) -> dict[str, Any]:
    """One entry for what has just been done (a settle pass that changed something, a reveal): ``{"seq"}`` or
    ``{"error"}``, never raised."""
    try:
        return write(places, actor, action, target, {**details, "phase": "done"})
    except AuditUnavailable as e:
        return {"error": str(e)}


def read(
    access: Access,
    *,
    after: Mapping[str, int],
    limit: int,
    shard_names: Sequence[str] = (),
    newest: int | None = None,
) -> dict[str, Any]:
    """The entries after each place's seq (``after[""]`` for one replica set, ``after[shard]`` per shard), at
    most limit per place, oldest first by time; every shard's for a sharded cluster (each entry names its
    shard). newest: a place missing from after starts at its newest entries (that many), not at its first.
    Returns ``{"entries", "last": {place: seq}, "errors": {place: why}}``."""
    places: list[tuple[str, Access]] = [("", access)]
    if shard_names:
        assert access.cluster is not None
        places = [
            (n, replace(access, cluster=topology.shard_cluster(access.cluster, n), addresses=())) for n in shard_names
        ]
    entries: list[dict[str, Any]] = []
    last: dict[str, int] = {}
    errors: dict[str, str] = {}
    for name, where in places:
        start = after.get(name, after.get("", None if newest is not None else 0))
        try:
            got, seq = _read_one(where, start, limit, newest or 0)
        except (AuditUnavailable, *CONNECTION_ERRORS) as e:
            errors[name or "leader"] = f"{type(e).__name__}: {e}"
            continue
        entries += [{**e, "shard": name} if name else e for e in got]
        last[name] = seq
    entries.sort(key=lambda e: (e.get("time_ms") or 0, e.get("shard") or "", e.get("seq") or 0))
    return {"entries": entries, "last": last, "errors": errors}


def _read_one(access: Access, after: int | None, limit: int, newest: int) -> tuple[list[dict[str, Any]], int]:
    """Up to limit entries after seq (None: the newest ones) from one replica set's leader, page by page; and
    the last seq seen."""
    leader = leader_now(access)["leader"]
    if leader is None:
        raise AuditUnavailable("no instance leads now")
    if after is None:
        head = call(access, leader, "audit_read", 0, 1)
        after = max(0, int(head.get("head_seq") or 0) - newest)
    out: list[dict[str, Any]] = []
    while len(out) < limit:
        r = call(access, leader, "audit_read", after, min(READ_PAGE, limit - len(out)))
        if r.get("status") != "OK":
            raise AuditUnavailable(f"{r.get('status')}: {r.get('message') or r}")
        page = list(r.get("entries") or [])
        out += page
        if not page:
            break
        after = max(int(e.get("seq") or 0) for e in page)
    return out, after
