"""smartcache-cli's operator commands: ``cluster`` (storage roles, switchover, rejoin) and ``keys`` (CURVE).

They talk to Tarantool or write files, not to the service; main.py wires them
in and prints what they return (one JSON object, the exit codes of cli/exits.py).
Which cluster a command is about is :mod:`.clustername`'s.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from smartcache import extras
from smartcache.cli import clustername, exits
from smartcache.ops import etcd
from smartcache.settings import Environment, SettingsError
from smartcache.wire.buckets import MAX_BUCKETS
from smartcache.wire.keys import create_key_pair
from smartcache.wire.ports import CLUSTER_VARIABLE, default_etcd, default_tarantool

COMMANDS = ("cluster", "keys")
#: the operations that move buckets: they need the sharded cluster's name (given, else the instances')
MOVES = ("shard", "move", "rebalance", "drain", "settle")
Emit = Callable[[dict[str, Any]], None]


def add_parsers(sub: Any) -> None:
    """The operator subcommands, on smartcache-cli's subparsers."""
    _cluster_parser(sub)
    _keys_parser(sub)


def run(a: argparse.Namespace, emit: Emit) -> int:
    return _cluster(a, emit) if a.command == "cluster" else _keys(a, emit)


def _cluster_parser(sub: Any) -> None:
    cl = sub.add_parser(
        "cluster",
        help="the storage cluster: status, switchover, rejoin, members (talks to Tarantool, not the service)",
        description="Ask every Tarantool instance its role (sc.role), or ask for a planned hand-over, a "
        "rebuild or a membership change. Roles are decided by etcd, membership by the topology in etcd, which "
        "only the leader changes; this only asks. Credentials: Tarantool's operator user, "
        "$SMARTCACHE_OPERATOR_USER (default operator) and $SMARTCACHE_OPERATOR_PASSWORD or _FILE (development "
        "default operator; Tarantool's SC_OPERATOR_PASSWORD).",
    )
    cl.add_argument(
        "--tarantool",
        default=default_tarantool(),
        metavar="HOST:PORT,...",
        help="every instance (default: $SMARTCACHE_TARANTOOL, else make run's; now %(default)s)",
    )
    cl.add_argument(
        "--etcd",
        default=default_etcd(),
        metavar="URL,...",
        help="etcd's client endpoints, for status (default: $SMARTCACHE_ETCD, else make run's three members; "
        "now %(default)s; '' skips etcd)",
    )
    cl.add_argument(
        "--cluster",
        default=os.environ.get(CLUSTER_VARIABLE) or None,
        metavar="NAME",
        help="the cluster's name, SC_CLUSTER; one etcd holds (default: $SMARTCACHE_CLUSTER, else what the instances "
        "report, and for a shard's instances the sharded cluster; cluster status prints it)",
    )
    ops = cl.add_subparsers(dest="operation", required=True, metavar="OPERATION", help="what to do")
    _roles_parsers(ops)
    _members_parsers(ops)
    _moves_parsers(ops)


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
    rj = ops.add_parser(
        "rejoin",
        help="rebuild an instance from the leader (its files are set aside first)",
        description="For an instance that reports DIVERGED: it restarts empty and copies the leader.",
    )
    rj.add_argument("instance", help="the instance to rebuild, HOST:PORT or uuid")
    rj.add_argument("--force", action="store_true", help="rebuild a follower that is not diverged too")


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
    mv = ops.add_parser("move", help="move one bucket to a shard (its calls paused while its rows are copied)")
    mv.add_argument("bucket", type=int, help="the bucket, 0..buckets-1")
    mv.add_argument("shard", help="the destination shard")
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
    ops.add_parser(
        "settle",
        help="finish or give up the moves left half-done, once (every service instance does it every 5 s)",
    )


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


