"""Session lookups: by client id or by handle, never by a session id; read from storage's operator HTTP.

Issue 37: a session id is a bearer credential (whoever holds it is the customer), so the console
never takes one, shows one or logs one: :func:`query_of` refuses a UUID with a sentence saying
why, and a session is named by its handle (``h`` and 26 base32 characters, what SESSION_LIST and
the events show), which cannot be used as an id.

Where: each instance's operator HTTP (``GET /clients/<id>/sessions``, ``GET /sessions/<handle>``,
lua/smartcache/http.lua) at the port its member record in etcd publishes (the storage part's
cluster status carries it: ``http_port``) and the host of its address; each replica set's leader
first, then the others (a follower may lag by a moment). These reads refresh nothing: before,
the console read a session with SESSION_GET through the service, which moved its expiry. When the
instances require ``SC_HTTP_TOKEN`` for their data routes, the console is given the same variable
(or ``SC_HTTP_TOKEN_FILE``). A standalone instance publishes no record: no lookup there.

Data is masked (``"••••"`` and its size in msgpack bytes) unless revealed: a reveal needs the
operator token and a reason, and is written to the audit (app.py). Nothing here logs.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Sequence
from typing import Any

import msgpack

from smartcache.wire import sessionkeys

MAX_LISTED = 20
MASK = "••••"
#: what the lookup answers for a session id, in the page too
REFUSED_ID = (
    "that is a session id (a UUID): a session id is a credential (whoever holds it is the customer), so the "
    "console never takes one. Look the session up by its client id, or by its handle (h and 26 letters and "
    "digits, as session lists and events show it)"
)
#: what a client id may hold to be put in the operator HTTP's path as it is (RFC 3986 pchar, unreserved)
_PATH_SAFE = "!$&'()*+,;=:@-._~"


class Refused(ValueError):
    """What was typed cannot be looked up (a session id, nothing, a client id no URL path carries as it is)."""


def query_of(text: str) -> tuple[str, str]:
    """("handle", h) or ("client_id", id) for what was typed; Refused (the message says why) for a session id."""
    value = text.strip()
    if not value:
        raise Refused("type a client id or a session's handle")
    try:
        uuid.UUID(value)
    except ValueError:
        pass
    else:
        raise Refused(REFUSED_ID)
    if sessionkeys.is_handle(value):
        return "handle", value
    if value[0] in "hH" and len(value) == sessionkeys.HANDLE_CHARS:
        try:
            sessionkeys.stored_of(value)
        except sessionkeys.NotAHandle as e:
            raise Refused(str(e)) from None
    return "client_id", value


def masked(data: Any, packed: bytes | None = None) -> dict[str, Any]:
    """What the page shows of a value it may not reveal: the mask and the value's size."""
    size = len(packed) if packed is not None else len(msgpack.packb(data, use_bin_type=True))
    return {"masked": MASK, "bytes": size}


def replica_sets(status: dict[str, Any]) -> list[list[str]]:
    """The operator HTTP base URLs of each replica set's instances that publish one, its leader's first."""
    groups = list((status.get("shards") or {}).values()) if "shards" in status else [status]
    out = []
    for group in groups:
        instances = [i for i in group.get("instances") or [] if i.get("http_port") and i.get("reachable")]
        instances.sort(key=lambda i: not (i.get("role") in ("leader", "standalone") and i.get("writable")))
        out.append([f"http://{i['address'].rpartition(':')[0]}:{i['http_port']}" for i in instances])
    return [urls for urls in out if urls]


def _get(url: str, token: str, timeout_s: float) -> tuple[int, dict[str, Any]]:
    """GET url (http://, made by replica_sets from an instance's address) as JSON: the status and the document."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 (http: replica_sets makes every URL)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as r:  # noqa: S310 (the same URL)
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read())
        except ValueError:
            return e.code, {"error": f"HTTP {e.code}"}


def _shown(view: dict[str, Any], reveal: bool) -> dict[str, Any]:
    """A session as the page shows it: data masked unless revealed (binary data comes as msgpack in base64)."""
    out = {k: v for k, v in view.items() if k not in ("data", "data_msgpack_base64")}
    packed = base64.b64decode(view["data_msgpack_base64"]) if "data_msgpack_base64" in view else None
    if reveal:
        out["data"] = {"msgpack_base64": view["data_msgpack_base64"]} if packed is not None else view.get("data")
    else:
        out["data"] = masked(view.get("data"), packed)
    return out


def lookup(
    sets: Sequence[Sequence[str]], kind: str, value: str, *, token: str, timeout_s: float, reveal: bool
) -> dict[str, Any]:
    """A client's live sessions, or the one a handle names, from each replica set (the first of its instances
    that answers); data masked unless reveal. ``{"sessions", "count", "shown"}``, or ``{"error", "message"}``."""
    if not sets:
        return {"error": "NO_HTTP", "message": "no instance's operator HTTP is known: their member records in etcd "
                "publish it (HA mode); a standalone instance publishes none"}  # fmt: skip
    if kind == "client_id":
        path = "/clients/" + urllib.parse.quote(value, safe=_PATH_SAFE) + "/sessions"
        if urllib.parse.unquote(path) != f"/clients/{value}/sessions":
            return {"error": "BAD_REQUEST", "message": "this client id holds characters a URL path escapes: the "
                    "operator HTTP cannot be asked for it (smartcache-cli session-list can)"}  # fmt: skip
    else:
        path = f"/sessions/{value}"
    found: list[dict[str, Any]] = []
    unanswered: list[str] = []
    for urls in sets:
        answer = _first_answer(urls, path, token, timeout_s)
        if answer is None:
            unanswered.append(urls[0])
            continue
        code, doc = answer
        if code == 200:
            found += list(doc.get("sessions") or []) if kind == "client_id" else [doc]
        elif code in (401, 403):
            return {"error": "UNAUTHORIZED", "message": "the instances' operator HTTP wants a token: give the console "
                    "the instances' SC_HTTP_TOKEN (or SC_HTTP_TOKEN_FILE)"}  # fmt: skip
    if not found and unanswered:
        return {"error": "UNAVAILABLE", "message": f"no answer from the operator HTTP of {', '.join(unanswered)}"}
    shown = [_shown(v, reveal) for v in found[:MAX_LISTED]]
    return {"sessions": shown, "count": len(found), "shown": len(shown)}


def _first_answer(urls: Sequence[str], path: str, token: str, timeout_s: float) -> tuple[int, dict[str, Any]] | None:
    """The first definite answer among one replica set's instances (200, 404; 421 and errors: the next one)."""
    for base in urls:
        try:
            code, doc = _get(base + path, token, timeout_s)
        except (OSError, ValueError):
            continue
        if code in (200, 404, 401, 403):
            return code, doc
    return None
