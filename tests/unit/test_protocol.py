"""Codec property tests: every valid header round-trips, every malformed input raises the right error."""

import contextlib
import struct

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from smartcache.wire import (
    FLAG_DATA_ERROR,
    FLAG_NO_REPLY,
    HEADER_STRUCT,
    NO_SESSION,
    OFFSET,
    REGISTRY,
    Header,
    decode_body,
    decode_header,
    encode_body,
    encode_header,
    frame_no_reply,
    frame_request_id,
    frame_type,
    with_flags,
    with_session,
    with_transport_error,
)
from smartcache.wire.errors import (
    BadBody,
    BadHeader,
    BodyTooLarge,
    ProtocolError,
    UnknownSystem,
    UnknownType,
    UnsupportedVersion,
)

type_ids = st.sampled_from(sorted(REGISTRY.types_by_id))
terr_codes = st.sampled_from(sorted(REGISTRY.transport_error_names))
valid_headers = st.builds(
    Header,
    version=st.just(REGISTRY.version),
    system=st.just(1),
    type=type_ids,
    transport_error=terr_codes,
    flags=st.integers(0, 3),
    lifetime_ms=st.integers(0, 2**32 - 1),
    request_id=st.integers(0, 2**64 - 1),
    session_id=st.binary(min_size=16, max_size=16),
)
leaves = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text() | st.binary()
)
values = st.recursive(
    leaves, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(), c, max_size=4), max_leaves=20
)
bodies = st.dictionaries(st.text(), values, max_size=6)


@given(valid_headers)
def test_every_valid_header_round_trips(h: Header) -> None:
    frame = encode_header(h)
    assert len(frame) == 36
    assert decode_header(frame) == h


@given(st.binary().filter(lambda b: len(b) != 36))
def test_header_of_wrong_size_is_bad_header(frame: bytes) -> None:
    with pytest.raises(BadHeader):
        decode_header(frame)


@given(valid_headers, st.integers(0, 255).filter(lambda v: v != REGISTRY.version))
def test_other_version_is_unsupported(h: Header, version: int) -> None:
    with pytest.raises(UnsupportedVersion) as e:
        decode_header(encode_header(h._replace(version=version)))
    assert e.value.header is not None
    assert e.value.header.request_id == h.request_id


@given(valid_headers, st.integers(0, 255).filter(lambda v: v != 1))
def test_other_system_is_unknown(h: Header, system: int) -> None:
    with pytest.raises(UnknownSystem):
        decode_header(encode_header(h._replace(system=system)))


@given(valid_headers, st.integers(0, 65535).filter(lambda v: v not in REGISTRY.types_by_id))
def test_unregistered_type_is_unknown(h: Header, type_id: int) -> None:
    with pytest.raises(UnknownType) as e:
        decode_header(encode_header(h._replace(type=type_id)))
    assert e.value.transport_error == "UNKNOWN_TYPE"


@given(valid_headers, st.integers(4, 255))
def test_reserved_flag_bits_are_bad_header(h: Header, flags: int) -> None:
    with pytest.raises(BadHeader):
        decode_header(encode_header(h._replace(flags=flags)))


@given(valid_headers, st.integers(1, 255))
def test_reserved_byte_is_bad_header(h: Header, reserved: int) -> None:
    frame = bytearray(encode_header(h))
    frame[7] = reserved
    with pytest.raises(BadHeader):
        decode_header(bytes(frame))


@given(valid_headers, st.integers(0, 65535).filter(lambda v: v not in REGISTRY.transport_error_names))
def test_unregistered_transport_error_is_bad_header(h: Header, terr: int) -> None:
    with pytest.raises(BadHeader):
        decode_header(encode_header(h._replace(transport_error=terr)))


