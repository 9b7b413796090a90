"""Buckets (service/smartcache/wire/buckets.py) against proto/vectors/buckets.json, which the Lua side is tested against
too (tests/lua/buckets_test.lua): the service and storage must agree on every key's bucket."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smartcache.wire import buckets

VECTORS = json.loads((Path(__file__).parents[2] / "proto" / "vectors" / "buckets.json").read_text())


def test_crc32c_has_its_check_value() -> None:
    assert buckets.crc32c(VECTORS["check"]["input"].encode()) == VECTORS["check"]["crc32c"] == 0xE3069283


@pytest.mark.parametrize("vec", VECTORS["keys"], ids=lambda v: v["key"][:20] or "empty")
def test_a_key_s_bucket_is_its_crc32c_mod_the_count(vec: dict[str, Any]) -> None:
    assert buckets.crc32c(vec["key"].encode()) == vec["crc32c"]
    for count, bucket in vec["buckets"].items():
        assert buckets.bucket_of(vec["key"], int(count)) == bucket


@pytest.mark.parametrize("vec", VECTORS["session_ids"], ids=lambda v: v["id"])
def test_a_session_id_says_its_bucket_or_none_before_sharding(vec: dict[str, Any]) -> None:
    assert buckets.session_bucket(uuid.UUID(vec["id"]).bytes) == vec["bucket"]


@given(st.binary(min_size=16, max_size=16), st.integers(0, buckets.MAX_BUCKETS - 1))
def test_an_id_made_with_a_bucket_is_a_version_8_uuid_that_carries_it(random16: bytes, bucket: int) -> None:
    sid = buckets.session_id_with_bucket(random16, bucket)
    u = uuid.UUID(bytes=sid)
    assert (u.version, u.variant) == (8, uuid.RFC_4122)
    assert buckets.session_bucket(sid) == bucket
    assert sid[2:6] == random16[2:6]


def test_a_version_4_id_carries_no_bucket() -> None:
    for _ in range(100):
        assert buckets.session_bucket(uuid.UUID(bytes=os.urandom(16), version=4).bytes) is None


def test_bad_counts_and_ids_are_refused() -> None:
    with pytest.raises(ValueError, match=r"1\.\.65536 buckets"):
        buckets.bucket_of("c", 0)
    with pytest.raises(ValueError, match="16 bytes"):
        buckets.session_bucket(b"short")
