"""smartcache-cli's ``audit`` command: the operator actions storage recorded, one JSON object a line.

Every operator action (the CLI's cluster changes, the console's reveals, log-outs and
switchovers) is written to the ``audit`` space of storage before it acts and with its outcome
(smartcache.ops.audit). This prints the entries after ``--since``, oldest first, as JSON lines
(on a terminal too, as ``events tail`` does; ``--format columns`` lays them out for reading),
from every shard of a sharded cluster (each entry then names its shard, and ``--since`` takes
``shard=seq`` pairs). The last line says where to go on from: ``{"next": ...}`` to pass to
``--since`` next time.
"""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Callable
from typing import Any

from smartcache.cli import exits, storage
from smartcache.cli.events import FORMATS, from_sequence

COMMANDS = ("audit",)
#: entries printed by default, and at most (per replica set)
DEFAULT_LIMIT = 100
MAX_LIMIT = 10_000
Emit = Callable[[dict[str, Any]], None]


def add_parsers(sub: Any) -> None:
    """``audit`` on smartcache-cli's subparsers."""
    au = sub.add_parser(
        "audit",
        help="the operator actions storage recorded: who, what, when, why (JSON lines)",
        description="Each operator action is recorded before it acts (phase asked, with the reason typed) and with "
        "its outcome (phase done): the CLI's cluster changes, the console's reveals of session data, log-outs and "
        f"switchovers. Oldest first; a sharded cluster's from every shard. {storage.CREDENTIALS_HELP}",
    )
    storage.add_options(au)
    au.add_argument(
        "--since",
        type=from_sequence,
        default=0,
        metavar="SEQ|SHARD=SEQ,...",
        help="only entries after this sequence (a sharded cluster's per shard: s1=12,s2=40; the last line's next)",
    )
    au.add_argument("--limit", type=_limit, default=DEFAULT_LIMIT, metavar="N", help="at most N entries per shard")
    au.add_argument(
        "--format",
        choices=FORMATS,
        default="json",
        help="json: one JSON object per entry and line (the default, on a terminal too); columns: for reading",
    )


def _limit(text: str) -> int:
    n = int(text)
    if not 1 <= n <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"must be 1..{MAX_LIMIT}, not {n}")
    return n


def run(a: argparse.Namespace, emit: Emit) -> int:
    """Print the entries, then where to go on from; the exit code."""
    try:
        from smartcache.ops import audit  # noqa: PLC0415 (the server extra)
    except ModuleNotFoundError as e:
        if e.name != "tarantool":
            raise
        from smartcache import extras  # noqa: PLC0415

        emit({"error": "MISSING_PACKAGE", "message": f"audit needs the server extra: {extras.SERVER_EXTRA_INSTALL}"})
        return exits.MISSING_PACKAGE
    access = storage.access_of(a, emit)
    if isinstance(access, int):
        return access
    access, shards = storage.sharded(access)
    if isinstance(a.since, dict) and not shards:
        emit({"error": "BAD_ARGUMENT", "message": "--since: shard=seq pairs are for a sharded cluster; give one SEQ"})
        return exits.USAGE
    after = a.since if isinstance(a.since, dict) else {"": a.since}
    found = audit.read(access, after=after, limit=a.limit, shard_names=shards)
    for entry in found["entries"]:
        emit(shown(entry))
    nxt: Any = found["last"].get("", 0) if not shards else {s: found["last"].get(s, after.get(s, 0)) for s in shards}
    tail: dict[str, Any] = {"next": nxt, "count": len(found["entries"])}
    if found["errors"]:
        tail["errors"] = found["errors"]
    emit(tail)
    if found["errors"]:
        return exits.UNAVAILABLE
    return exits.OK


def shown(entry: dict[str, Any]) -> dict[str, Any]:
    """An entry as printed: its fields, and its time as UTC text beside the milliseconds."""
    ms = entry.get("time_ms")
    at = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="milliseconds") if ms else None
    return {"seq": entry.get("seq"), "time": at, **{k: v for k, v in entry.items() if k != "seq"}}
