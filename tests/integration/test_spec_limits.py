"""What PROTOCOL.md promises a client written from it alone, held against the real service.

The ranges of the registry's ``[limits]`` (proto/protocol.toml): each end of each range is
accepted, one past it is BAD_REQUEST with a message naming the field and the range, for every
field a limit names. Then the points a client author had to guess before the spec said them:
``wait_ms`` out of range refused (never capped), refusals never replayed under an idempotency
key, a key bound to its session, the fields of a queue CONFLICT, a latch await on no latch,
PING's clock and session rule, INFO's operator fields.
"""

from __future__ import annotations

import string
import time
import tomllib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from smartcache.client import Client
from smartcache.devstack.stack import Tarantool
from smartcache.wire import REGISTRY
from smartcache.wire.registry import REGISTRY_PATH
from tests.conftest import Running, running_service, service_settings

LIMITS: dict[str, dict[str, Any]] = tomllib.loads(REGISTRY_PATH.read_text())["limits"]
#: each probe's lifetime: waits at the largest wait_ms are cut to it
PROBE_LIFETIME_MS = 300
#: a valid request of each type a limit names ("@" is replaced by a name of the probe's own)
BASE: dict[str, dict[str, Any]] = {
    "COUNTER_GET": {"name": "@"},
    "COUNTER_ADD": {"name": "@"},
    "COUNTER_CAS": {"name": "@", "expected": 0, "value": 1},
    "REGISTER_GET": {"name": "@"},
    "REGISTER_CAS": {"name": "@", "value": 1},
    "SEQUENCE_RESERVE": {"name": "@", "count": 1},
    "SEQUENCE_GET": {"name": "@"},
    "SEMAPHORE_ACQUIRE": {"name": "@", "holder": "h", "lease_ms": 1000},
    "SEMAPHORE_RELEASE": {"name": "@", "holder": "h"},
    "SEMAPHORE_RENEW": {"name": "@", "holder": "h", "lease_ms": 1000},
    "SEMAPHORE_GET": {"name": "@"},
    "LATCH_CREATE": {"name": "@", "count": 1},
    "LATCH_COUNT_DOWN": {"name": "@"},
    "LATCH_AWAIT": {"name": "@"},
    "LATCH_GET": {"name": "@"},
    "QUEUE_PUT": {"name": "@", "payload": 1},
    "QUEUE_TAKE": {"name": "@"},
    "QUEUE_ACK": {"name": "@", "task_id": 1},
    "QUEUE_RELEASE": {"name": "@", "task_id": 1},
    "QUEUE_STATS": {"name": "@"},
    "SESSION_CREATE": {"client_id": "limits"},
    "SESSION_GET": {},
    "SESSION_TOUCH": {},
    "SESSION_UPDATE": {"data": 1},
    "SESSION_DELETE": {},
    "SESSION_ROTATE": {},
    "SESSION_DELETE_CLIENT": {"client_id": "limits-out"},
    "CACHE_PUT": {"key": "@", "data": 1},
    "CACHE_GET": {"key": "@"},
    "CACHE_DELETE": {"key": "@"},
    "DEVICE_BIND": {"device_id": "@", "client_id": "limits"},
    "EVENT_PUBLISH": {"topic": "app.limits"},
    "EVENTS_READ": {},
}
#: one-byte idempotency keys, each used once (a key stored for one request refuses another)
_ONE_BYTE_KEYS = iter(string.ascii_letters + string.digits + string.punctuation)


#: PROTOCOL.md's table of ranges lies between these lines
TABLE_START = "<!-- limits: the registry's [limits], checked by tests/integration/test_spec_limits.py -->"
TABLE_END = "<!-- end limits -->"
_UNITS = {"integer": "", "bytes": " bytes", "items": " items", "msgpack bytes": " bytes of msgpack"}


def _number(n: int) -> str:
    if abs(n) == 2**53 - 1:
        return "2^53 − 1" if n > 0 else "−(2^53 − 1)"
    return ("−" if n < 0 else "") + f"{abs(n):,}".replace(",", " ")


