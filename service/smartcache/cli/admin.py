"""smartcache-cli's operator commands: ``cluster`` (status, roles, members, moves, sessions-rekey) and ``keys``.

They talk to Tarantool or write files, not to the service; main.py wires them
in and prints what they return (one JSON object, the exit codes of cli/exits.py).
Which cluster a command is about is :mod:`.clustername`'s; how storage is reached,
the reason every change needs and who asks, :mod:`.storage`'s; ``keys``, :mod:`.keys`'s.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from smartcache import extras
from smartcache.cli import clustername, exits, keys, storage
from smartcache.ops import etcd
from smartcache.settings import Environment, SettingsError
from smartcache.wire.buckets import MAX_BUCKETS

COMMANDS = ("cluster", "keys")
#: the operations that move buckets: they need the sharded cluster's name (given, else the instances')
MOVES = ("shard", "move", "rebalance", "drain", "settle")
Emit = Callable[[dict[str, Any]], None]


def add_parsers(sub: Any) -> None:
    """The operator subcommands, on smartcache-cli's subparsers."""
    _cluster_parser(sub)
    keys.add_parser(sub)


def run(a: argparse.Namespace, emit: Emit) -> int:
    return _cluster(a, emit) if a.command == "cluster" else keys.run(a, emit)


def _cluster_parser(sub: Any) -> None:
    cl = sub.add_parser(
        "cluster",
        help="the storage cluster: status, switchover, rejoin, members (talks to Tarantool, not the service)",
        description="Ask every Tarantool instance its role (sc.role), or ask for a planned hand-over, a "
        "rebuild or a membership change. Roles are decided by etcd, membership by the topology in etcd, which "
        "only the leader changes; this only asks. Every change is written to the audit log first, with who asked "
        "and --reason (smartcache-cli audit). " + storage.CREDENTIALS_HELP,
    )
    storage.add_options(cl)
    ops = cl.add_subparsers(dest="operation", required=True, metavar="OPERATION", help="what to do")
    _roles_parsers(ops)
    _members_parsers(ops)
    _moves_parsers(ops)
    rk = ops.add_parser(
        "sessions-rekey",
        help="rename the sessions written before revision 11 (keyed by the raw id) to their stored ids",
        description="Needs the session key the service derives with: $SMARTCACHE_SESSION_KEY or _FILE (make run's "
        "var/session.key), checked against the one the cluster's sessions are keyed with before anything is "
        "renamed. Pages through every shard's raw-keyed sessions; prints counts, never an id; running it again "
        "renames nothing (docs/operations.md, the rolling upgrade).",
    )
    rk.add_argument("--page", type=_page, default=500, metavar="N", help="sessions asked for at a time (1..1000)")
    storage.add_reason(rk)


def _roles_parsers(ops: Any) -> None:
    """cluster status / switchover / rejoin: the roles, asked of the instances (lua/README.md, Failover)."""
    ops.add_parser(
        "status",
        help="each instance: role, term, lease left, vclock, replication; who leads; the etcd members",
        description="Exit 0 when exactly one instance may write, none is diverged or unreachable, and every etcd "
        "member answers, is healthy and follows one leader (etcd is not asked when every instance runs "
        "standalone, or with --etcd ''); else 1.",
    )
    so = ops.add_parser(
        "switchover",
        help="planned hand-over: the leader stops writing, the candidate catches up and takes the key",
        description="Prints the measured write pause (pause_ms).",
    )
    so.add_argument("instance", nargs="?", help="the new leader, HOST:PORT or uuid (default: the most up to date)")
    so.add_argument("--timeout-ms", type=int, default=5000, metavar="MS", help="how long the hand-over may take")
    storage.add_reason(so)
    rj = ops.add_parser(
        "rejoin",
        help="rebuild an instance from the leader (its files are set aside first)",
        description="For an instance that reports DIVERGED: it restarts empty and copies the leader.",
    )
    rj.add_argument("instance", help="the instance to rebuild, HOST:PORT or uuid")
    rj.add_argument("--force", action="store_true", help="rebuild a follower that is not diverged too")
    storage.add_reason(rj)


