"""smartcache-cli: talk to a running service from a shell; prints one JSON object.

Examples::

    smartcache-cli ping
    smartcache-cli session-create client-42 --data '{"step": 1}'
    smartcache-cli session-get 6f1c2d4e-0b7a-4c55-9a51-3f0e8c1d2b6a
    smartcache-cli --endpoint tcp://10.0.0.5:5555 device-lookup dev-1
    SMARTCACHE_ENDPOINT=tcp://10.0.0.5:5555 smartcache-cli ping

Endpoint: --endpoint, else the SMARTCACHE_ENDPOINT environment variable,
else tcp://127.0.0.1:5555 (plus SMARTCACHE_PORT_OFFSET, as make run moves it).

Output: one document on stdout: "status" and the reply's fields, laid out for
reading on a terminal (info in sections like redis-cli INFO, cluster status as
tables), one JSON object with --json or when stdout is not a terminal (a pipe,
a file); events tail prints JSON lines on a terminal too (--format columns lays
them out). A session id is a credential: it is printed only where it is the
answer (session-create, session-rotate: UUID text) and taken only by the commands
a front server sends for its client (session-get ...); everything else names a
session by its handle (session-list, events, session-delete --handle). Other
byte strings are {"hex": "..."}. A transport error or a timeout prints
{"error": NAME, "message": ..., "endpoint": ...}; bad arguments print
{"error": "BAD_ARGUMENT", "message": ...} (and the usage on stderr), with the
names closest to a mistyped command or option ("did you mean").
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

import zmq

from smartcache import __version__
from smartcache.cli import admin as cli_admin
from smartcache.cli import audit as cli_audit
from smartcache.cli import coordination as cli_coordination
from smartcache.cli import events as cli_events
from smartcache.cli import exits, output, suggest
from smartcache.cli.arguments import identifier, parse_data, parse_delete, parse_set, seconds, session_id
from smartcache.client import DEFAULT_TIMEOUT_S, Client, CurveKeys, Reply
from smartcache.wire import REGISTRY
from smartcache.wire.errors import RequestError, RequestTimeout
from smartcache.wire.ports import (
    ENDPOINT_VARIABLE,
    LISTEN_PORT,
    PORT_OFFSET_VARIABLE,
    PortOffsetError,
    default_endpoint,
    port_offset,
)

#: product data types the core backend serves (the service's SMARTCACHE_PREWARM_TYPES default)
DATA_TYPES = "1 accounts, 2 cards, 3 deposits, 4 loans"
# Any number the core backend knows is accepted; these four are what the service prewarms by
# default (SMARTCACHE_PREWARM_TYPES).
PRODUCT_TYPES = f"any number the core backend knows; {DATA_TYPES} are prewarmed by default"
#: subcommands whose DATA is parsed as JSON unless --raw is given
DATA_HELP = "JSON: an object, a list, a number, true/false/null or a string in double quotes"
RAW_HELP = "send DATA as a plain string instead of parsing it as JSON"


def _jsonable(value: Any, key: str = "") -> Any:
    if isinstance(value, bytes):
        if key == "session_id" and len(value) == 16:
            return str(uuid.UUID(bytes=value))
        return {"hex": value.hex()}
    if isinstance(value, dict):
        return {k: _jsonable(v, k) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v, key) for v in value]
    return value


def _render(reply: Reply) -> dict[str, Any]:
    out = {"status": reply.status, **_jsonable({k: v for k, v in reply.body.items() if k != "status"})}
    if reply.session_id is not None:
        out["session_id"] = str(reply.session_id)
    return out


#: the bank's client id and a device id: never empty (the service would key an empty one like any other)
_client_id = identifier("client id", "client-42")
_device_id = identifier("device id", "dev-1")


class _Parser(argparse.ArgumentParser):
    """Bad arguments are one JSON object on stdout too, like every other outcome; the usage goes to stderr. A
    mistyped command or operation is answered with the closest names (cli/suggest.py)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        _print({"error": "BAD_ARGUMENT", "message": f"{self.prog}: {message}"})
        sys.exit(exits.USAGE)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices: Iterable[Any] | None = action.choices
        if choices is not None and value not in choices:
            message = suggest.invalid_choice(str(value), [str(c) for c in choices])
            if message is not None:
                raise argparse.ArgumentError(action, message)
        super()._check_value(action, value)


