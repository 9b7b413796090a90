"""A near cache on a sharded cluster (two shards of three Tarantool instances on etcd): each copy follows the log
of the shard that answered it, and a bucket moved to the other shard drops its copies (its later events are in
the other shard's log), after which the session is kept again from its new shard and its changes still drop it."""

from __future__ import annotations

from pathlib import Path

import pytest

from smartcache.client import Client, NearCache
from smartcache.ops import moves
from smartcache.wire import buckets
from tests.helpers import eventually
from tests.integration.test_resharding import BUCKETS, make_shards

pytestmark = pytest.mark.slow


def test_a_bucket_moved_to_the_other_shard_drops_its_copies_and_the_session_is_followed_there(tmp_path: Path) -> None:
    with make_shards(tmp_path, 2) as two:
        two.init(["s1", "s2"])
        with two.service("near-sharded", events_listen="tcp://127.0.0.1:0") as svc:
            publisher = svc.service.events
            assert publisher is not None
            eventually(lambda: {"s1", "s2"} <= set(publisher.cursors), 20, what="both shards' logs published")
            near = NearCache(publishers=publisher.endpoint, max_lag_s=2.0)
            reader = Client(svc.endpoint, timeout_s=10, near_cache=near)
            try:
                eventually(lambda: near.stats()["shards"] == {"s1": True, "s2": True}, 20, what="both followed")
                client_id = "near-moving"
                sid = svc.client.session_create(client_id, data={"v": 1}).session_id
                assert reader.session_get(sid).ok
                bucket = buckets.bucket_of(client_id, BUCKETS)
                source = moves.owners(two.map())[bucket]
                destination = "s2" if source == "s1" else "s1"
                hits = near.counts.hits
                assert reader.session_get(sid).body["data"] == {"v": 1}
                assert near.counts.hits == hits + 1
                invalidations = near.counts.invalidations
                result = moves.run_moves(two.access(), [(bucket, destination)], parallel=1)
                assert result["status"] == "OK", result
                eventually(lambda: near.counts.invalidations > invalidations, 5, what="the move drops the copy")
                # read again: from the new shard, kept with its position in that shard's log
                eventually(lambda: reader.session_get(sid).ok and near.counts.hits > hits + 1, 10, what="kept again")
                assert svc.client.session_update(sid, {"v": 2}).ok
                eventually(lambda: reader.session_get(sid).body["data"] == {"v": 2}, 2.0, what="the update seen")
            finally:
                reader.close(linger_ms=0)
