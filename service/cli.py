"""smartcache-cli: talk to a running service from a shell; prints JSON.

Examples::

    smartcache-cli ping
    smartcache-cli session-create client-42 --data '{"step": 1}'
    smartcache-cli session-get 6f1c...-uuid
    smartcache-cli --endpoint tcp://10.0.0.5:5555 device-lookup dev-1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from service.client import Client, Reply
from service.errors import RequestError

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def _render(reply: Reply) -> dict[str, Any]:
    out = {"status": reply.status, **_jsonable({k: v for k, v in reply.body.items() if k != "status"})}
    if reply.session_id is not None:
        out["session_id"] = str(reply.session_id)
    return out


def _json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # a bare word is a string


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="smartcache-cli", description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoint", default=os.environ.get("SMARTCACHE_ENDPOINT", DEFAULT_ENDPOINT))
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the reply")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("ping")
    c = sub.add_parser("session-create")
    c.add_argument("client_id")
    c.add_argument("--data", type=_json_arg)
    c.add_argument("--ttl", type=int)
    c.add_argument("--version")
    c.add_argument("--session")
    for name in ("session-get", "session-touch", "session-delete"):
        sub.add_parser(name).add_argument("session")
    u = sub.add_parser("session-update")
    u.add_argument("session")
    u.add_argument("data", type=_json_arg)
    u.add_argument("--expected-rev", type=int)
    sub.add_parser("session-list").add_argument("client_id")
    cp = sub.add_parser("cache-put")
    cp.add_argument("key")
    cp.add_argument("data", type=_json_arg)
    cp.add_argument("--ttl", type=int)
    cp.add_argument("--data-type", type=int)
    for name in ("cache-put", "cache-get", "cache-delete"):
        sp = cp if name == "cache-put" else sub.add_parser(name)
        if name != "cache-put":
            sp.add_argument("key")
        sp.add_argument("--session")
    b = sub.add_parser("device-bind")
    b.add_argument("device_id")
    b.add_argument("client_id")
    sub.add_parser("device-lookup").add_argument("device_id")
    sub.add_parser("app-start").add_argument("device_id")
    g = sub.add_parser("products-get")
    g.add_argument("client_id")
    g.add_argument("data_type", type=int)
    return p


def _run(c: Client, a: argparse.Namespace) -> Reply | None:
    match a.command:
        case "ping":
            return c.ping()
        case "session-create":
            return c.session_create(a.client_id, data=a.data, ttl_s=a.ttl, version=a.version, session_id=a.session)
        case "session-get":
            return c.session_get(a.session)
        case "session-touch":
            return c.session_touch(a.session)
        case "session-delete":
            return c.session_delete(a.session)
        case "session-update":
            return c.session_update(a.session, a.data, expected_rev=a.expected_rev)
        case "session-list":
            return c.session_list(a.client_id)
        case "cache-put":
            return c.cache_put(a.key, a.data, session_id=a.session, data_type=a.data_type, ttl_s=a.ttl)
        case "cache-get":
            return c.cache_get(a.key, session_id=a.session)
        case "cache-delete":
            return c.cache_delete(a.key, session_id=a.session)
        case "device-bind":
            return c.device_bind(a.device_id, a.client_id)
        case "device-lookup":
            return c.device_lookup(a.device_id)
        case "products-get":
            return c.products_get(a.client_id, a.data_type)
        case "app-start":
            c.app_start(a.device_id)
            return None
    raise AssertionError(a.command)


def main(argv: list[str] | None = None) -> int:
    """Exit 0 on an OK reply, 1 on another status, 2 on a transport error or timeout."""
    args = _parser().parse_args(argv)
    with Client(args.endpoint, timeout_s=args.timeout) as client:
        try:
            reply = _run(client, args)
        except (RequestError, ValueError) as e:
            print(json.dumps({"error": getattr(e, "transport_error", "BAD_ARGUMENT"), "message": str(e)}))
            return 2
    if reply is None:
        print(json.dumps({"status": "SENT"}))
        return 0
    print(json.dumps(_render(reply)))
    return 0 if reply.ok else 1


if __name__ == "__main__":
    sys.exit(main())
