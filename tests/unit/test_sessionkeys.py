"""Stored ids and handles (smartcache.wire.sessionkeys) agree with proto/vectors/sessions.json and keep promises."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smartcache.client.base import session_bytes
from smartcache.wire import sessionkeys as sk
from smartcache.wire.buckets import session_bucket

VECTORS = json.loads((Path(__file__).parents[2] / "proto" / "vectors" / "sessions.json").read_text())

keys = st.binary(min_size=32, max_size=32)
raw_ids = st.binary(min_size=16, max_size=16).filter(any)
buckets = st.none() | st.integers(0, 65535)


@pytest.mark.parametrize("vec", VECTORS["sessions"], ids=lambda v: v["name"])
def test_each_vector_derives_its_stored_id_and_handle(vec: dict[str, Any]) -> None:
    key, raw = bytes.fromhex(vec["key"]), bytes.fromhex(vec["raw"])
    stored = sk.derive(key, raw)
    assert str(uuid.UUID(bytes=stored)) == vec["stored"]
    assert sk.handle(stored) == vec["handle"]
    assert sk.stored_of(vec["handle"]) == stored
    assert session_bucket(stored) == session_bucket(raw) == vec["bucket"]


@pytest.mark.parametrize("vec", VECTORS["keys"], ids=lambda v: v["key_id"])
def test_each_vector_key_has_its_key_id(vec: dict[str, str]) -> None:
    key = bytes.fromhex(vec["key"])
    assert sk.key_id(key) == sk.SessionKey(key).id == vec["key_id"]
    assert sk.key_from_hex(vec["key"]) == key


@pytest.mark.parametrize("vec", VECTORS["keyed"], ids=lambda v: v["name"])
def test_a_keyed_request_makes_the_vector_s_raw_id(vec: dict[str, Any]) -> None:
    raw = sk.keyed_raw_id(
        bytes.fromhex(vec["key"]), vec["bucket"], vec["type"], bytes.fromhex(vec["scope"]), vec["idempotency_key"]
    )
    assert raw.hex() == vec["raw"]
    assert session_bucket(raw) == vec["bucket"]


@pytest.mark.parametrize("vec", VECTORS["not_handles"], ids=lambda v: v["why"])
def test_a_handle_parser_refuses_each_vector_non_handle(vec: dict[str, str]) -> None:
    with pytest.raises(sk.NotAHandle):
        sk.stored_of(vec["value"])
    assert not sk.is_handle(vec["value"])


def test_the_vectors_cover_versions_4_and_8_a_zero_bucket_and_two_keys() -> None:
    sessions = VECTORS["sessions"]
    assert {s["key"] for s in sessions} == {k["key"] for k in VECTORS["keys"]}
    assert len(VECTORS["keys"]) >= 2
    versions = {uuid.UUID(s["raw_uuid"]).version for s in sessions}
    assert {4, 8} <= versions
    assert any(s["bucket"] == 0 for s in sessions)


# -- properties -----------------------------------------------------------------------------------------


@given(keys, raw_ids)
def test_derive_keeps_the_version_the_variant_and_a_version_8_id_s_bucket(key: bytes, raw: bytes) -> None:
    stored = sk.derive(key, raw)
    assert len(stored) == 16
    assert stored[6] >> 4 == raw[6] >> 4
    assert stored[8] >> 6 == raw[8] >> 6
    assert session_bucket(stored) == session_bucket(raw)
    assert sk.SessionKey(key).derive(raw) == stored


@given(keys, buckets)
def test_a_new_id_is_version_4_or_version_8_with_its_bucket_and_derives_alike(key: bytes, bucket: int | None) -> None:
    raw = sk.new_raw_id(bucket)
    assert uuid.UUID(bytes=raw).version == (4 if bucket is None else 8)
    assert uuid.UUID(bytes=raw).variant == uuid.RFC_4122
    assert session_bucket(raw) == bucket
    assert session_bucket(sk.derive(key, raw)) == bucket


@given(keys, buckets, st.text(max_size=40), st.text(min_size=1, max_size=64))
def test_a_keyed_id_is_the_same_for_a_repeat_and_another_for_another_key(
    key: bytes, bucket: int | None, client_id: str, idempotency_key: str
) -> None:
    first = sk.keyed_raw_id(key, bucket, "SESSION_CREATE", client_id, idempotency_key)
    assert sk.keyed_raw_id(key, bucket, "SESSION_CREATE", client_id, idempotency_key) == first
    assert sk.keyed_raw_id(key, bucket, "SESSION_CREATE", client_id, idempotency_key + "x") != first
    assert sk.keyed_raw_id(key, bucket, "SESSION_ROTATE", client_id, idempotency_key) != first
    assert session_bucket(first) == bucket


@given(st.binary(min_size=16, max_size=16))
def test_a_handle_round_trips_and_is_27_lowercase_base32_characters(stored: bytes) -> None:
    h = sk.handle(stored)
    assert len(h) == sk.HANDLE_CHARS
    assert h.startswith("h")
    assert set(h[1:]) <= set("abcdefghijklmnopqrstuvwxyz234567")
    assert sk.stored_of(h) == stored
    assert sk.is_handle(h)


@given(keys, raw_ids)
def test_a_handle_is_never_a_session_id(key: bytes, raw: bytes) -> None:
    """Not as the client takes one (text, bytes), and its 16 bytes sent as an id name another stored id."""
    stored = sk.derive(key, raw)
    h = sk.handle(stored)
    with pytest.raises(ValueError, match="handle"):
        session_bytes(h)
    with pytest.raises(ValueError, match="16 bytes"):
        session_bytes(h.encode())
    with pytest.raises(ValueError, match="badly formed"):
        uuid.UUID(h)
    assert sk.derive(key, sk.stored_of(h)) != stored


@given(st.text(max_size=40))
def test_any_text_is_a_handle_or_refused_with_why(value: str) -> None:
    if sk.is_handle(value):
        assert sk.handle(sk.stored_of(value)) == value
    else:
        with pytest.raises(sk.NotAHandle, match="a handle"):
            sk.stored_of(value)


@given(st.binary(min_size=16, max_size=16), st.data())
def test_a_handle_with_one_character_changed_is_another_handle_or_refused(stored: bytes, data: st.DataObject) -> None:
    h = sk.handle(stored)
    i = data.draw(st.integers(0, len(h) - 1))
    c = data.draw(st.characters(codec="ascii").filter(lambda c: c != h[i]))
    changed = h[:i] + c + h[i + 1 :]
    try:
        other = sk.stored_of(changed)
    except sk.NotAHandle:
        return
    assert other != stored


def test_derive_refuses_a_short_key_a_short_id_and_the_zero_id() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        sk.derive(bytes(31), bytes(range(1, 17)))
    with pytest.raises(ValueError, match="16 bytes"):
        sk.derive(bytes(32), bytes(15))
    with pytest.raises(ValueError, match="zero session id"):
        sk.derive(bytes(32), bytes(16))


def test_stored_of_says_what_is_wrong() -> None:
    h = sk.handle(bytes(range(16)))
    sid = "6f1c2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b"
    for value, why in (
        (sid, "is a session id"),
        (h.upper(), "lowercase"),
        ("x" + h[1:], "starts with 'h'"),
        (h[:-1], "27 characters, not 26"),
        (h[:-1] + "1", "'1' at 26 is not lowercase base32"),
        (h[:-1] + "b", "spare bits"),
    ):
        with pytest.raises(sk.NotAHandle, match=why):
            sk.stored_of(value)
    with pytest.raises(sk.NotAHandle, match="a handle is a str"):
        sk.stored_of(b"h" * 27)  # type: ignore[arg-type]


def test_a_key_is_64_hex_characters_and_the_error_never_shows_it() -> None:
    assert sk.key_from_hex(" " + "ab" * 32 + "\n") == bytes([0xAB]) * 32
    for bad in ("ab" * 31, "zz" * 32, "ab" * 33):
        with pytest.raises(ValueError, match="64 hex characters") as e:
            sk.key_from_hex(bad)
        assert bad not in str(e.value)
    assert "ab" * 32 not in repr(sk.SessionKey(bytes([0xAB]) * 32))


def test_a_binding_is_kept_as_the_sha256_hex_of_its_utf8() -> None:
    assert sk.binding_digest("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"  # FIPS 180-2
