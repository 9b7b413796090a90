"""The near cache's rules without I/O: what a reply's position lets it keep, what each event drops, when a
shard's copies are served, LRU, local expiry and the touches (service/smartcache/client/nearcache.py)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from smartcache.client import NearCache, Reply, nearcache
from smartcache.client.nearcache import DEVICE, SESSION
from smartcache.client.nearfollow import through
from smartcache.wire import REGISTRY, Header


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def v8(bucket: int) -> bytes:
    b = bytearray(uuid.uuid4().bytes)
    b[0:2] = bucket.to_bytes(2, "big")
    b[6] = (b[6] & 0x0F) | 0x80
    b[8] = (b[8] & 0x3F) | 0x80
    return bytes(b)


def reply(seq: int | None, handle: str = "ha", shard: str = "", **extra: Any) -> Reply:
    body: dict[str, Any] = {
        "status": 0,
        "client_id": "c-1",
        "version": "1",
        "data": {"step": 1},
        "rev": 1,
        "updated_at_ms": 1,
        "expires_in_ms": 600_000,
        "absolute_expires_in_ms": 3_600_000,
        "handle": handle,
        "refresh_in_ms": 60_000,
        **extra,
    }
    if seq is not None:
        body["seq"] = seq
    if shard:
        body["shard"] = shard
    header = Header.request(REGISTRY.types["SESSION_GET"].id, request_id=1, session_id=bytes(16), lifetime_ms=0)
    return Reply(header, body)


def following(cache: NearCache, clock: Clock, shard: str = "", at: int = 10) -> None:
    """The follower started shard's stream at `at` and a publisher just showed it current."""
    cache.start_stream(shard, at)
    cache.stream_state(shard, current=True, heard_at=clock.now)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cache(clock: Clock) -> NearCache:
    c = NearCache(publishers="inproc://none", max_lag_s=2.0, ring_events=8, clock=clock)
    following(c, clock)
    return c


SID = v8(7)
KEY = (SID, None)


def test_a_read_after_a_miss_is_a_hit_with_its_deadlines_counted_down(cache: NearCache, clock: Clock) -> None:
    assert cache.lookup(KEY) is None
    assert cache.offer(SESSION, KEY, reply(10), clock.now)
    clock.now += 1.0
    hit = cache.lookup(KEY)
    assert hit is not None
    assert hit.near
    assert hit.body["data"] == {"step": 1}
    assert hit.body["expires_in_ms"] == 599_000
    assert hit.body["absolute_expires_in_ms"] == 3_599_000
    assert "seq" not in hit.body
    assert "shard" not in hit.body
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["entries"]) == (1, 1, 1)


def test_a_hit_is_a_copy_that_a_caller_may_change(cache: NearCache, clock: Clock) -> None:
    cache.offer(SESSION, KEY, reply(10), clock.now)
    first = cache.lookup(KEY)
    assert first is not None
    first.body["data"]["step"] = 99
    again = cache.lookup(KEY)
    assert again is not None
    assert again.body["data"] == {"step": 1}


def test_another_binding_is_another_entry(cache: NearCache, clock: Clock) -> None:
    cache.offer(SESSION, (SID, "dev-1"), reply(10), clock.now)
    assert cache.lookup((SID, "dev-2")) is None
    assert cache.lookup((SID, None)) is None
    assert cache.lookup((SID, "dev-1")) is not None


def test_an_event_of_the_session_after_the_read_drops_it_and_one_before_does_not(
    cache: NearCache, clock: Clock
) -> None:
    cache.offer(SESSION, KEY, reply(12), clock.now)
    cache.apply("", 11, "session.updated", "ha", {})
    cache.apply("", 12, "session.updated", "ha", {})
    assert cache.lookup(KEY) is not None  # both are in the state the read answered
    cache.apply("", 13, "session.updated", "hb", {})
    assert cache.lookup(KEY) is not None  # another session
    cache.apply("", 14, "session.deleted", "ha", {})
    assert cache.lookup(KEY) is None
    assert cache.stats()["invalidations"] == 1


@pytest.mark.parametrize("topic", ["session.updated", "session.deleted", "session.expired", "session.evicted"])
def test_each_session_event_drops_the_copy(cache: NearCache, clock: Clock, topic: str) -> None:
    cache.offer(SESSION, KEY, reply(10), clock.now)
    cache.apply("", 11, topic, "ha", {"client_id": "c-1"})
    assert cache.lookup(KEY) is None