def _fields(fields: list[str]) -> str:
    """`name` (TYPE, TYPE) for one field name (every type with it: said so); else TYPE `a`, `b`; TYPE `c`."""
    pairs = [f.split(".") for f in fields]
    names = list(dict.fromkeys(name for _, name in pairs))
    types = list(dict.fromkeys(t for t, _ in pairs))
    if len(names) > 1:
        return "; ".join(f"{t} " + ", ".join(f"`{n}`" for tt, n in pairs if tt == t) for t in types)
    (name,) = names
    if name.endswith("[]"):
        return f"each of `{name[:-2]}` ({', '.join(types)})"
    having = [t for t, spec in REGISTRY.types.items() if any(f.name == name for f in spec.request)]
    listed = "every type with it" if len(types) >= 8 and set(types) == set(having) else ", ".join(types)
    return f"`{name}` ({listed})"


def limits_table() -> str:
    """The registry's [limits] as PROTOCOL.md shows them (section 10, Ranges)."""
    rows = [
        "| Fields | Range | Default | Storage setting | Meaning |",
        "|---|---|---|---|---|",
    ]
    for limit in LIMITS.values():
        unit = _UNITS[limit.get("unit", "integer")]
        span = f"{_number(limit['min'])} … {_number(limit['max'])}{unit}"
        default = _number(limit["default"]) if "default" in limit else "—"
        setting = f"`{limit['setting']}`" if "setting" in limit else "—"
        rows.append(f"| {_fields(limit['fields'])} | {span} | {default} | {setting} | {limit['doc']} |")
    return "\n".join(rows)


@pytest.fixture(scope="module")
def svc(storage: Tarantool) -> Iterator[Running]:
    with running_service(service_settings(storage)) as r:
        yield r


def _name() -> str:
    return f"lim-{uuid.uuid4().hex[:12]}"


