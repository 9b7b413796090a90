"""The audit panel: the operator actions storage recorded most recently, every shard's, newest first.

A part of the page like the others (parts.py): asked every few seconds on the console's pool,
it reads the entries after the last one it saw (smartcache.ops.audit.read, ``sc.audit_read``
on each replica set's leader) and keeps the last ``KEPT``; at start, the ``KEPT`` newest.
Entries hold no secret: who is a token's id or a key or a login, never a token; an outcome keeps
counts and statuses, never session data (ops/audit.py).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from smartcache.ops import audit
from smartcache.ops.access import Access

KEPT = 30
PER_ASK = 2000


class AuditTail:
    """The last KEPT entries, read on from a cursor per replica set (\"\" for one, the shard's name for each)."""

    def __init__(self, access: Access, shards: Callable[[], tuple[str | None, Sequence[str]]]) -> None:
        self.access = access
        self.shards = shards  # the sharded cluster's name and its shards, from the last cluster status
        self.cursor: dict[str, int] = {}
        self.entries: collections.deque[dict[str, Any]] = collections.deque(maxlen=KEPT)

    def fetch(self) -> list[dict[str, Any]]:
        """Ask for what is new; the entries kept, newest first. Raises when no replica set answered."""
        cluster, names = self.shards()
        access = replace(self.access, cluster=cluster) if names else self.access
        found = audit.read(access, after={**self.cursor}, limit=PER_ASK, shard_names=names, newest=KEPT)
        self.entries.extend(found["entries"])
        self.cursor.update(found["last"])
        if found["errors"] and not found["last"]:
            raise RuntimeError("; ".join(f"{k}: {v}" for k, v in found["errors"].items())[:300])
        return list(self.entries)[::-1]
