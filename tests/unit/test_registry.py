"""The registry defines every message type, status and transport error the design names."""

import re
from pathlib import Path

from smartcache.server.handlers.routes import ALL_HANDLERS
from smartcache.server.metrics import BAD_INPUT_ERRORS
from smartcache.server.storage.procedures import WRITES
from smartcache.wire import REGISTRY, errors

MESSAGE_TYPES = {
    "PING",
    "SESSION_CREATE",
    "SESSION_GET",
    "SESSION_TOUCH",
    "SESSION_UPDATE",
    "SESSION_DELETE",
    "SESSION_LIST",
    "CACHE_PUT",
    "CACHE_GET",
    "CACHE_DELETE",
    "DEVICE_BIND",
    "DEVICE_LOOKUP",
    "APP_START",
    "PRODUCTS_GET",
}
TRANSPORT_ERRORS = {
    "BAD_HEADER",
    "UNSUPPORTED_VERSION",
    "UNKNOWN_SYSTEM",
    "UNKNOWN_TYPE",
    "BODY_TOO_LARGE",
    "BAD_BODY",
    "QUEUE_FULL",
    "EXPIRED",
    "STORAGE_UNAVAILABLE",
    "SHUTTING_DOWN",
    "INTERNAL",
}


def test_every_message_type_is_defined() -> None:
    assert set(REGISTRY.types) >= MESSAGE_TYPES


def test_every_transport_error_is_defined_and_none_is_zero() -> None:
    assert set(REGISTRY.transport_errors) >= TRANSPORT_ERRORS
    assert REGISTRY.transport_errors["NONE"] == 0


def test_every_type_lists_fields_priority_lifetime_and_known_statuses() -> None:
    for spec in REGISTRY.types.values():
        assert spec.lifetime_ms > 0
        assert spec.lifetime_ms <= REGISTRY.max_lifetime_ms
        assert spec.priority >= 0
        assert set(spec.statuses) <= set(REGISTRY.statuses)
        assert spec.doc


def test_every_name_is_uppercase() -> None:
    for table in (REGISTRY.types, REGISTRY.statuses, REGISTRY.transport_errors):
        assert all(name.isupper() for name in table)


def test_check_request_names_the_bad_field() -> None:
    spec = REGISTRY.types["SESSION_CREATE"]
    assert spec.check_request({"client_id": "c"}) is None
    assert spec.check_request({}) == "missing field 'client_id'"
    assert spec.check_request({"client_id": 5}) == "field 'client_id' must be str"
    assert spec.check_request({"client_id": "c", "ttl_s": True}) == "field 'ttl_s' must be int"


# -- the registry is the one source: every name the code uses is in it --------------------------

ROOT = Path(__file__).resolve().parents[2]


def _lua_sources() -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / "lua" / "smartcache").rglob("*.lua")))


def test_every_protocol_error_class_names_a_registered_transport_error() -> None:
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.ProtocolError)]
    assert len(classes) > 5
    for cls in classes:
        assert cls.transport_error in REGISTRY.transport_errors, cls


def test_every_transport_error_the_service_answers_with_is_registered() -> None:
    """String literals passed to failure(), refuse(), _bad_input() and error() in smartcache/."""
    pattern = re.compile(r'(?:failure|refuse|_bad_input|\.error)\([^)]*?"([A-Z_]{4,})"', re.S)
    used = {m for p in (ROOT / "service" / "smartcache").rglob("*.py") for m in pattern.findall(p.read_text())}
    assert {"QUEUE_FULL", "EXPIRED", "OUTCOME_UNKNOWN", "STORAGE_UNAVAILABLE", "INTERNAL"} <= used
    assert used <= set(REGISTRY.transport_errors), used - set(REGISTRY.transport_errors)


def test_every_status_a_stored_procedure_returns_is_registered() -> None:
    lua = _lua_sources()
    used = set(re.findall(r"result\('([A-Z_]+)'", lua)) | set(re.findall(r"status = '([A-Z_]+)'", lua))
    assert {"OK", "NOT_FOUND", "NOT_LEADER", "DEADLINE_EXCEEDED", "ACQUIRED"} <= used
    assert used <= set(REGISTRY.statuses), used - set(REGISTRY.statuses)


def test_the_service_and_the_lua_api_agree_on_which_procedures_write() -> None:
    api = (ROOT / "lua" / "smartcache" / "api" / "writes.lua").read_text()  # the writes api.lua registers
    block = re.search(r"local writes = \{(.*?)\n\}", api, re.S)
    assert block is not None
    lua_writes = set(re.findall(r"^\s+(\w+) = ", block.group(1), re.M))
    assert lua_writes == set(WRITES)


def test_every_client_message_type_has_a_handler_and_every_handler_a_type() -> None:
    client_types = {t.name for t in REGISTRY.types.values()} - {"PING"}  # PING is the broker's
    assert set(ALL_HANDLERS) == client_types


def test_metrics_label_values_come_from_the_registry() -> None:
    assert set(BAD_INPUT_ERRORS) == REGISTRY.bad_input_errors
    assert REGISTRY.bad_input_errors <= {e for e, done in REGISTRY.executed.items() if done == "no"}


def test_write_types_take_an_idempotency_key_and_only_they() -> None:
    keyed = {t.name for t in REGISTRY.types.values() if any(f.name == "idempotency_key" for f in t.request)}
    assert keyed == {
        "SESSION_CREATE",
        "SESSION_TOUCH",
        "SESSION_UPDATE",
        "SESSION_DELETE",
        "SESSION_ROTATE",
        "SESSION_DELETE_CLIENT",  # several transactions: its last stores the answer under the key
        "CACHE_PUT",
        "CACHE_DELETE",
        "DEVICE_BIND",
        # Coordination (PROTOCOL.md): waiting writes keep no stored answer; SEMAPHORE_ACQUIRE's holder makes a
        # repeat harmless, QUEUE_TAKE's key returns the task taken under it.
        "SEMAPHORE_ACQUIRE",
        "COUNTER_ADD",
        "COUNTER_CAS",
        "REGISTER_CAS",
        "SEQUENCE_RESERVE",
        "SEMAPHORE_RELEASE",
        "SEMAPHORE_RENEW",
        "LATCH_CREATE",
        "LATCH_COUNT_DOWN",
        "QUEUE_PUT",
        "QUEUE_TAKE",
        "QUEUE_ACK",
        "QUEUE_RELEASE",
        # Events (PROTOCOL.md section 11): a published event is stored once per key.
        "EVENT_PUBLISH",
    }