def _moves_parsers(ops: Any) -> None:
    """cluster shard add / move / rebalance / drain / settle: moving buckets online (docs/resharding.md)."""
    sh = ops.add_parser("shard", help="add a shard to a sharded cluster (it holds no bucket until rebalance)")
    sh_ops = sh.add_subparsers(dest="shard_operation", required=True, metavar="OPERATION")
    sh_add = sh_ops.add_parser(
        "add",
        help="the new shard joins the bucket map holding nothing; its leader learns the bucket count",
        description="Start the shard's replica set first, each instance with SC_CLUSTER=<cluster>.<name>, and "
        "wait until it has a leader; then add it here, and move buckets to it (rebalance).",
    )
    sh_add.add_argument("name", help="the shard's name (its instances run as SC_CLUSTER=<cluster>.<name>)")
    storage.add_reason(sh_add)
    mv = ops.add_parser("move", help="move one bucket to a shard (its calls paused while its rows are copied)")
    mv.add_argument("bucket", type=int, help="the bucket, 0..buckets-1")
    mv.add_argument("shard", help="the destination shard")
    storage.add_reason(mv)
    for name, text in (
        ("rebalance", "move buckets until every shard holds as many (within one)"),
        ("drain", "move every bucket of a shard to the others, evenly (before the shard is removed)"),
    ):
        p = ops.add_parser(
            name,
            help=text,
            description=text + ". Prints progress on stderr and, at the end, "
            "the rate in buckets/s and rows/s and the pause of calls per bucket (p50, p99, max).",
        )
        if name == "drain":
            p.add_argument("shard", help="the shard to empty")
        p.add_argument("--parallel", type=_positive, default=2, metavar="K", help="moves at once (default 2)")
        p.add_argument(
            "--pause-ms", type=_not_negative, default=0, metavar="MS",
            help="wait after each move, per worker: throttles the moves so the front tier keeps its latency",
        )  # fmt: skip
        p.add_argument("--dry-run", action="store_true", help="print the plan, move nothing")
        storage.add_reason(p)
    st = ops.add_parser(
        "settle",
        help="finish or give up the moves left half-done, once (every service instance does it every 5 s)",
        description="Written to the audit log when the pass changed something.",
    )
    storage.add_reason(st, required=False)


def _page(text: str) -> int:
    n = int(text)
    if not 1 <= n <= 1000:
        raise argparse.ArgumentTypeError(f"must be 1..1000, not {n}")
    return n


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {n}")
    return n


def _not_negative(text: str) -> int:
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {n}")
    return n


def _moves(a: argparse.Namespace, access: Any, actor: Any, emit: Emit) -> int:
    from smartcache.cli.progress import Progress  # noqa: PLC0415 (the server extra: see _cluster)
    from smartcache.ops import moves  # noqa: PLC0415

    commands = moves.commands
    try:
        if a.operation == "shard":
            doc = moves.shard_add(access, a.name, actor=actor)
        elif a.operation == "settle":
            doc = commands.settle_once(access, actor=actor)
        elif a.operation == "move":
            doc = commands.move_bucket(access, a.bucket, a.shard, actor=actor)
        else:
            away = [a.shard] if a.operation == "drain" else []
            current, plan = commands.plan(access, away=away)
            if away and away[0] not in current["shards"]:
                emit({"error": "NOT_FOUND", "message": f"no shard {away[0]!r} (shards: {current['shards']})"})
                return exits.USAGE
            if a.dry_run:
                emit({"status": "OK", "moves": len(plan), "plan": [[b, s] for b, s in plan]})
                return exits.OK
            doc = commands.rebalance(
                access, plan, actor=actor, drained=away[0] if away else None, parallel=a.parallel,
                pause_s=a.pause_ms / 1000, progress=Progress(len(plan)),
            )  # fmt: skip
    except etcd.EtcdUnavailable as e:
        emit({"error": "ETCD_UNAVAILABLE", "message": f"etcd did not answer (the bucket map is there): {e}"})
        return exits.UNAVAILABLE
    except moves.MoveError as e:
        emit({"status": "MOVE_FAILED", "message": str(e)})
        return exits.STATUS
    emit(doc)
    return exit_of(doc)