def _moves(a: argparse.Namespace, access: Any, emit: Emit) -> int:
    from smartcache.cli.progress import Progress  # noqa: PLC0415 (the server extra: see _cluster)
    from smartcache.ops import moves  # noqa: PLC0415

    try:
        if a.operation == "shard":
            doc = moves.shard_add(access, a.name)
        elif a.operation == "settle":
            links = moves.Links(access)
            try:
                doc = moves.settle(access, links)
            finally:
                links.close()
        elif a.operation == "move":
            links = moves.Links(access)
            try:
                doc = {"status": "OK", **moves.move(access, links, a.bucket, a.shard).as_dict()}
            finally:
                links.close()
        else:
            current, _ = moves.read_map(access)
            away = [a.shard] if a.operation == "drain" else []
            if away and away[0] not in current["shards"]:
                emit({"error": "NOT_FOUND", "message": f"no shard {away[0]!r} (shards: {current['shards']})"})
                return exits.USAGE
            plan = moves.plan_even(current, current["shards"], away=away)
            if a.dry_run:
                emit({"status": "OK", "moves": len(plan), "plan": [[b, s] for b, s in plan]})
                return exits.OK
            progress = Progress(len(plan))
            doc = moves.run_moves(access, plan, parallel=a.parallel, pause_s=a.pause_ms / 1000, progress=progress)
    except etcd.EtcdUnavailable as e:
        emit({"error": "ETCD_UNAVAILABLE", "message": f"etcd did not answer (the bucket map is there): {e}"})
        return exits.UNAVAILABLE
    except moves.MoveError as e:
        emit({"status": "MOVE_FAILED", "message": str(e)})
        return exits.STATUS
    emit(doc)
    return exits.OK if doc.get("status") == "OK" else exits.STATUS


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
    add = ops.add_parser(
        "add",
        help="make an instance a member: an empty instance waiting for it then joins the leader",
        description="ADDRESS is the instance's advertised address (SC_ADVERTISE, default SC_LISTEN). Start the "
        "instance before or after: until it is a member it waits, replicating from nobody.",
    )
    add.add_argument("address", help="HOST:PORT the instance advertises")
    add.add_argument("--http-port", type=int, metavar="N", help="its operator HTTP port (default: from its record)")
    add.add_argument("--not-eligible", action="store_true", help="a member that acknowledges writes, never leads")
    rm = ops.add_parser(
        "remove",
        help="take a member out: it stops replicating and counting first, then leaves the list",
        description="Refused for the leader (switch over first). Waits until the member replicates no more and "
        "says it is unregistered, or is down; on a timeout it stays marked leaving (its acknowledgements no "
        "longer count) and running remove again finishes.",
    )
    rm.add_argument("address", help="HOST:PORT of the member (as listed by cluster status)")
    rm.add_argument("--timeout-ms", type=int, default=10000, metavar="MS", help="how long to wait for it to let go")


def _cluster(a: argparse.Namespace, emit: Emit) -> int:
    endpoints = etcd.endpoints_of(a.etcd)
    try:
        # The Tarantool connector comes with the server extra; the other commands need only the client's.
        from smartcache.ops import cluster  # noqa: PLC0415
    except ModuleNotFoundError as e:
        if e.name != "tarantool":
            raise
        doc: dict[str, Any] = {
            "error": "MISSING_PACKAGE",
            "message": f"cluster needs the server extra: {extras.SERVER_EXTRA_INSTALL}",
        }
        if a.operation == "status" and endpoints:  # etcd is asked with the standard library alone
            doc["etcd"] = etcd.status(endpoints, a.timeout)
        emit(doc)
        return exits.MISSING_PACKAGE
    # The operator's credentials, read as the console reads them (stripped, empty is unset, the secret from the
    # variable or its _FILE, never both): a bad one is a bad environment variable.
    env = Environment(os.environ)
    user, password = env.get("OPERATOR_USER", "operator", str), env.secret("OPERATOR_PASSWORD", "operator")
    try:
        env.check()
    except SettingsError as e:
        emit({"error": "BAD_ARGUMENT", "message": f"smartcache-cli cluster: {e}"})
        return exits.USAGE
    access = cluster.Access(
        addresses=[x.strip() for x in a.tarantool.split(",") if x.strip()],
        user=user,
        password=password,
        timeout_s=a.timeout,  # per instance and etcd member: a frozen one is reported unreachable, not waited for
        etcd=endpoints,
        cluster=a.cluster or None,  # --cluster "": none given
    )
    not_found = clustername.unknown(access)
    if not_found is not None:
        emit(not_found)
        return exits.USAGE
    if a.operation in MOVES:
        name = access.cluster or clustername.reported(access)
        if name is None:
            asked = ", ".join(access.addresses)
            emit({"error": "UNREACHABLE", "message": f"no instance answered with its cluster's name ({asked}): "
                  "check --tarantool, or name the sharded cluster with --cluster"})  # fmt: skip
            return exits.UNAVAILABLE
        return _moves(a, replace(access, cluster=name), emit)
    if a.operation == "status":
        doc = cluster.status(access)
        emit(doc)
        return exits.OK if doc["healthy"] else exits.STATUS
    return _change(a, access, emit)


