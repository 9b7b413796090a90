"""Routing by bucket (service/smartcache/server/storage/bucketmap.py, shards.py): the bucket map, each call's bucket
by the rules storage applies (checked against lua/smartcache/api.lua's ROUTE), and a stale map costing retries, never
a misplaced call."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from smartcache.server.storage import bucketmap, shards
from smartcache.server.storage.bucketmap import BucketMap, bucket_of_call
from smartcache.server.storage.shards import ShardedStorage, ShardError
from smartcache.wire import buckets

ROOT = Path(__file__).resolve().parents[2]


def a_map(version: int, ranges: list[list[Any]], count: int = 16) -> BucketMap:
    return BucketMap.parse(json.dumps({"version": version, "buckets": count, "shards": ["s1", "s2"], "ranges": ranges}))


def test_the_map_names_one_shard_for_every_bucket() -> None:
    m = a_map(3, [[8, 15, "s2"], [0, 7, "s1"]])
    assert (m.version, m.buckets, m.shards) == (3, 16, ("s1", "s2"))
    assert [m.shard_of(b) for b in (0, 7, 8, 15)] == ["s1", "s1", "s2", "s2"]


@pytest.mark.parametrize(
    ("ranges", "message"),
    [
        ([[0, 7, "s1"]], "leave buckets 8..15 without a shard"),
        ([[0, 7, "s1"], [7, 15, "s2"]], "cover buckets 0..15 once"),
        ([[0, 7, "s1"], [9, 15, "s2"]], "cover buckets 0..15 once"),
        ([[0, 15, "s3"]], "names a shard the map does not list"),
        ([[0, 15]], "a range is [first, last, shard]"),
    ],
)
def test_a_map_that_leaves_a_bucket_without_one_owner_is_refused(ranges: list[list[Any]], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        a_map(1, ranges)


def test_a_call_s_bucket_comes_from_its_own_arguments() -> None:
    v8 = str(uuid.UUID(bytes=buckets.session_id_with_bucket(bytes(16), 5)))
    assert bucket_of_call("session_get", [v8], 16) == 5
    assert bucket_of_call("session_get", [str(uuid.uuid4())], 16) is None  # made before sharding
    assert bucket_of_call("session_create", [None, "client-7"], 16) == buckets.bucket_of("client-7", 16)
    assert bucket_of_call("cache_get", [v8, "k"], 16) == 5
    assert bucket_of_call("cache_get", ["", "otp:7"], 16) == buckets.bucket_of("otp:7", 16)
    assert bucket_of_call("counter_add", ["c", 1], 16) == buckets.bucket_of("c", 16)
    assert bucket_of_call("event_publish", ["app.x", None, None], 16) is None
    assert bucket_of_call("ping", [], 16) is None
    assert bucket_of_call("session_delete", [v8, None, None, None], 16) == 5
    handle_delete = [None, None, "h" + "a" * 26, "client-7"]  # by handle: its client's bucket
    assert bucket_of_call("session_delete", handle_delete, 16) == buckets.bucket_of("client-7", 16)
    assert bucket_of_call("session_rekey", [v8, v8], 16) == 5


def test_the_service_routes_every_procedure_as_storage_checks_it() -> None:
    """Python's ROUTE against the Lua one (api.lua's M.ROUTE): a difference would send calls to a shard that
    refuses them every time."""
    lua = (ROOT / "lua" / "smartcache" / "api.lua").read_text()
    table = lua[lua.index("M.ROUTE = {") : lua.index("}", lua.index("M.ROUTE = {"))]
    rules = {"first_session": ("session", 0), "first_key": ("key", 0), "create_call": ("key", 1)}
    rules |= {"cache_call": ("cache", 0), "published": ("key", 1), "delete_call": ("delete", 0)}
    in_lua = {name: rules[rule] for name, rule in re.findall(r"(\w+) = (\w+)", table)}
    assert in_lua == dict(bucketmap.ROUTE)


class FakeShard:
    """A shard's storage that answers WRONG_BUCKET for the buckets it does not hold; ``sessions`` are version 4
    ids it has, with their client's bucket."""

    def __init__(self, name: str, holds: set[int], sessions: dict[str, int] | None = None) -> None:
        self.name, self.holds, self.calls = name, holds, []
        self.sessions = sessions or {}

    async def call(
        self, procedure: str, args: list[Any], *, job: Any, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        self.calls.append(procedure)
        if procedure == "session_locate":
            found = self.sessions.get(args[0])
            return {"status": "NOT_FOUND"} if found is None else {"status": "OK", "bucket": found}
        bucket = bucket_of_call(procedure, args, 16)
        if bucket is None and args and args[0] in self.sessions:
            bucket = self.sessions[args[0]]
        if bucket is not None and bucket not in self.holds:
            return {"status": "WRONG_BUCKET", "bucket": bucket}
        return {"status": "OK", "shard": self.name}


def test_a_stale_map_costs_a_retry_and_the_call_lands_where_its_bucket_is() -> None:
    key = next(f"c{i}" for i in range(100) if buckets.bucket_of(f"c{i}", 16) < 8)  # moved from s1 to s2
    s1, s2 = FakeShard("s1", set(range(8, 16))), FakeShard("s2", set(range(8)))
    fresh = a_map(2, [[0, 7, "s2"], [8, 15, "s1"]])

    async def refresh() -> BucketMap:
        return fresh

    router = ShardedStorage({"s1": s1, "s2": s2}, a_map(1, [[0, 7, "s1"], [8, 15, "s2"]]), refresh)
    result = asyncio.run(router.call("counter_add", [key, 1], job=None))
    assert result == {"status": "OK", "shard": "s2"}
    assert (s1.calls, s2.calls) == (["counter_add"], ["counter_add"])  # refused there, done here, once
    assert (router.refreshes, router.wrong_buckets, router.map.version) == (1, 1, 2)


def test_refusals_that_go_on_end_in_an_error_not_a_loop() -> None:
    s1, s2 = FakeShard("s1", set()), FakeShard("s2", set())  # nobody holds anything (a move in flight)
    stale = a_map(1, [[0, 7, "s1"], [8, 15, "s2"]])

    async def refresh() -> BucketMap:
        return stale

    router = ShardedStorage({"s1": s1, "s2": s2}, stale, refresh)
    with pytest.raises(ShardError, match="refused by shard"):
        asyncio.run(router.call("counter_get", ["c"], job=None))
    assert router.wrong_buckets == shards.WRONG_BUCKET_RETRIES + 1


def test_a_session_id_made_before_sharding_is_located_once_and_then_routed_with_no_lookup() -> None:
    old = str(uuid.uuid4())
    s1, s2 = FakeShard("s1", set(range(8))), FakeShard("s2", set(range(8, 16)), sessions={old: 12})

    async def refresh() -> BucketMap:
        raise AssertionError("the map is right: no refusal, no refresh")

    router = ShardedStorage({"s1": s1, "s2": s2}, a_map(1, [[0, 7, "s1"], [8, 15, "s2"]]), refresh)

    async def twice() -> list[dict[str, Any]]:
        return [await router.call("session_get", [old], job=None), await router.call("cache_get", [old, "k"], job=None)]

    assert [r["shard"] for r in asyncio.run(twice())] == ["s2", "s2"]
    assert s1.calls == ["session_locate"]  # asked once, answered NOT_FOUND; nothing else sent there
    assert s2.calls == ["session_locate", "session_get", "cache_get"]


class MovingShard(FakeShard):
    """A shard whose bucket is paused for `paused` calls (BUCKET_MOVING), then refused naming `owner`."""

    def __init__(self, name: str, holds: set[int], paused: int, owner: str | None = None) -> None:
        super().__init__(name, holds)
        self.paused, self.owner = paused, owner

    async def call(
        self, procedure: str, args: list[Any], *, job: Any, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        bucket = bucket_of_call(procedure, args, 16)
        if bucket in self.holds and self.paused > 0:
            self.paused -= 1
            self.calls.append(procedure)
            return {"status": "BUCKET_MOVING", "bucket": bucket}
        if bucket in self.holds and self.owner is not None:
            self.calls.append(procedure)
            return {"status": "WRONG_BUCKET", "bucket": bucket, "owner": self.owner}
        return await super().call(procedure, args, job=job, idempotency_key=idempotency_key)


def test_a_paused_bucket_is_asked_again_after_a_backoff_then_the_owner_a_refusal_names_with_no_map_read() -> None:
    key = next(f"c{i}" for i in range(100) if buckets.bucket_of(f"c{i}", 16) < 8)
    s1 = MovingShard("s1", set(range(8)), paused=3, owner="s2")  # paused 3 times, then sent to s2
    s2 = FakeShard("s2", set(range(16)))

    async def refresh() -> BucketMap:
        raise AssertionError("the refusal named the owner: no map read")

    router = ShardedStorage({"s1": s1, "s2": s2}, a_map(1, [[0, 7, "s1"], [8, 15, "s2"]]), refresh)
    result = asyncio.run(router.call("counter_add", [key, 1], job=None))
    assert result == {"status": "OK", "shard": "s2"}
    assert s1.calls == ["counter_add"] * 4  # paused three times, then refused naming s2
    assert s2.calls == ["counter_add"]
    assert router.moving_waits == 3
    assert asyncio.run(router.call("counter_get", [key], job=None))["shard"] == "s2"  # remembered: straight there
    assert s1.calls == ["counter_add"] * 4
    router.use(a_map(2, [[0, 15, "s2"]]))  # the map caught up: the remembered owner goes
    assert not router._moved


def test_a_bucket_paused_past_the_deadline_ends_in_an_error_not_executed() -> None:
    key = next(f"c{i}" for i in range(100) if buckets.bucket_of(f"c{i}", 16) < 8)
    s1 = MovingShard("s1", set(range(8)), paused=10**6)

    class Deadline:
        deadline = __import__("time").monotonic() + 0.1

    async def refresh() -> BucketMap:
        raise AssertionError("no refusal")

    router = ShardedStorage({"s1": s1, "s2": FakeShard("s2", set())}, a_map(1, [[0, 7, "s1"], [8, 15, "s2"]]), refresh)
    with pytest.raises(ShardError, match="still moving at the deadline"):
        asyncio.run(router.call("counter_add", [key, 1], job=Deadline()))  # type: ignore[arg-type]
    assert 2 <= router.moving_waits < 20  # backed off, not spun