def test_a_rotation_drops_the_old_handle_named_in_its_payload(cache: NearCache, clock: Clock) -> None:
    cache.offer(SESSION, KEY, reply(10), clock.now)
    cache.apply("", 11, "session.rotated", "hnew", {"client_id": "c-1", "old_handle": "ha"})
    assert cache.lookup(KEY) is None


def test_an_invalidation_that_overtook_the_reply_keeps_it_out(cache: NearCache, clock: Clock) -> None:
    """The read answered at seq 10; the stream applied 11 (this session) before the reply came: not kept."""
    cache.apply("", 11, "session.updated", "ha", {})
    assert not cache.offer(SESSION, KEY, reply(10), clock.now)
    assert cache.lookup(KEY) is None
    assert cache.stats()["not_kept"] == 1


def test_a_reply_overtaken_by_events_of_others_only_is_kept(cache: NearCache, clock: Clock) -> None:
    for seq in (11, 12, 13):
        cache.apply("", seq, "session.updated", f"h{seq}", {})
    assert cache.offer(SESSION, KEY, reply(10), clock.now)
    assert cache.lookup(KEY) is not None


def test_a_reply_older_than_the_ring_is_not_kept(cache: NearCache, clock: Clock) -> None:
    for seq in range(11, 21):  # ring of 8: it reaches back to 12
        cache.apply("", seq, "app.x", "", None)
    assert not cache.offer(SESSION, KEY, reply(11), clock.now)
    assert cache.offer(SESSION, KEY, reply(12), clock.now)


def test_a_reply_without_a_position_or_of_an_old_id_or_without_a_refresh_is_not_kept(
    cache: NearCache, clock: Clock
) -> None:
    assert not cache.offer(SESSION, KEY, reply(None), clock.now)
    assert not cache.offer(SESSION, KEY, reply(10, rotated=True), clock.now)
    assert not cache.offer(SESSION, KEY, reply(10, refresh_failed=True), clock.now)
    assert not cache.offer(SESSION, KEY, reply(10, handle="rlegacyname"), clock.now)
    assert cache.stats()["entries"] == 0


def test_a_silent_stream_stops_serving_until_a_publisher_shows_it_current(cache: NearCache, clock: Clock) -> None:
    cache.offer(SESSION, KEY, reply(10), clock.now)
    clock.now += 2.5
    assert cache.lookup(KEY) is None
    assert cache.stats()["not_served_stale"] == 1
    assert not cache.offer(SESSION, (v8(1), None), reply(10, handle="hz"), clock.now)  # nor kept
    cache.stream_state("", current=True, heard_at=clock.now)
    assert cache.lookup(KEY) is not None


def test_a_gap_stops_serving_and_the_catch_up_drops_only_what_the_missing_events_touched(
    cache: NearCache, clock: Clock
) -> None:
    other = (v8(8), None)
    cache.offer(SESSION, KEY, reply(10), clock.now)
    cache.offer(SESSION, other, reply(10, handle="hother"), clock.now)
    cache.stream_state("", current=False, heard_at=clock.now)  # a gap: 11..13 missing
    assert cache.lookup(KEY) is None
    assert cache.lookup(other) is None
    for seq, handle in ((11, "hx"), (12, "ha"), (13, "hy")):  # the catch-up applies them in order
        cache.apply("", seq, "session.updated", handle, {})
    clock.now += 0.1
    cache.stream_state("", current=True, heard_at=clock.now)
    assert cache.lookup(KEY) is None
    assert cache.lookup(other) is not None
    assert cache.stats()["gaps"] == 1


def test_a_disconnect_stops_serving_until_a_later_proof(cache: NearCache, clock: Clock) -> None:
    cache.offer(SESSION, KEY, reply(10), clock.now)
    heard = clock.now
    clock.now += 0.1
    cache.disconnected()
    cache.stream_state("", current=True, heard_at=heard)  # what the stream showed before the disconnect
    assert cache.lookup(KEY) is None
    clock.now += 0.1
    cache.stream_state("", current=True, heard_at=clock.now)
    assert cache.lookup(KEY) is not None


