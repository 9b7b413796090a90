"""How the CLI's operator commands reach storage, and who they say they are: options, credentials, the actor.

``cluster`` and ``audit`` talk to the Tarantool instances (and etcd), not to the service, as
Tarantool's operator user: ``$SMARTCACHE_OPERATOR_USER`` (default operator) and
``$SMARTCACHE_OPERATOR_PASSWORD`` or ``_FILE``, read as the console reads them
(smartcache.settings.Environment: stripped, empty is unset, never both).

Every acting command is written to the audit log in storage (smartcache.ops.audit) with who
asked and why: who is the operator's CURVE public key when the CLI has one (``--key``,
``$SMARTCACHE_CURVE_KEY_FILE``), else ``cli:<$USER>@<host> as <operator user>``; why is
``--reason``, required for every command that changes the cluster (:data:`REASON_REQUIRED`) and
checked before anything is sent.
"""

from __future__ import annotations

import argparse
import getpass
import os
import socket
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import zmq.auth

from smartcache.cli import clustername, exits
from smartcache.ops import etcd
from smartcache.ops.access import Access
from smartcache.ops.actors import MAX_REASON_BYTES, Actor, cli_who
from smartcache.settings import Environment, SettingsError
from smartcache.wire.ports import CLUSTER_VARIABLE, default_etcd, default_tarantool

Emit = Callable[[dict[str, Any]], None]
#: the cluster operations that need --reason (settle and the reads do not; a --dry-run acts on nothing)
REASON_REQUIRED = ("switchover", "rejoin", "init", "add", "remove", "shard", "move", "rebalance", "drain",
                   "sessions-rekey")  # fmt: skip
REASON_HELP = "why: written to the audit log with who asked (smartcache-cli audit shows it)"
CREDENTIALS_HELP = (
    "Credentials: Tarantool's operator user, $SMARTCACHE_OPERATOR_USER (default operator) and "
    "$SMARTCACHE_OPERATOR_PASSWORD or _FILE (development default operator; Tarantool's SC_OPERATOR_PASSWORD)."
)


def add_options(parser: argparse.ArgumentParser) -> None:
    """--tarantool, --etcd and --cluster: where the instances and etcd are, and which cluster."""
    parser.add_argument(
        "--tarantool",
        default=default_tarantool(),
        metavar="HOST:PORT,...",
        help="every instance (default: $SMARTCACHE_TARANTOOL, else make run's; now %(default)s)",
    )
    parser.add_argument(
        "--etcd",
        default=default_etcd(),
        metavar="URL,...",
        help="etcd's client endpoints, for status (default: $SMARTCACHE_ETCD, else make run's three members; "
        "now %(default)s; '' skips etcd)",
    )
    parser.add_argument(
        "--cluster",
        default=os.environ.get(CLUSTER_VARIABLE) or None,
        metavar="NAME",
        help="the cluster's name, SC_CLUSTER; one etcd holds (default: $SMARTCACHE_CLUSTER, else what the instances "
        "report, and for a shard's instances the sharded cluster; cluster status prints it)",
    )


def add_reason(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """--reason on an acting command (checked by :func:`actor_of`, so that its absence is said precisely)."""
    parser.add_argument(
        "--reason", metavar="TEXT", help=REASON_HELP + ("; required" if required else "; optional here")
    )


def access_of(a: argparse.Namespace, emit: Emit) -> Access | int:
    """The Access the options and the operator's credentials make, or the exit code after saying what is wrong
    (a bad credentials variable; a cluster name etcd does not hold)."""
    env = Environment(os.environ)
    user, password = env.get("OPERATOR_USER", "operator", str), env.secret("OPERATOR_PASSWORD", "operator")
    try:
        env.check()
    except SettingsError as e:
        emit({"error": "BAD_ARGUMENT", "message": f"smartcache-cli {a.command}: {e}"})
        return exits.USAGE
    access = Access(
        addresses=[x.strip() for x in a.tarantool.split(",") if x.strip()],
        user=user,
        password=password,
        timeout_s=a.timeout,  # per instance and etcd member: a frozen one is reported unreachable, not waited for
        etcd=etcd.endpoints_of(a.etcd),
        cluster=a.cluster or None,  # --cluster "": none given
    )
    not_found = clustername.unknown(access)
    if not_found is not None:
        emit(not_found)
        return exits.USAGE
    return access


def sharded(access: Access) -> tuple[Access, list[str]]:
    """The access named for the sharded cluster and its shards when the instances are one (a bucket map in etcd),
    else the access as given and no shard. Needs the Tarantool connector (the server extra)."""
    from smartcache.ops import status  # noqa: PLC0415 (the server extra)

    name = access.cluster or clustername.reported(access)
    mapped = status.bucket_map(replace(access, cluster=name)) if name else None
    if not mapped:
        return access, []
    return replace(access, cluster=name), [str(s) for s in mapped.get("shards") or []]


def actor_of(a: argparse.Namespace, access: Access, what: str, *, required: bool) -> Actor | str:
    """Who asks (the CURVE key, else the login and host) and the reason given; or the usage error's message
    (a reason required and missing, blank or too long; a CURVE key file that cannot be read)."""
    reason = (getattr(a, "reason", None) or "").strip()
    if required and not reason:
        return (
            f"smartcache-cli cluster {what}: --reason TEXT is required: say why (it is written to the audit log "
            "with who asked; smartcache-cli audit shows it)"
        )
    if len(reason.encode()) > MAX_REASON_BYTES:
        return f"smartcache-cli cluster {what}: --reason is {len(reason.encode())} bytes; at most {MAX_REASON_BYTES}"
    curve_public = None
    if a.curve_key:
        try:
            public, _ = zmq.auth.load_certificate(a.curve_key)
        except (OSError, ValueError) as e:
            return f"--key / $SMARTCACHE_CURVE_KEY_FILE {a.curve_key!r}: cannot read it ({e})"
        curve_public = public.decode()
    login = os.environ.get("USER") or getpass.getuser()
    return Actor(cli_who(access.user, login, socket.gethostname(), curve_public), reason or "(none given)")