def _string(n: int, field: str) -> str:
    """A string of n bytes for the field: unique where it can be."""
    if field == "EVENT_PUBLISH.topic":
        return "app." + "a" * (n - 4)
    if field.endswith("idempotency_key") and n == 1:
        return next(_ONE_BYTE_KEYS)
    return (uuid.uuid4().hex * (n // 32 + 1))[:n]


def _value(limit: dict[str, Any], field: str, n: int) -> Any:
    unit = limit.get("unit", "integer")
    if unit == "integer":
        return n
    if unit == "items":
        return [""] * n
    if unit == "msgpack bytes":
        return "x" * (n - 3)  # a str of 256 .. 65535 bytes: 3 bytes of msgpack header
    if field.endswith("[]"):
        return [_string(n, field)]
    return _string(n, field)


def _probe(c: Client, field: str, value: Any) -> tuple[str, str]:
    """Send the field's type with the field set to value; (status, message)."""
    type_name, name = field.split(".")
    name = name.removesuffix("[]")
    body = {k: (_name() if v == "@" else v) for k, v in BASE[type_name].items()}
    body[name] = value
    session = None
    if REGISTRY.types[type_name].session == "required" or name == "binding" or type_name == "SESSION_DELETE":
        session = c.session_create("limits").session_id  # a binding acts on a session; SESSION_DELETE names one
    reply = c.call(type_name, body, session_id=session, lifetime_ms=PROBE_LIFETIME_MS)
    return str(reply.status), str(reply.body.get("message", ""))


def _probes() -> list[tuple[str, str]]:
    return [(key, field) for key, limit in LIMITS.items() for field in limit["fields"]]


def test_every_limit_names_request_fields_of_the_registry_and_covers_every_field_of_its_kind() -> None:
    for key, limit in LIMITS.items():
        assert limit["min"] <= limit["max"], key
        assert limit.get("unit", "integer") in ("integer", "bytes", "items", "msgpack bytes"), key
        for field in limit["fields"]:
            type_name, name = field.split(".")
            assert name.removesuffix("[]") in {f.name for f in REGISTRY.types[type_name].request}, field
    named = {f for limit in LIMITS.values() for f in limit["fields"]}
    for type_name, spec in REGISTRY.types.items():
        for f in spec.request:
            if f.name in ("idempotency_key", "wait_ms", "ttl_ms", "lease_ms") or (
                f.name == "name" and 50 <= spec.id < 80
            ):
                assert f"{type_name}.{f.name}" in named, f"{type_name}.{f.name} has no limit"
    assert REGISTRY.max_wait_ms == LIMITS["wait_ms"]["max"]


def test_protocol_md_shows_the_registry_ranges() -> None:
    text = (REGISTRY_PATH.parent / "PROTOCOL.md").read_text()
    assert TABLE_START in text
    assert TABLE_END in text
    shown = text.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0].strip()
    assert shown == limits_table(), "PROTOCOL.md's ranges differ from proto/protocol.toml [limits]"


@pytest.mark.parametrize(("key", "field"), _probes())
def test_each_end_of_a_range_is_taken_and_one_past_it_is_bad_request_naming_field_and_range(
    svc: Running, key: str, field: str
) -> None:
    limit = LIMITS[key]
    lo, hi = limit["min"], limit["max"]
    name = field.split(".")[1].removesuffix("[]")
    ends = [hi] if limit.get("unit") == "msgpack bytes" else [lo, hi]  # no value encodes to 0 bytes
    for n in ends:
        status, message = _probe(svc.client, field, _value(limit, field, n))
        assert status != "BAD_REQUEST", f"{field} = {n} ({key}: {lo}..{hi}) refused: {message}"
    beyond = [hi + 1] + ([lo - 1] if limit.get("unit", "integer") == "integer" or lo > 0 else [])
    for n in beyond:
        status, message = _probe(svc.client, field, _value(limit, field, n))
        assert status == "BAD_REQUEST", f"{field} = {n} ({key}: {lo}..{hi}) answered {status}"
        assert name in message, f"{field} = {n}: {message!r}"
        assert f"{lo}..{hi}" in message, f"{field} = {n}: {message!r}"


# -- wait_ms: refused out of range, then cut to the lifetime ------------------------------------------


@pytest.mark.parametrize("wait_ms", [60_001, -1, 2**40])
@pytest.mark.parametrize("type_name", ["SEMAPHORE_ACQUIRE", "LATCH_AWAIT", "QUEUE_TAKE", "EVENTS_READ"])
def test_a_wait_ms_out_of_range_is_bad_request_not_capped(svc: Running, type_name: str, wait_ms: int) -> None:
    body = {k: (_name() if v == "@" else v) for k, v in BASE[type_name].items()} | {"wait_ms": wait_ms}
    started = time.monotonic()
    reply = svc.client.call(type_name, body, lifetime_ms=2000)
    assert (reply.status, reply.body["message"]) == ("BAD_REQUEST", "wait_ms must be an integer in 0..60000")
    assert time.monotonic() - started < 0.5, "answered at once, without waiting"


def test_the_largest_wait_ms_is_taken_and_cut_to_the_lifetime_left(svc: Running) -> None:
    started = time.monotonic()
    reply = svc.client.call("QUEUE_TAKE", {"name": _name(), "wait_ms": 60_000}, lifetime_ms=500)
    took = time.monotonic() - started
    assert reply.status == "TIMEOUT"
    assert 0.4 <= took < 0.75, f"waited {took:.3f} s: about the lifetime (500 ms) less the service's margin"


# -- idempotency keys ----------------------------------------------------------------------------------


def test_a_refusal_under_an_idempotency_key_is_not_replayed(svc: Running) -> None:
    """A CONFLICT or a BAD_REQUEST changed nothing and is not stored: a repeat answers what is true now."""
    c, n, key = svc.client, _name(), uuid.uuid4().hex
    cas = {"name": n, "expected": 5, "value": 6, "idempotency_key": key}
    assert c.call("COUNTER_CAS", cas).status == "CONFLICT"
    assert c.counter_cas(n, 0, 5).ok
    again = c.call("COUNTER_CAS", cas)
    assert (again.status, again.body["value"], again.body.get("replayed")) == ("OK", 6, None)
    assert c.call("COUNTER_CAS", cas).body["replayed"] is True
    key = uuid.uuid4().hex
    assert c.call("LATCH_CREATE", {"name": n, "count": 0, "idempotency_key": key}).status == "BAD_REQUEST"
    assert c.call("LATCH_CREATE", {"name": n, "count": 3, "idempotency_key": key}).ok


def test_a_key_belongs_to_its_session_and_body_and_to_no_client(svc: Running) -> None:
    """The header's session is part of the request: the same key and body from another session is
    BAD_REQUEST; the same key, body and session from another client is a repeat."""
    c, key = svc.client, uuid.uuid4().hex
    s1, s2 = c.session_create("idem").session_id, c.session_create("idem").session_id
    assert c.call("SESSION_UPDATE", {"data": 1, "idempotency_key": key}, session_id=s1).ok
    other = c.call("SESSION_UPDATE", {"data": 1, "idempotency_key": key}, session_id=s2)
    assert (other.status, other.body["message"]) == ("BAD_REQUEST", "idempotency_key was used for a different request")
    assert c.session_get(s2).body["rev"] == 1
    with Client(svc.endpoint, timeout_s=5) as elsewhere:
        again = elsewhere.call("SESSION_UPDATE", {"data": 1, "idempotency_key": key}, session_id=s1)
    assert (again.status, again.body["rev"], again.body["replayed"]) == ("OK", 2, True)


# -- the other guesses ----------------------------------------------------------------------------


def test_a_queue_conflict_carries_the_task_attempt_and_state(svc: Running) -> None:
    c, q = svc.client, _name()
    task_id = c.call("QUEUE_PUT", {"name": q, "payload": "job"}).body["task_id"]
    not_taken = c.call("QUEUE_RELEASE", {"name": q, "task_id": task_id})
    assert (not_taken.status, not_taken.body["attempt"], not_taken.body["state"]) == ("CONFLICT", 0, "ready")
    taken = c.call("QUEUE_TAKE", {"name": q, "ttr_ms": 60_000}).body
    stale = c.call("QUEUE_ACK", {"name": q, "task_id": task_id, "attempt": taken["attempt"] + 1})
    assert (stale.status, stale.body["attempt"], stale.body["state"]) == ("CONFLICT", 1, "taken")
    assert c.call("QUEUE_ACK", {"name": q, "task_id": task_id, "attempt": taken["attempt"]}).ok
    assert c.call("QUEUE_ACK", {"name": q, "task_id": task_id}).status == "NOT_FOUND"


def test_an_await_on_no_latch_is_not_found_at_once_whatever_its_wait(svc: Running) -> None:
    started = time.monotonic()
    reply = svc.client.call("LATCH_AWAIT", {"name": _name(), "wait_ms": 5000}, lifetime_ms=6000)
    assert reply.status == "NOT_FOUND"
    assert time.monotonic() - started < 0.5


def test_ping_answers_unix_ms_of_the_service_clock_and_refuses_a_session(svc: Running) -> None:
    before = int(time.time() * 1000)
    reply = svc.client.call("PING", {})
    after = int(time.time() * 1000)
    assert before <= reply.body["time_ms"] <= after  # the service runs in this process: one clock
    refused = svc.client.call("PING", {}, session_id=uuid.uuid4())
    assert (refused.status, refused.body["message"]) == ("BAD_REQUEST", "header session_id must be zero for this type")


def test_info_any_fields_are_maps_and_lists_for_operators(svc: Running) -> None:
    body = svc.client.call("INFO", {}).body
    assert body["settings"]["tarantool_password"] == "***"  # secrets hidden
    assert {"depth", "capacity"} <= set(body["queue"])
    assert {"slots", "busy"} <= set(body["workers"])
    assert {"address", "leader"} <= set(body["storage"][0])
    assert all(isinstance(v, dict) for v in body["messages"].values())
    assert "now_ms" in body["storage_stats"] or "error" in body["storage_stats"]


def test_bounds_of_sequence_start_and_its_conflict_field(svc: Running) -> None:
    """A new sequence may start at 0 or at 2^53 - 1; a range past 2^53 - 1 is CONFLICT with next."""
    c, largest = svc.client, 2**53 - 1
    assert c.call("SEQUENCE_RESERVE", {"name": _name(), "count": 1, "start": 0}).body["first"] == 0
    n = _name()
    top = c.call("SEQUENCE_RESERVE", {"name": n, "count": 1, "start": largest - 1}).body
    assert (top["first"], top["last"]) == (largest - 1, largest - 1)
    past = c.call("SEQUENCE_RESERVE", {"name": n, "count": 2})
    assert (past.status, past.body.get("next")) == ("CONFLICT", largest), past.body