JSON_HELP = (
    "print one JSON line per answer (the default when standard output is not a terminal: a pipe, a file); on a "
    "terminal the answer is laid out for reading; before or after the command"
)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="smartcache-cli",
        description="Send one request to a running smartcache service and print the reply: laid out for reading "
        "on a terminal, one JSON line with --json or into a pipe.",
        epilog=(__doc__[__doc__.index("Endpoint:") :] if __doc__ else "") + "\n" + exits.HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__} (protocol {REGISTRY.version})")
    p.add_argument(
        "--json",
        action="store_true",
        help=JSON_HELP,
    )
    p.add_argument(
        "--endpoint",
        default=default_endpoint(),
        help=f"the service's ZeroMQ endpoint, tcp://host:port or ipc://path (default: ${ENDPOINT_VARIABLE},"
        f" else tcp://127.0.0.1:{LISTEN_PORT} + ${PORT_OFFSET_VARIABLE}; now %(default)s)",
    )
    p.add_argument(
        "--server-key",
        dest="curve_server_key",
        default=os.environ.get("SMARTCACHE_CURVE_SERVER_KEY_FILE") or None,
        metavar="FILE",
        help="the service's public CURVE key (its *.key certificate): talk CURVE "
        "(default: $SMARTCACHE_CURVE_SERVER_KEY_FILE)",
    )
    p.add_argument(
        "--key",
        dest="curve_key",
        default=os.environ.get("SMARTCACHE_CURVE_KEY_FILE") or None,
        metavar="FILE",
        help="our own CURVE key pair (a *.key_secret certificate; default: $SMARTCACHE_CURVE_KEY_FILE)",
    )
    p.add_argument(
        "--timeout",
        type=seconds,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"seconds to wait for the reply before giving up (exit {exits.TIMEOUT}); above 0, default %(default)s",
    )
    sub = p.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        help="one request; smartcache-cli COMMAND --help for its arguments",
    )

    def command(name: str, summary: str) -> argparse.ArgumentParser:
        spec = REGISTRY.types[name.upper().replace("-", "_")]
        return sub.add_parser(name, help=summary, description=f"{spec.name}: {spec.doc}")

    def session(
        sp: argparse.ArgumentParser, help: str = "the session id (UUID text, as session-create prints)"
    ) -> None:
        sp.add_argument("session", type=session_id, metavar="UUID", help=help)
        binding(sp)

    def data(sp: argparse.ArgumentParser, *flag: str) -> None:
        sp.add_argument(*(flag or ("data",)), metavar="DATA", help=DATA_HELP)
        sp.add_argument("--raw", action="store_true", help=RAW_HELP)

    command("ping", "check that the service answers (the broker replies itself)")
    command("info", "what the service is and does now: version, settings, queue, workers, storage, counts")

    _session_commands(command, session, data)

    session_help = "the session the entry belongs to (UUID); without it, the global namespace"
    cp = command("cache-put", "store data under a key")
    cp.add_argument("key", help="the cache key")
    data(cp)
    cp.add_argument("--ttl", type=int, metavar="SECONDS", help="lifetime in seconds (default: Tarantool's, 1800)")
    cp.add_argument("--data-type", type=int, metavar="N", help=f"data type stored with the entry ({DATA_TYPES})")
    cp.add_argument("--session", type=session_id, metavar="UUID", help=session_help)
    binding(cp)
    for name, summary in (("cache-get", "read a cache entry"), ("cache-delete", "delete a cache entry")):
        sp = command(name, summary)
        sp.add_argument("key", help="the cache key")
        sp.add_argument("--session", type=session_id, metavar="UUID", help=session_help)
        binding(sp)

    b = command("device-bind", "bind a device to a client, so its app starts prewarm")
    b.add_argument("device_id", type=_device_id, help="the device id")
    b.add_argument("client_id", type=_client_id, help="the bank's client id")
    command("device-lookup", "which client a device is bound to").add_argument(
        "device_id", type=_device_id, help="the device id"
    )
    command("app-start", "tell the service an app started (fire and forget: prints SENT)").add_argument(
        "device_id", type=_device_id, help="the device id"
    )
    g = command("products-get", "a client's products of one data type")
    g.add_argument("client_id", type=_client_id, help="the bank's client id")
    g.add_argument("data_type", type=int, help=f"product data type: {PRODUCT_TYPES}")
    cli_coordination.add_parsers(command, data)
    return _with_modules(p, sub)


BINDING_HELP = "the session's binding, if it was created with one (else BINDING_MISMATCH)"


def binding(sp: argparse.ArgumentParser) -> None:
    """--binding on a command that acts on a session."""
    sp.add_argument("--binding", metavar="TEXT", help=BINDING_HELP)


def _with_modules(p: argparse.ArgumentParser, sub: Any) -> argparse.ArgumentParser:
    """The subcommands that live in modules of their own: operators' (cli_admin), the audit log's and the event
    log's."""
    cli_admin.add_parsers(sub)
    cli_audit.add_parsers(sub)
    cli_events.add_parsers(sub)
    _json_anywhere(sub)
    return p