def _members_parsers(ops: Any) -> None:
    """cluster init / add / remove: the topology in etcd, changed by the leader (lua/README.md, Topology)."""
    ini = ops.add_parser(
        "init",
        help="the cluster's first topology: the live members become its members (idempotent)",
        description="Without a topology SC_CLUSTER_SIZE makes the majority and every instance counts; with one, "
        "its members do, and adding or removing one needs no restart. Refused while fewer than SC_CLUSTER_SIZE "
        "members are live (--force: with those that are). The first add or remove makes it too.",
    )
    ini.add_argument("--force", action="store_true", help="make it of the live members even if some are missing")
    ini.add_argument(
        "--shards",
        metavar="NAME,...",
        help="make a sharded cluster instead: its bucket map in etcd (the buckets split over these shards, each a "
        "replica set running as SC_CLUSTER=<cluster>.<shard>), and each shard's leader takes its buckets; "
        "idempotent (docs/design/sharding.md)",
    )
    ini.add_argument(
        "--buckets", type=int, default=1024, metavar="N", help="with --shards: how many buckets (1..65536; 1024)"
    )
    storage.add_reason(ini)
    add = ops.add_parser(
        "add",
        help="make an instance a member: an empty instance waiting for it then joins the leader",
        description="ADDRESS is the instance's advertised address (SC_ADVERTISE, default SC_LISTEN). Start the "
        "instance before or after: until it is a member it waits, replicating from nobody.",
    )
    add.add_argument("address", help="HOST:PORT the instance advertises")
    add.add_argument("--http-port", type=int, metavar="N", help="its operator HTTP port (default: from its record)")
    add.add_argument("--not-eligible", action="store_true", help="a member that acknowledges writes, never leads")
    storage.add_reason(add)
    rm = ops.add_parser(
        "remove",
        help="take a member out: it stops replicating and counting first, then leaves the list",
        description="Refused for the leader (switch over first). Waits until the member replicates no more and "
        "says it is unregistered, or is down; on a timeout it stays marked leaving (its acknowledgements no "
        "longer count) and running remove again finishes.",
    )
    rm.add_argument("address", help="HOST:PORT of the member (as listed by cluster status)")
    rm.add_argument("--timeout-ms", type=int, default=10000, metavar="MS", help="how long to wait for it to let go")
    storage.add_reason(rm)


def _cluster(a: argparse.Namespace, emit: Emit) -> int:
    endpoints = etcd.endpoints_of(a.etcd)
    with_etcd = a.operation == "status" and bool(endpoints)  # etcd is asked with the standard library alone
    if _connector_missing(emit, (lambda: etcd.status(endpoints, a.timeout)) if with_etcd else None):
        return exits.MISSING_PACKAGE
    from smartcache.ops import cluster  # noqa: PLC0415 (the server extra: checked above)

    access = storage.access_of(a, emit)
    if isinstance(access, int):
        return access
    actor = None
    if a.operation != "status":
        dry_run = getattr(a, "dry_run", False)
        actor = storage.actor_of(a, access, _what(a), required=a.operation in storage.REASON_REQUIRED and not dry_run)
        if isinstance(actor, str):
            emit({"error": "BAD_ARGUMENT", "message": actor})
            return exits.USAGE
    if a.operation in MOVES:
        name = access.cluster or clustername.reported(access)
        if name is None:
            asked = ", ".join(access.addresses)
            emit({"error": "UNREACHABLE", "message": f"no instance answered with its cluster's name ({asked}): "
                  "check --tarantool, or name the sharded cluster with --cluster"})  # fmt: skip
            return exits.UNAVAILABLE
        return _moves(a, replace(access, cluster=name), actor, emit)
    if a.operation == "status":
        doc = cluster.status(access)
        emit(doc)
        return exits.OK if doc["healthy"] else exits.STATUS
    if a.operation == "sessions-rekey":
        return _rekey(a, access, actor, emit)
    return _change(a, access, actor, emit)


