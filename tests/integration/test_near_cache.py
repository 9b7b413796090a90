"""A client's near cache against a real service and Tarantool (issue 38): a read after a miss is a hit; a change
by another client drops the copy through the event stream; a dropped PUB connection stops serving until the
catch-up has closed the gap, which drops only what the missing events touched; no read of a deleted or rotated
session is answered after the bound (max_lag_s)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from smartcache.client import AsyncClient, Client, NearCache, nearfollow
from smartcache.devstack.stack import Tarantool, free_port
from tests.conftest import Running, running_service, service_settings
from tests.helpers import eventually
from tests.tcpproxy import TcpProxy

MAX_LAG_S = 2.0
#: reads of an ended session are paced under the service's NOT_FOUND throttle (1,000 a second per connection)
READ_PACE_S = 0.005


def _publisher_port(r: Running) -> int:
    assert r.service.events is not None
    eventually(lambda: bool(r.service.events and r.service.events.cursors), what="the events reader started")
    return int(r.service.events.endpoint.rsplit(":", 1)[1])


def _serving(client: Client) -> bool:
    assert client.near_cache is not None
    return all(client.near_cache.stats()["shards"].values()) and bool(client.near_cache.stats()["shards"])


@pytest.fixture(scope="module")
def svc(storage: Tarantool) -> Iterator[Running]:
    with running_service(service_settings(storage, instance_id="near")) as r:
        yield r


@contextlib.contextmanager
def near_client(svc: Running, publishers: str | None = None) -> Iterator[Client]:
    if publishers is None:
        publishers = f"tcp://127.0.0.1:{_publisher_port(svc)}"
    client = Client(svc.endpoint, timeout_s=10, near_cache=NearCache(publishers=publishers, max_lag_s=MAX_LAG_S))
    try:
        eventually(lambda: _serving(client), what="the near cache follows the stream")
        yield client
    finally:
        client.close(linger_ms=0)


def _stats(client: Client) -> dict[str, Any]:
    assert client.near_cache is not None
    return client.near_cache.stats()


def test_a_read_after_a_miss_is_answered_from_memory(svc: Running) -> None:
    sid = svc.client.session_create("near-1", data={"n": 1}).session_id
    with near_client(svc) as reader:
        first = reader.session_get(sid)
        assert first.ok
        assert first.body["data"] == {"n": 1}
        before = _stats(reader)
        second = reader.session_get(sid)
        after = _stats(reader)
    assert second.ok
    assert second.body["data"] == {"n": 1}
    assert after["hits"] == before["hits"] + 1


def test_an_update_by_another_client_is_seen_within_the_bound(svc: Running) -> None:
    sid = svc.client.session_create("near-2", data={"n": 1}).session_id
    with near_client(svc) as reader:
        reader.session_get(sid)
        assert reader.session_get(sid).body["data"] == {"n": 1}
        assert svc.client.session_update(sid, {"n": 2}).ok
        eventually(lambda: reader.session_get(sid).body["data"] == {"n": 2}, MAX_LAG_S, what="the update seen")
        assert _stats(reader)["invalidations"] >= 1
        reader.session_get(sid)
        assert reader.session_get(sid).body["data"] == {"n": 2}  # kept again, and a hit
        assert _stats(reader)["hits"] >= 2


def _reads_after(reader: Client, sid: uuid.UUID, done_at: float, until_s: float) -> list[tuple[float, str]]:
    """Read sid until done_at + until_s: (time sent, status) of each read."""
    out = []
    while time.monotonic() < done_at + until_s:
        sent = time.monotonic()
        out.append((sent, str(reader.session_get(sid).status)))
        time.sleep(READ_PACE_S)
    return out


@pytest.mark.parametrize("change", ["delete", "rotate", "delete_client"])
def test_no_read_of_an_ended_or_rotated_session_is_answered_after_the_bound(svc: Running, change: str) -> None:
    client_id = f"near-3-{change}"
    sid = svc.client.session_create(client_id, data={"n": 1}).session_id
    with near_client(svc) as reader:
        reader.session_get(sid)
        assert reader.session_get(sid).ok
        hits = _stats(reader)["hits"]
        assert hits >= 1
        if change == "delete":
            assert svc.client.session_delete(sid).ok
        elif change == "rotate":
            assert svc.client.session_rotate(sid, grace_ms=0).ok
        else:
            assert svc.client.session_delete_client(client_id).ok
        done_at = time.monotonic()
        reads = _reads_after(reader, sid, done_at, MAX_LAG_S + 0.5)
    late = [(round(t - done_at, 3), s) for t, s in reads if t > done_at + MAX_LAG_S and s != "NOT_FOUND"]
    assert late == []
    assert reads[-1][1] == "NOT_FOUND"


def test_an_expired_session_is_gone_from_the_cache(svc: Running) -> None:
    sid = svc.client.session_create("near-4", data={"n": 1}, ttl_s=1).session_id
    with near_client(svc) as reader:
        reader.session_get(sid)
        eventually(lambda: reader.session_get(sid).status == "NOT_FOUND", 5.0, what="the expiry seen")


def test_a_session_read_only_from_memory_slides_as_one_read_through_the_service(svc: Running) -> None:
    """ttl 3 s (a read refreshes after 1 s): read from memory for twice the ttl, the session is still live."""
    sid = svc.client.session_create("near-slide", data={"n": 1}, ttl_s=3).session_id
    with near_client(svc) as reader:
        reader.session_get(sid)
        until = time.monotonic() + 6.0
        while time.monotonic() < until:
            assert reader.session_get(sid).ok
            time.sleep(0.05)  # a front server's pace of requests
        stats = _stats(reader)
    assert stats["touches"] >= 3
    assert stats["hits"] > stats["misses"]
    assert svc.client.session_get(sid).ok  # alive in storage: the touches slid it


def test_a_device_lookup_is_kept_until_the_device_is_bound_again(svc: Running) -> None:
    assert svc.client.device_bind("near-dev-1", "client-a").ok
    with near_client(svc) as reader:
        assert reader.device_lookup("near-dev-1").body["client_id"] == "client-a"
        hits = _stats(reader)["hits"]
        assert reader.device_lookup("near-dev-1").body["client_id"] == "client-a"
        assert _stats(reader)["hits"] == hits + 1
        assert svc.client.device_bind("near-dev-1", "client-b").ok
        eventually(
            lambda: reader.device_lookup("near-dev-1").body["client_id"] == "client-b", MAX_LAG_S, what="rebinding"
        )


def test_this_clients_own_update_is_read_back_at_once(svc: Running) -> None:
    with near_client(svc) as client:
        sid = client.session_create("near-5", data={"n": 1}).session_id
        client.session_get(sid)
        assert client.session_get(sid).body["data"] == {"n": 1}
        assert client.session_update(sid, {"n": 2}).ok
        assert client.session_get(sid).body["data"] == {"n": 2}


def test_a_dropped_pub_connection_stops_serving_until_caught_up_and_drops_only_what_changed(svc: Running) -> None:
    changed = svc.client.session_create("near-6", data={"n": 1}).session_id
    kept = svc.client.session_create("near-6", data={"n": 1}).session_id
    with TcpProxy(_publisher_port(svc)) as proxy, near_client(svc, f"tcp://{proxy.address}") as reader:
        for sid in (changed, kept):
            reader.session_get(sid)
            assert reader.session_get(sid).ok
        proxy.cut()  # the PUB connection drops; no new one until restored
        eventually(lambda: not _serving(reader), 1.0, what="the shard stops being served at the disconnect")
        assert svc.client.session_delete(changed).ok  # its event is published while the reader hears nothing
        stale_before = _stats(reader)["not_served_stale"]
        assert reader.session_get(changed).status == "NOT_FOUND"  # asked of the service, not answered from memory
        assert reader.session_get(kept).ok
        assert _stats(reader)["not_served_stale"] >= stale_before + 1
        proxy.restore()
        eventually(lambda: _serving(reader), 10.0, what="caught up and served again")
        hits = _stats(reader)["hits"]
        assert reader.session_get(changed).status == "NOT_FOUND"
        assert reader.session_get(kept).ok
        stats = _stats(reader)
    assert stats["hits"] >= hits + 1  # the kept session's copy survived the gap (or was kept again)
    assert stats["disconnects"] >= 1


def test_without_a_reachable_events_endpoint_every_read_goes_to_the_service(svc: Running) -> None:
    sid = svc.client.session_create("near-7", data={"n": 1}).session_id
    client = Client(svc.endpoint, timeout_s=10, near_cache=NearCache(publishers=None))
    try:
        assert client.session_get(sid).ok
        assert client.session_get(sid).ok
        stats = _stats(client)
    finally:
        client.close(linger_ms=0)
    assert not stats["enabled"]
    assert stats["hits"] == 0


def test_the_asyncio_client_answers_from_its_near_cache_too(svc: Running) -> None:
    sid = svc.client.session_create("near-async", data={"n": 1}).session_id
    publishers = f"tcp://127.0.0.1:{_publisher_port(svc)}"

    async def run() -> tuple[list[int], dict[str, Any]]:
        near = NearCache(publishers=publishers, max_lag_s=MAX_LAG_S)
        c = AsyncClient(svc.endpoint, timeout_s=10, near_cache=near)
        try:
            deadline = time.monotonic() + 10
            while not any(near.stats()["shards"].values()) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            await c.session_get(sid)
            replies = await asyncio.gather(*(c.session_get(sid) for _ in range(10)))
            assert (await c.session_update(sid, {"n": 2})).ok
            after = await c.session_get(sid)  # its own write: read back at once
            return [r.body["data"]["n"] for r in [*replies, after]], near.stats()
        finally:
            c.close()

    values, stats = asyncio.run(run())
    assert values == [1] * 10 + [2]
    assert stats["hits"] >= 10


def test_an_events_endpoint_nobody_publishes_on_leaves_every_read_to_the_service_and_is_said_once(
    svc: Running, caplog: pytest.LogCaptureFixture
) -> None:
    sid = svc.client.session_create("near-8", data={"n": 1}).session_id
    caplog.set_level(logging.WARNING, logger="smartcache.client.nearcache")
    near = NearCache(publishers=f"tcp://127.0.0.1:{free_port()}", max_lag_s=MAX_LAG_S)
    client = Client(svc.endpoint, timeout_s=10, near_cache=near)
    try:
        eventually(
            lambda: any("near_cache_not_serving" in r.getMessage() for r in caplog.records),
            nearfollow.NO_STREAM_S + 5,
            what="said once",
        )
        replies = [client.session_get(sid) for _ in range(5)]
    finally:
        client.close(linger_ms=0)
    assert all(r.ok and not r.near for r in replies)
    assert near.stats()["hits"] == 0
    assert sum("near_cache_not_serving" in r.getMessage() for r in caplog.records) == 1