def test_a_bucket_sent_drops_that_buckets_entries_of_its_shard_only(clock: Clock) -> None:
    cache = NearCache(publishers="inproc://none", clock=clock)
    following(cache, clock, "s1")
    following(cache, clock, "s2")
    seven, eight, elsewhere = (v8(7), None), (v8(8), None), (v8(7), None)
    cache.offer(SESSION, seven, reply(10, handle="h7", shard="s1"), clock.now)
    cache.offer(SESSION, eight, reply(10, handle="h8", shard="s1"), clock.now)
    cache.offer(SESSION, elsewhere, reply(10, handle="h7b", shard="s2"), clock.now)
    cache.apply("s1", 11, "bucket.sent", "7", {"bucket": 7, "to": "s2", "generation": 1})
    assert cache.lookup(seven) is None
    assert cache.lookup(eight) is not None
    assert cache.lookup(elsewhere) is not None


def test_a_move_between_the_read_and_its_reply_keeps_it_out(cache: NearCache, clock: Clock) -> None:
    cache.apply("", 11, "bucket.sent", "3", {"bucket": 3})
    assert not cache.offer(SESSION, KEY, reply(10), clock.now)


def test_sequences_of_two_shards_are_never_compared(clock: Clock) -> None:
    """A session read from s2 (after a move) is dropped by its event in s1's log whatever the numbers."""
    cache = NearCache(publishers="inproc://none", clock=clock)
    following(cache, clock, "s1", at=5)
    following(cache, clock, "s2", at=500)
    cache.offer(SESSION, KEY, reply(500, shard="s2"), clock.now)
    cache.apply("s1", 6, "session.updated", "ha", {})
    assert cache.lookup(KEY) is None


def test_a_log_that_went_back_drops_its_shard(cache: NearCache, clock: Clock) -> None:
    cache.offer(SESSION, KEY, reply(10), clock.now)
    cache.apply("", 9, "app.x", "", None)
    assert cache.stats()["entries"] == 0


def test_lru_by_entries_and_by_bytes(clock: Clock) -> None:
    cache = NearCache(publishers="inproc://none", max_entries=2, clock=clock)
    following(cache, clock)
    keys = [(v8(i), None) for i in range(3)]
    cache.offer(SESSION, keys[0], reply(10, handle="h0"), clock.now)
    cache.offer(SESSION, keys[1], reply(10, handle="h1"), clock.now)
    assert cache.lookup(keys[0]) is not None  # 0 used last: 1 is the least recently used
    cache.offer(SESSION, keys[2], reply(10, handle="h2"), clock.now)
    assert cache.lookup(keys[1]) is None
    assert cache.lookup(keys[0]) is not None
    assert cache.lookup(keys[2]) is not None

    small = NearCache(publishers="inproc://none", max_bytes=700, clock=clock)
    following(small, clock)
    for i in range(3):
        small.offer(SESSION, keys[i], reply(10, handle=f"h{i}"), clock.now)
    stats = small.stats()
    assert stats["bytes"] <= 700
    assert stats["entries"] < 3
    assert stats["evictions"] >= 1


def test_idle_and_absolute_deadlines_are_checked_locally(cache: NearCache, clock: Clock) -> None:
    cache.offer(SESSION, KEY, reply(10, expires_in_ms=5_000, refresh_in_ms=None), clock.now)
    clock.now += 1
    cache.stream_state("", current=True, heard_at=clock.now)
    assert cache.lookup(KEY) is not None
    clock.now += 4.5
    cache.stream_state("", current=True, heard_at=clock.now)
    assert cache.lookup(KEY) is None
    cache.offer(SESSION, KEY, reply(10, absolute_expires_in_ms=1_000, refresh_in_ms=None), clock.now)
    clock.now += 1.5
    cache.stream_state("", current=True, heard_at=clock.now)
    assert cache.lookup(KEY) is None
    assert cache.stats()["expired"] == 2