def _rekey(a: argparse.Namespace, access: Any, actor: Any, emit: Emit) -> int:
    """cluster sessions-rekey: the service's session key, then every shard's raw-keyed sessions renamed."""
    from smartcache.ops import rekey  # noqa: PLC0415 (the server extra: see _cluster)

    env = Environment(os.environ)
    key = env.session_key()
    try:
        env.check()
    except SettingsError as e:
        emit({"error": "BAD_ARGUMENT", "message": f"smartcache-cli cluster sessions-rekey: {e}"})
        return exits.USAGE
    if not key:
        emit({"error": "BAD_ARGUMENT", "message": "smartcache-cli cluster sessions-rekey needs the session key the "
              "service derives stored ids with: set SMARTCACHE_SESSION_KEY or SMARTCACHE_SESSION_KEY_FILE as the "
              "service has it (make run's is var/session.key)"})  # fmt: skip
        return exits.USAGE
    access, shards = storage.sharded(access)
    doc = rekey.rekey(access, key, shard_names=shards, page=a.page, actor=actor)
    emit(doc)
    return exit_of(doc)


def _what(a: argparse.Namespace) -> str:
    """The operation as typed (``shard add``), for messages."""
    return f"shard {a.shard_operation}" if a.operation == "shard" else str(a.operation)


def _connector_missing(emit: Emit, etcd_status: Callable[[], dict[str, Any]] | None = None) -> bool:
    """True (after saying so) when the Tarantool connector (the server extra) is not installed; etcd's status is
    shown all the same when asked for (etcd_status: read with the standard library alone)."""
    try:
        import tarantool  # noqa: F401, PLC0415
    except ModuleNotFoundError as e:
        if e.name != "tarantool":
            raise
        doc: dict[str, Any] = {
            "error": "MISSING_PACKAGE",
            "message": f"cluster needs the server extra: {extras.SERVER_EXTRA_INSTALL}",
        }
        if etcd_status is not None:
            doc["etcd"] = etcd_status()
        emit(doc)
        return True
    return False


def _change(a: argparse.Namespace, access: Any, actor: Any, emit: Emit) -> int:
    """cluster switchover / rejoin / init / add / remove: one operation of ops.cluster, its answer printed."""
    from smartcache.ops import cluster  # noqa: PLC0415 (the server extra: see _cluster)

    try:
        if a.operation == "switchover":
            doc = cluster.switchover(access, a.instance, a.timeout_ms, actor=actor)
        elif a.operation == "rejoin":
            doc = cluster.rejoin(access, a.instance, force=a.force, actor=actor)
        elif a.operation == "init" and a.shards:
            names = [x.strip() for x in a.shards.split(",") if x.strip()]
            if not names or not 1 <= a.buckets <= MAX_BUCKETS or len(set(names)) != len(names):
                emit({"error": "BAD_ARGUMENT", "message": f"--shards: distinct names; --buckets: 1..{MAX_BUCKETS}"})
                return exits.USAGE
            doc = cluster.shards_init(access, names, a.buckets, actor=actor)
        elif a.operation == "init":
            doc = cluster.topology_init(access, force=a.force, actor=actor)
        elif a.operation == "add":
            doc = cluster.topology_add(
                access, a.address, http_port=a.http_port, eligible=not a.not_eligible, actor=actor
            )
        else:
            doc = cluster.topology_remove(access, a.address, a.timeout_ms, actor=actor)
    except LookupError as e:
        emit({"error": "NOT_FOUND", "message": str(e)})
        return exits.USAGE
    emit(doc)
    return exit_of(doc)


def exit_of(doc: dict[str, Any]) -> int:
    """An operation's exit code: OK 0; an instance lost during it (CONNECTION_LOST) or no leader to take its audit
    entry (AUDIT_UNAVAILABLE: nothing done) 4; any other answer 1."""
    if "error" in doc or doc.get("status") == "AUDIT_UNAVAILABLE":
        return exits.UNAVAILABLE
    return exits.OK if doc.get("status") == "OK" else exits.STATUS
