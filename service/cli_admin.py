"""smartcache-cli's operator commands: ``cluster`` (storage roles, switchover, rejoin) and ``keys`` (CURVE).

They talk to Tarantool or write files, not to the service; cli.py wires them
in and prints what they return (one JSON object, the same exit codes).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from service import cluster
from service.config import PORT_OFFSET_VARIABLE
from service.security import create_key_pair

COMMANDS = ("cluster", "keys")
EXIT_OK, EXIT_STATUS, EXIT_BAD = 0, 1, 2
Emit = Callable[[dict[str, Any]], None]


def add_parsers(sub: Any) -> None:
    """The operator subcommands, on smartcache-cli's subparsers."""
    _cluster_parser(sub)
    _keys_parser(sub)


def run(a: argparse.Namespace, emit: Emit) -> int:
    return _cluster(a, emit) if a.command == "cluster" else _keys(a, emit)


def default_tarantool() -> str:
    """$SMARTCACHE_TARANTOOL, else make run's three instances (ports 3301-3303 + $SMARTCACHE_PORT_OFFSET)."""
    offset = os.environ.get(PORT_OFFSET_VARIABLE, "").strip()
    base = 3301 + (int(offset) if offset.isdigit() else 0)
    return os.environ.get("SMARTCACHE_TARANTOOL") or ",".join(f"127.0.0.1:{base + i}" for i in range(3))


def _cluster_parser(sub: Any) -> None:
    cl = sub.add_parser(
        "cluster",
        help="the storage cluster: status, switchover, rejoin (talks to Tarantool, not the service)",
        description="Ask every Tarantool instance its role (sc.role), or ask for a planned hand-over or a "
        "rebuild. Roles are decided by etcd; this only asks. Credentials: Tarantool's operator user, "
        "$SMARTCACHE_OPERATOR_USER (default operator) and $SMARTCACHE_OPERATOR_PASSWORD or _FILE (development "
        "default operator; Tarantool's SC_OPERATOR_PASSWORD).",
    )
    cl.add_argument(
        "--tarantool",
        default=default_tarantool(),
        metavar="HOST:PORT,...",
        help="every instance (default: $SMARTCACHE_TARANTOOL, else make run's; now %(default)s)",
    )
    ops = cl.add_subparsers(dest="operation", required=True, metavar="OPERATION", help="what to do")
    ops.add_parser(
        "status",
        help="each instance: role, term, lease left, vclock, replication; who leads",
        description="Exit 0 when exactly one instance may write and none is diverged or unreachable, else 1.",
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


def _cluster(a: argparse.Namespace, emit: Emit) -> int:
    access = cluster.Access(
        addresses=[x.strip() for x in a.tarantool.split(",") if x.strip()],
        user=os.environ.get("SMARTCACHE_OPERATOR_USER") or "operator",
        password=_secret("SMARTCACHE_OPERATOR_PASSWORD", "operator"),
        timeout_s=a.timeout,  # per instance: a frozen one is reported unreachable, not waited for
    )
    try:
        if a.operation == "status":
            doc = cluster.status(access)
            emit(doc)
            return EXIT_OK if doc["healthy"] else EXIT_STATUS
        if a.operation == "switchover":
            doc = cluster.switchover(access, a.instance, a.timeout_ms)
        else:
            doc = cluster.rejoin(access, a.instance, force=a.force)
    except LookupError as e:
        emit({"error": "NOT_FOUND", "message": str(e)})
        return EXIT_BAD
    emit(doc)
    return EXIT_OK if doc.get("status") == "OK" else EXIT_STATUS


def _secret(name: str, default: str) -> str:
    """NAME, or the content of the file NAME_FILE names (Docker secrets)."""
    path = os.environ.get(name + "_FILE")
    if path:
        return Path(path).read_text().strip()
    return os.environ.get(name) or default


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
        return EXIT_BAD
    emit({"status": "OK", "public": str(public), "secret": str(secret)})
    return EXIT_OK
