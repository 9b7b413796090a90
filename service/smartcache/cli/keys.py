"""smartcache-cli's ``keys`` command: a CURVE key pair for the service or a client, written as two files.

No network: the pair is made here (smartcache.wire.keys) and written into a directory; admin.py
wires it in beside ``cluster``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from smartcache.cli import exits
from smartcache.wire.keys import create_key_pair

Emit = Callable[[dict[str, Any]], None]


def add_parser(sub: Any) -> None:
    """``keys generate`` on smartcache-cli's subparsers."""
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


def run(a: argparse.Namespace, emit: Emit) -> int:
    """Write the two files; the exit code."""
    directory = Path(a.directory)
    directory.mkdir(parents=True, exist_ok=True)
    try:
        public, secret = create_key_pair(directory, a.name, a.permissions)
    except ValueError as e:
        emit({"error": "BAD_ARGUMENT", "message": str(e)})
        return exits.USAGE
    emit({"status": "OK", "public": str(public), "secret": str(secret)})
    return exits.OK