@given(st.binary(min_size=36, max_size=36))
def test_any_36_bytes_decode_or_raise_a_protocol_error(frame: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode_header(frame)


@given(bodies)
def test_every_valid_body_round_trips(body: dict) -> None:
    assert decode_body(encode_body(body)) == body


def test_empty_frame_is_empty_map() -> None:
    assert decode_body(b"") == {}


@given(st.binary())
def test_arbitrary_bytes_decode_to_a_map_or_raise_bad_body(frame: bytes) -> None:
    with contextlib.suppress(BadBody):
        assert isinstance(decode_body(frame), dict)


@given(bodies.filter(bool), st.data())
def test_truncated_body_is_bad_body(body: dict, data: st.DataObject) -> None:
    frame = encode_body(body)
    cut = data.draw(st.integers(1, len(frame) - 1))
    with pytest.raises(BadBody):
        decode_body(frame[:cut])


@given(bodies, st.binary(min_size=1, max_size=8))
def test_trailing_bytes_are_bad_body(body: dict, extra: bytes) -> None:
    with pytest.raises(BadBody):
        decode_body(encode_body(body) + extra)


@given(values.filter(lambda v: not isinstance(v, dict)))
def test_non_map_body_is_bad_body(value: object) -> None:
    with pytest.raises(BadBody):
        decode_body(msgpack.packb(value, use_bin_type=True))


@given(st.integers(1, 64))
def test_body_deeper_than_limit_is_bad_body(extra: int) -> None:
    nested: object = {}
    for i in range(REGISTRY.max_depth + extra - 1):
        nested = {"k": nested} if i % 2 else [nested]
    with pytest.raises(BadBody):
        decode_body(encode_body({"k": nested}))


def test_body_at_depth_limit_is_accepted() -> None:
    nested: object = 1
    for _ in range(REGISTRY.max_depth - 1):
        nested = {"k": nested}
    assert decode_body(encode_body({"k": nested}))["k"] == nested


@given(st.integers(1, 1000) | st.binary(min_size=1, max_size=4) | st.booleans())
def test_non_string_keys_are_bad_body(key: object) -> None:
    with pytest.raises(BadBody):
        decode_body(msgpack.packb({"outer": {key: 1}}, use_bin_type=True))


def test_invalid_utf8_string_is_bad_body() -> None:
    with pytest.raises(BadBody):
        decode_body(b"\x81\xa1k\xa2\xff\xfe")


def test_extension_types_are_bad_body() -> None:
    with pytest.raises(BadBody):
        decode_body(msgpack.packb({"t": msgpack.ExtType(5, b"x")}))


@given(st.integers(1, 4096))
def test_oversized_body_is_body_too_large(limit: int) -> None:
    frame = encode_body({"data": b"x" * limit})
    with pytest.raises(BodyTooLarge):
        decode_body(frame, max_bytes=limit)


def test_header_built_only_from_the_spec_is_decoded() -> None:
    """A client that knows only PROTOCOL.md builds a header with struct, and the codec decodes it."""
    spec_layout = "!BBHHBBIQ16s"  # PROTOCOL.md: version, system, type, transport_error, flags, reserved,
    #                                lifetime_ms, request_id, session_id — network byte order, 36 bytes
    session = bytes(range(16))
    frame = struct.pack(spec_layout, 1, 1, 11, 0, 0, 0, 2500, 0xDEADBEEF, session)
    h = decode_header(frame)
    assert (h.type, h.lifetime_ms, h.request_id, h.session_id) == (11, 2500, 0xDEADBEEF, session)
    assert REGISTRY.types_by_id[h.type].name == "SESSION_GET"
    assert HEADER_STRUCT.size == 36


def test_reply_header_echoes_request_id_and_session() -> None:
    req = Header.request(REGISTRY.types["SESSION_GET"].id, request_id=42, session_id=b"s" * 16, lifetime_ms=9)
    rep = req.reply(transport_error=8, flags=1)
    assert (rep.request_id, rep.session_id, rep.type, rep.transport_error, rep.flags) == (42, b"s" * 16, req.type, 8, 1)


@given(bodies, st.integers(0, 2**34), st.data())
def test_a_timestamp_anywhere_in_a_body_is_bad_body(body: dict, seconds: int, data: st.DataObject) -> None:
    """msgpack decodes extension -1 itself (no ext_hook): the codec must still refuse it."""
    path = data.draw(st.lists(st.sampled_from(["map", "list"]), max_size=5))
    value: object = msgpack.Timestamp(seconds, 0)
    for kind in reversed(path):
        value = {"k": value} if kind == "map" else [1, value]
    with pytest.raises(BadBody):
        decode_body(msgpack.packb({**body, "data": value}, use_bin_type=True))


def test_arrays_count_toward_the_nesting_limit() -> None:
    nested: object = 1
    for _ in range(REGISTRY.max_depth):
        nested = [nested]
    with pytest.raises(BadBody):
        decode_body(encode_body({"k": nested}))


@given(valid_headers.filter(lambda h: h.transport_error == 0), terr_codes)
def test_error_patch_equals_a_decoded_reply(h: Header, terr: int) -> None:
    """The fast header patch gives the same frame as decoding, replying and encoding."""
    frame = with_transport_error(encode_header(h), terr)
    spec = REGISTRY.types_by_id[h.type]
    expected = h.reply(transport_error=terr, flags=FLAG_DATA_ERROR)
    if spec.creates_session:
        expected = expected._replace(session_id=NO_SESSION)
    assert decode_header(frame) == expected


@given(valid_headers, st.integers(0, 3), st.binary(min_size=16, max_size=16))
def test_flag_and_session_patches_change_only_their_field(h: Header, flags: int, sid: bytes) -> None:
    frame = encode_header(h)
    assert decode_header(with_flags(frame, flags)) == h._replace(flags=flags)
    assert decode_header(with_session(frame, sid)) == h._replace(session_id=sid)
    assert frame_request_id(frame) == h.request_id
    assert frame_type(frame) == h.type


@given(st.binary(max_size=40), valid_headers)
def test_no_reply_rule(frame: bytes, h: Header) -> None:
    """No answer exactly when a 36-byte frame has NO_REPLY set or addresses APP_START (PROTOCOL.md 4)."""
    assert not frame_no_reply(frame) or (len(frame) == HEADER_STRUCT.size)
    encoded = encode_header(h)
    app_start = h.type == REGISTRY.types["APP_START"].id
    assert frame_no_reply(encoded) == bool(h.flags & FLAG_NO_REPLY or app_start)


def test_header_offsets_match_the_spec_table() -> None:
    """PROTOCOL.md section 4: the offsets a client written from the spec uses."""
    assert OFFSET == {
        "version": 0,
        "system": 1,
        "type": 2,
        "transport_error": 4,
        "flags": 6,
        "reserved": 7,
        "lifetime_ms": 8,
        "request_id": 12,
        "session_id": 20,
    }


def test_every_client_message_type_has_a_typed_call_documented_from_the_registry() -> None:
    """help(Client) reads well: each call says what its type does, its statuses and what it returns."""
    import inspect

    from smartcache import AsyncClient, Client

    typed = {getattr(fn, "__sends__", None): name for name, fn in inspect.getmembers(Client, inspect.isfunction)}
    wanted = {t.name for t in REGISTRY.types.values() if not t.internal}
    own = {"APP_START": "app_start", "EVENT_PUBLISH": "event_publish", "EVENTS_READ": "subscribe"}
    assert wanted - set(typed) - set(own) == set()
    for type_name, name in typed.items():
        if type_name is None:
            continue
        for cls, returns in ((Client, "Reply"), (AsyncClient, "asyncio.Future[Reply]")):
            fn = getattr(cls, name)
            assert fn.__doc__.startswith(f"{type_name}: {REGISTRY.types[type_name].doc}")
            assert inspect.signature(fn).return_annotation == returns, (cls, name)


def test_the_status_enums_are_the_registry_s_names_and_codes() -> None:
    from smartcache import Status, TransportError

    assert {s.value: s.code for s in Status if s is not Status.UNKNOWN} == {
        n: c for n, c in REGISTRY.statuses.items() if n not in REGISTRY.storage_only_statuses
    }
    assert {e.value: e.code for e in TransportError if e is not TransportError.TIMEOUT} == dict(
        REGISTRY.transport_errors
    )