def test_a_hit_after_the_refresh_time_asks_one_touch_whose_answer_moves_the_deadlines(
    cache: NearCache, clock: Clock
) -> None:
    cache.offer(SESSION, KEY, reply(10, expires_in_ms=10_000, refresh_in_ms=1_000), clock.now)
    assert cache.lookup(KEY) is not None
    assert cache.take_touches() == []
    clock.now += 1.5
    cache.stream_state("", current=True, heard_at=clock.now)
    assert cache.lookup(KEY) is not None
    assert cache.lookup(KEY) is not None
    (touch,) = cache.take_touches()
    assert touch.key == KEY
    assert cache.take_touches() == []  # once, until answered
    cache.touched(
        KEY, clock.now, {"expires_in_ms": 10_000, "absolute_expires_in_ms": 3_000_000, "refresh_in_ms": 1_000}
    )
    clock.now += 9.0
    cache.stream_state("", current=True, heard_at=clock.now)
    assert cache.lookup(KEY) is not None  # the idle deadline moved with the touch
    cache.touched(KEY, clock.now, None)  # NOT_FOUND: gone
    assert cache.lookup(KEY) is None


def test_devices_are_dropped_by_their_binding_event(cache: NearCache, clock: Clock) -> None:
    r = reply(10)
    body = {"status": 0, "client_id": "c-1", "updated_at_ms": 1, "seq": 10}
    assert cache.offer(DEVICE, "dev-1", Reply(r.header, body), clock.now)
    assert cache.lookup("dev-1") is not None
    cache.apply("", 11, "device.bound", "dev-1", {"client_id": "c-2"})
    assert cache.lookup("dev-1") is None


def test_this_clients_own_writes_drop_its_copy_before_they_are_sent(cache: NearCache, clock: Clock) -> None:
    sent: list[str] = []

    def send(type_name: str, body: Any, *, session_id: Any = None, **_: Any) -> Reply:
        sent.append(type_name)
        return reply(10)

    assert through(cache, send, "SESSION_GET", {}, SID).ok
    assert through(cache, send, "SESSION_GET", {}, SID).ok
    assert sent == ["SESSION_GET"]  # the second was a hit
    through(cache, send, "SESSION_UPDATE", {"data": 1}, SID)
    through(cache, send, "SESSION_GET", {}, SID)
    assert sent == ["SESSION_GET", "SESSION_UPDATE", "SESSION_GET"]
    through(cache, send, "SESSION_DELETE_CLIENT", {"client_id": "c-1"}, None)
    through(cache, send, "SESSION_GET", {}, SID)
    assert sent[-1] == "SESSION_GET"
    assert len(sent) == 5


def test_a_cache_without_an_events_endpoint_is_disabled_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    cache = NearCache()
    cache.disable("no events endpoint given")
    cache.disable("no events endpoint given")
    assert not cache.stats()["enabled"]
    assert [r.getMessage() for r in caplog.records].count(
        "near_cache_disabled: no events endpoint given; every read goes to the service"
    ) == 1


def test_a_gap_found_stops_serving_at_once_though_the_stream_was_heard_just_now(cache: NearCache, clock: Clock) -> None:
    cache.offer(SESSION, KEY, reply(10), clock.now)
    cache.gap("")
    assert cache.lookup(KEY) is None
    assert cache.stats()["gaps"] == 1
    cache.apply("", 11, "session.updated", "hother", {})  # the catch-up: nothing of this session
    cache.stream_state("", current=True, heard_at=clock.now)
    assert cache.lookup(KEY) is not None


def test_a_reply_to_a_read_sent_before_this_clients_own_write_is_not_kept(cache: NearCache, clock: Clock) -> None:
    """Another thread's read sent before this process's write may answer the state before it: not kept, so that
    the writer's next read sees its write."""
    sent_before = clock.now
    clock.now += 0.01
    cache.forget_session(SID)  # the write, about to be sent
    clock.now += 0.01
    assert not cache.offer(SESSION, KEY, reply(10), sent_before)
    assert cache.offer(SESSION, KEY, reply(10), clock.now)  # a read sent after the write


def test_fences_stay_bounded_under_a_burst_of_writes(cache: NearCache, clock: Clock) -> None:
    sent = clock.now
    for i in range(nearcache.FENCES_MAX + 1):
        clock.now += 1e-6
        cache.forget_name(f"dev-{i}")
    assert len(cache._fences) <= nearcache.FENCES_MAX  # the bound is the point
    assert not cache.offer(SESSION, KEY, reply(10), sent)  # one fence for all: still not kept