def _json_anywhere(sub: Any) -> None:
    """--json after the command too (``cluster status --json``, as people type it): every subcommand takes it,
    defaulting to what was given before the command (SUPPRESS leaves the top-level value alone)."""
    for parser in sub.choices.values():
        if "--json" not in parser._option_string_actions:
            parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=JSON_HELP)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                _json_anywhere(action)


def _session_commands(
    command: Callable[[str, str], argparse.ArgumentParser],
    session: Callable[[argparse.ArgumentParser], None],
    data: Callable[..., None],
) -> None:
    """session-create ... session-list on the parser (command, session and data are _parser's helpers)."""
    c = command("session-create", "create a session for a client; prints its id")
    c.add_argument("client_id", type=_client_id, help="the bank's client id")
    data(c, "--data")
    c.add_argument(
        "--ttl", type=int, metavar="SECONDS", help="sliding lifetime in seconds (default: Tarantool's, 1800)"
    )
    c.add_argument("--version", metavar="APP_VERSION", help="the app version that opens the session, e.g. 5.2.0")
    c.add_argument("--session", type=session_id, metavar="UUID", help="use this session id (UUID) instead of a new one")
    c.add_argument("--max-sessions", type=int, metavar="N", help="the client's live sessions after this one, at most")
    c.add_argument(
        "--limit-policy",
        choices=("refuse", "evict_oldest"),
        help="beyond --max-sessions: refuse (LIMIT_REACHED) or end the least recently used (default: the service's)",
    )
    c.add_argument("--device", metavar="NAME", help="the device the session is on, as session-list shows it")
    c.add_argument(
        "--max-lifetime", type=int, metavar="SECONDS",
        help="its absolute lifetime, which no refresh passes (60..31536000; default the cluster's, 12 h)",
    )  # fmt: skip
    c.add_argument(
        "--binding", metavar="TEXT",
        help="bind the session to this value (a device id, an app's fingerprint): every later command on it must "
        "give the same --binding",
    )  # fmt: skip

    session(command("session-get", "read a session (and refresh its expiry)"))
    session(command("session-touch", "refresh a session's expiry without reading it"))
    d = command("session-delete", "delete a session and its cache entries: by its id, or by handle (sign out a device)")
    d.add_argument("session", type=session_id, nargs="?", metavar="UUID", help="the session id (log out)")
    d.add_argument("--handle", metavar="HANDLE", help="instead of UUID: the session's handle, as session-list shows it")
    d.add_argument("--client", type=_client_id, metavar="CLIENT_ID", help="with --handle: the client it belongs to")
    binding(d)
    u = command("session-update", "replace a session's data, or set/unset attributes of map data")
    session(u)
    u.add_argument("data", nargs="?", metavar="DATA", help=DATA_HELP + " (or give --set / --unset)")
    u.add_argument("--raw", action="store_true", help=RAW_HELP)
    u.add_argument("--set", metavar="JSON", help="attributes to set, a JSON object: '{\"step\": 2}'")
    u.add_argument("--unset", action="append", metavar="ATTRIBUTE", default=None, help="an attribute to remove")
    u.add_argument(
        "--expected-rev", type=int, metavar="REV", help="update only if the session's revision is REV (else CONFLICT)"
    )
    r = command("session-rotate", "give a session a new id (at login); prints the new id")
    session(r)
    r.add_argument(
        "--grace-ms", type=int, metavar="MS",
        help="how long the old id still answers reads (0..60000; default the cluster's, 5000; 0: none)",
    )  # fmt: skip
    lo = command("session-delete-client", "log out everywhere: end every session of a client; prints how many")
    lo.add_argument("client_id", type=_client_id, help="the bank's client id")
    lo.add_argument("--keep", type=session_id, metavar="UUID", help="a session of the client that stays (the caller's)")
    command("session-list", "list a client's live sessions").add_argument(
        "client_id", type=_client_id, help="the bank's client id"
    )