def _change(a: argparse.Namespace, access: Any, emit: Emit) -> int:
    """cluster switchover / rejoin / init / add / remove: one operation of ops.cluster, its answer printed."""
    from smartcache.ops import cluster  # noqa: PLC0415 (the server extra: see _cluster)

    try:
        if a.operation == "switchover":
            doc = cluster.switchover(access, a.instance, a.timeout_ms)
        elif a.operation == "rejoin":
            doc = cluster.rejoin(access, a.instance, force=a.force)
        elif a.operation == "init" and a.shards:
            names = [x.strip() for x in a.shards.split(",") if x.strip()]
            if not names or not 1 <= a.buckets <= MAX_BUCKETS or len(set(names)) != len(names):
                emit({"error": "BAD_ARGUMENT", "message": f"--shards: distinct names; --buckets: 1..{MAX_BUCKETS}"})
                return exits.USAGE
            doc = cluster.shards_init(access, names, a.buckets)
        elif a.operation == "init":
            doc = cluster.topology_init(access, force=a.force)
        elif a.operation == "add":
            doc = cluster.topology_add(access, a.address, http_port=a.http_port, eligible=not a.not_eligible)
        else:
            doc = cluster.topology_remove(access, a.address, a.timeout_ms)
    except LookupError as e:
        emit({"error": "NOT_FOUND", "message": str(e)})
        return exits.USAGE
    emit(doc)
    if "error" in doc:  # CONNECTION_LOST: the instance stopped answering during the call
        return exits.UNAVAILABLE
    return exits.OK if doc.get("status") == "OK" else exits.STATUS


def _keys_parser(sub: Any) -> None:
    keys = sub.add_parser("keys", help="CURVE keys: generate a key pair for the service or a client")
    kops = keys.add_subparsers(dest="operation", required=True, metavar="OPERATION", help="what to do")
    gen = kops.add_parser(
        "generate",
        help="write NAME.key (public: give it to the other side) and NAME.key_secret (keep it) into DIR",
        description="A client's NAME.key goes into the service's SMARTCACHE_CURVE_CLIENTS_DIR; the service's "
        "NAME.key_secret is its SMARTCACHE_CURVE_SECRET_KEY_FILE, its NAME.key the clients' --server-key.",
    )
    gen.add_argument("directory", help="where to write the two files (created if missing)")
    gen.add_argument("name", help="the key's name, e.g. front-1 or smartcache")
    gen.add_argument(
        "--permissions",
        help="for a client key: what it may send, comma-separated type names (EVENTS_* wildcards) and groups "
        "@read, @write, @operator (default: everything)",
    )


def _keys(a: argparse.Namespace, emit: Emit) -> int:
    directory = Path(a.directory)
    directory.mkdir(parents=True, exist_ok=True)
    try:
        public, secret = create_key_pair(directory, a.name, a.permissions)
    except ValueError as e:
        emit({"error": "BAD_ARGUMENT", "message": str(e)})
        return exits.USAGE
    emit({"status": "OK", "public": str(public), "secret": str(secret)})
    return exits.OK
