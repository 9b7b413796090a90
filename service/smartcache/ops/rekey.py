"""The migration of sessions written before revision 11: each raw-keyed row renamed to its stored id.

Storage kept sessions under the raw id, the client's credential, until issue 37; now it keys
them by the stored id the service derives with the cluster's session key (HMAC-SHA256,
smartcache.wire.sessionkeys), a key storage never has. ``smartcache-cli cluster
sessions-rekey`` renames what is left: page by page through each replica set's live raw-keyed
sessions (``sc.sessions_page``, operators only), the stored id derived here, each renamed with
its cache entries and rotations in one transaction (``sc.session_rekey``). The service's
``SMARTCACHE_SESSION_REKEY=lazy`` does the same for a session on its first request; the two may
race: a row already renamed answers NOT_FOUND, counted, not an error. Idempotent: a second run
finds nothing to rename (docs/operations.md, the rolling upgrade).

Before the first rename the key is checked against the one the cluster's sessions are keyed
with (``sc.session_key_check``): a wrong key would rename every session to an id the service
never derives, which logs every customer out. Raw ids pass through memory only: never
printed, logged or written to the audit (counts are).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from smartcache.ops.access import Access
from smartcache.ops.audit import UNATTENDED, Actor, audited, replica_set, shards
from smartcache.ops.instances import CONNECTION_ERRORS, answered_error, call, leader_now
from smartcache.wire import sessionkeys, topology

#: sessions asked for per page (storage takes 1..1000)
PAGE = 500
#: how long a page waits for a leader (one lost, or NOT_LEADER) before the run stops
LEADER_WAIT_S = 10.0
LEADER_POLL_S = 0.5


class RekeyStopped(Exception):
    """A replica set could not be asked (no leader within LEADER_WAIT_S, a page refused); the message says
    which. What was renamed stays renamed: running again goes on."""


@dataclass
class Counts:
    """What one replica set's run did."""

    rekeyed: int = 0
    #: renamed meanwhile by the service's lazy rekey, expired, or past its absolute deadline
    not_found: int = 0
    #: the stored id is a session already (the raw id was created again after a rename: left as it is)
    already_exists: int = 0
    pages: int = 0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"rekeyed": self.rekeyed, "not_found": self.not_found, "already_exists": self.already_exists,
                "pages": self.pages, "errors": self.errors[:20]}  # fmt: skip


class _Leader:
    """A replica set's leader, found again when it stops answering or says NOT_LEADER (for LEADER_WAIT_S)."""

    def __init__(self, access: Access) -> None:
        self.access = access
        self.address: str | None = None

    def call(self, procedure: str, *args: Any) -> dict[str, Any]:
        deadline = time.monotonic() + LEADER_WAIT_S
        last = "no leader"
        while True:
            try:
                if self.address is None:
                    self.address = leader_now(self.access)["leader"]
                if self.address is not None:
                    r = call(self.access, self.address, procedure, *args)
                    if r.get("status") != "NOT_LEADER":
                        return r
                    last = f"{self.address} answered NOT_LEADER"
            except CONNECTION_ERRORS as e:
                if answered_error(e):  # access denied, a Lua error: the same on any instance
                    raise RekeyStopped(f"{procedure} refused by {self.address}: {e}") from e
                last = f"{type(e).__name__}: {e}"
            self.address = None
            if time.monotonic() > deadline:
                raise RekeyStopped(f"{procedure}: no leader answered in {LEADER_WAIT_S:g} s ({last})")
            time.sleep(LEADER_POLL_S)


def _check_key(leader: _Leader, key: bytes) -> None:
    """The key is the one the cluster's sessions are keyed with (kept by storage from the first service)."""
    r = leader.call("session_key_check", sessionkeys.key_id(key))
    if r.get("status") != "OK":
        raise RekeyStopped(f"the key given is not this cluster's session key ({r.get('status')}: "
                           f"{r.get('message') or r}): nothing renamed")  # fmt: skip


def _one(access: Access, key: bytes, page: int) -> Counts:
    """Every live raw-keyed session of one replica set renamed, page by page."""
    leader, counts = _Leader(access), Counts()
    _check_key(leader, key)
    after: str | None = None
    while True:
        got = leader.call("sessions_page", after, page)
        if got.get("status") != "OK":
            raise RekeyStopped(f"sessions_page: {got.get('status')}: {got.get('message') or got}")
        counts.pages += 1
        for s in got.get("sessions") or []:
            raw = str(s["session_id"])
            stored = str(uuid.UUID(bytes=sessionkeys.derive(key, uuid.UUID(raw).bytes)))
            answer = leader.call("session_rekey", raw, stored)
            status = answer.get("status")
            if status == "OK":
                counts.rekeyed += 1
            elif status == "NOT_FOUND":
                counts.not_found += 1
            elif status == "ALREADY_EXISTS":
                counts.already_exists += 1
            else:  # said without the id: a raw id is a credential
                counts.errors.append(f"{status}: {answer.get('message') or ''}"[:200])
        if got.get("done"):
            return counts
        after = got.get("last")


def rekey(
    access: Access, key: bytes, *, shard_names: Sequence[str] = (), page: int = PAGE, actor: Actor = UNATTENDED
) -> dict[str, Any]:
    """Rename every raw-keyed session of the replica set (or of each shard of a sharded cluster) to its stored id;
    written to the audit (the key's id, never the key, and the counts). ``{"status": "OK" | "INCOMPLETE", the
    counts summed, "replica_sets": {name: counts or {"error"}}}``."""
    names = list(shard_names)
    places = shards(access, names) if names else replica_set(access)
    details = {"key_id": sessionkeys.key_id(key), "shards": names}
    return audited(places, actor, "cluster.sessions_rekey", access.cluster or "",
                   lambda: _all(access, key, names, page), details=details)  # fmt: skip


def _all(access: Access, key: bytes, names: Sequence[str], page: int) -> dict[str, Any]:
    each: dict[str, Any] = {}
    total = Counts()
    targets = [
        (n, replace(access, cluster=topology.shard_cluster(access.cluster or "", n), addresses=())) for n in names
    ]
    for name, where in targets or [("", access)]:
        try:
            counts = _one(where, key, page)
        except RekeyStopped as e:
            each[name or "replica set"] = {"error": str(e)}
            continue
        each[name or "replica set"] = counts.as_dict()
        total.rekeyed += counts.rekeyed
        total.not_found += counts.not_found
        total.already_exists += counts.already_exists
        total.pages += counts.pages
        total.errors += counts.errors
    stopped = any("error" in c for c in each.values())
    return {"status": "INCOMPLETE" if stopped or total.errors else "OK", **total.as_dict(), "replica_sets": each}