def _run(c: Client, a: argparse.Namespace) -> Reply | None:
    match a.command:
        case "ping":
            return c.ping()
        case "info":
            return c.call("INFO")
        case "session-create":
            return c.session_create(
                a.client_id,
                data=a.data,
                ttl_s=a.ttl,
                version=a.version,
                session_id=a.session,
                max_sessions=a.max_sessions,
                limit_policy=a.limit_policy,
                device=a.device,
                max_lifetime_s=a.max_lifetime,
                binding=a.binding,
            )
        case "session-get":
            return c.session_get(a.session, binding=a.binding)
        case "session-touch":
            return c.session_touch(a.session, binding=a.binding)
        case "session-delete":
            return c.session_delete(a.session, handle=a.handle, client_id=a.client, binding=a.binding)
        case "session-update":
            return c.session_update(
                a.session, a.data, set=a.set, unset=a.unset, expected_rev=a.expected_rev, binding=a.binding
            )
        case "session-rotate":
            return c.session_rotate(a.session, grace_ms=a.grace_ms, binding=a.binding)
        case "session-delete-client":
            return c.session_delete_client(a.client_id, keep=a.keep)
        case "session-list":
            return c.session_list(a.client_id)
        case "cache-put":
            return c.cache_put(
                a.key, a.data, session_id=a.session, data_type=a.data_type, ttl_s=a.ttl, binding=a.binding
            )
        case "cache-get":
            return c.cache_get(a.key, session_id=a.session, binding=a.binding)
        case "cache-delete":
            return c.cache_delete(a.key, session_id=a.session, binding=a.binding)
        case "device-bind":
            return c.device_bind(a.device_id, a.client_id)
        case "device-lookup":
            return c.device_lookup(a.device_id)
        case "products-get":
            return c.products_get(a.client_id, a.data_type)
        case "app-start":
            c.app_start(a.device_id)
            return None
        case name if name in cli_coordination.COMMANDS:
            return cli_coordination.run(c, a)
    raise AssertionError(a.command)


#: --json, or standard output not a terminal: one JSON line per document (set in main)
_AS_JSON = not sys.stdout.isatty()


def _print(doc: dict[str, Any], kind: str = "") -> None:
    """One document: a JSON line for scripts, laid out for a person on a terminal (service/smartcache/cli/output.py)."""
    print(output.render(doc, kind, as_json=_AS_JSON))


def _parse(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parser and the arguments; a bad $SMARTCACHE_PORT_OFFSET (read for the defaults), a bad argument or an
    unknown option (with the closest known ones) is a usage error."""
    try:
        port_offset()
    except PortOffsetError as e:
        _print({"error": "BAD_ARGUMENT", "message": f"smartcache-cli: {e}"})
        sys.exit(exits.USAGE)
    parser = _parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        parser.error(suggest.unrecognized(parser, args, extras))
    return parser, args


def main(argv: list[str] | None = None) -> int:
    """The exit code: one per kind of outcome (cli/exits.py)."""
    global _AS_JSON
    parser, args = _parse(argv)
    _AS_JSON = args.json or not sys.stdout.isatty()
    if args.command in cli_admin.COMMANDS:
        kind = f"{args.command}-{getattr(args, 'operation', '')}"
        return cli_admin.run(args, lambda doc: _print(_jsonable(doc), kind))
    if args.command in cli_audit.COMMANDS:  # JSON lines unless --format columns, as events tail
        _AS_JSON = args.json or args.format == "json"
        return cli_audit.run(args, lambda doc: _print(_jsonable(doc), "audit"))
    if args.command in cli_events.COMMANDS:  # JSON lines unless --format columns, on a terminal too (the README)
        _AS_JSON = args.json or args.format == "json"
    parse_data(parser, args)
    parse_set(parser, args)
    parse_delete(parser, args)
    endpoint = args.endpoint
    curve = None
    if args.curve_server_key or args.curve_key:
        if not (args.curve_server_key and args.curve_key):
            parser.error("CURVE needs both --server-key and --key")
        try:
            curve = CurveKeys.from_files(args.curve_server_key, args.curve_key)
        except (OSError, ValueError) as e:
            parser.error(f"cannot read CURVE keys: {e}")
    try:
        client = Client(endpoint, timeout_s=args.timeout, curve=curve)
    except zmq.ZMQError as e:
        parser.error(f"--endpoint / ${ENDPOINT_VARIABLE} {endpoint!r}: {e} (expected tcp://host:port or ipc://path)")
    with client:
        try:
            if args.command in cli_events.COMMANDS:
                return cli_events.run(client, args, lambda doc: _print(_jsonable(doc), "event"))
            reply = _run(client, args)
        except RequestTimeout:
            message = (
                f"no reply from {endpoint} within {args.timeout:g} s: is the service running there?"
                f" (set --endpoint or ${ENDPOINT_VARIABLE})"
            )
            _print({"error": "TIMEOUT", "message": message, "endpoint": endpoint})
            return exits.TIMEOUT
        except RequestError as e:
            _print({"error": e.transport_error, "message": str(e), "endpoint": endpoint})
            return exits.UNAVAILABLE
    if reply is None:
        _print({"status": "SENT", "endpoint": endpoint})
        return exits.OK
    _print(_render(reply), args.command)
    return exits.OK if reply.ok else exits.STATUS


if __name__ == "__main__":
    sys.exit(main())
