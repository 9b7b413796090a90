"""The registry defines every message type, status and transport error the design names."""

from service.protocol import REGISTRY

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
