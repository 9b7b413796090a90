"""Storage sharded by client: two shards (each a replica set of three real Tarantool instances) on three real etcd
members, and a real service that discovers them (docs/design/sharding.md).

Every placement is checked from storage, not from the service's word: a row is asked of both shards' leaders,
and the shard that must not hold it refuses with WRONG_BUCKET (storage is authoritative).
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from loadtest.backend import Backend
from smartcache.client import Client
from smartcache.devstack.etcd import EtcdCluster
from smartcache.devstack.stack import Tarantool
from smartcache.ops import cluster
from smartcache.server.app import Service
from smartcache.server.config import ZERO_SESSION_KEY, Settings
from smartcache.server.storage.shards import BucketMap
from smartcache.wire import buckets, sessionkeys, topology
from smartcache.wire.errors import RequestError
from tests.conftest import Running, running_service, service_settings
from tests.helpers import eventually, metric
from tests.integration.conftest_ha import HACluster, ha_env

pytestmark = pytest.mark.slow


def stored(raw: Any) -> str:
    """The stored id storage keys a session by: the raw id a client holds, derived with the services' key (these
    tests give none: the all-zero development key). It keeps the raw id's bucket (PROTOCOL.md 4)."""
    return str(uuid.UUID(bytes=sessionkeys.derive(ZERO_SESSION_KEY, raw.bytes)))


SHARDS = ("s1", "s2")
BUCKETS = 16


class TwoShards:
    def __init__(self, name: str, etcd: EtcdCluster, shards: dict[str, HACluster]) -> None:
        self.name, self.etcd, self.shards = name, etcd, shards

    def access(self) -> cluster.Access:
        return cluster.Access(
            addresses=(),
            user="operator",
            password="operator",
            etcd=[m.url for m in self.etcd.members],
            cluster=self.name,
        )

    def init(self) -> BucketMap:
        """The bucket map in etcd (created once) and each shard's leader holding its buckets."""
        made = cluster.shards_init(self.access(), list(SHARDS), BUCKETS)
        assert made["status"] == "OK", made
        return BucketMap.parse(json.dumps(made["map"]))

    def settings(self, instance_id: str, **overrides: Any) -> Settings:
        """A service that finds both shards in etcd (it is given no instance)."""
        any_node = next(iter(self.shards["s1"].nodes.values()))
        settings = service_settings(
            any_node, tarantool=(), etcd=tuple(m.url for m in self.etcd.members), cluster=self.name, workers=10,
            events_listen="", instance_id=instance_id,
        )  # fmt: skip
        return replace(settings, **overrides)

    @contextlib.contextmanager
    def service(self, instance_id: str, **overrides: Any) -> Iterator[Running]:
        with running_service(self.settings(instance_id, **overrides)) as svc:
            yield svc

    def rows(self, space: str) -> dict[str, int]:
        """How many rows each shard's leader holds in a space."""
        return {s: int(self.ask(s, "stats")["spaces"][space]) for s in SHARDS}

    def ask(self, shard: str, procedure: str, *args: Any) -> dict[str, Any]:
        """sc.<procedure> on a shard's leader."""
        c = self.shards[shard]
        answer = c.call(c.leader(), procedure, *args)
        assert answer is not None, f"{shard}'s leader did not answer {procedure}"
        return answer


@pytest.fixture
def two(tmp_path: Path) -> Iterator[TwoShards]:
    etcd = EtcdCluster.create(tmp_path)
    etcd.start()
    shards: dict[str, HACluster] = {}
    try:
        etcd.wait_ready()
        name = f"t{random.randrange(1 << 30)}"
        for s in SHARDS:
            env = ha_env(etcd, topology.shard_cluster(name, s))
            nodes = {f"{s}-{i}": Tarantool.create(f"{s}-{i}", tmp_path, extra_env=env) for i in (1, 2, 3)}
            shards[s] = HACluster(tmp_path, etcd, nodes)
            for node in nodes.values():
                node.start()
        for c in shards.values():
            leader = c.leader()
            for n in c.nodes:
                if n != leader:
                    c.wait_role(n, "follower")
        yield TwoShards(name, etcd, shards)
    finally:
        for c in shards.values():
            c.close_conns()
            for node in c.nodes.values():
                node.stop()
        etcd.stop()
        etcd.cleanup()


def _home(bucket_map: BucketMap, key: str) -> str:
    return bucket_map.shard_of(buckets.bucket_of(key, BUCKETS))


def _other(shard: str) -> str:
    return next(s for s in SHARDS if s != shard)


def test_every_key_lives_on_the_shard_its_bucket_names_and_the_other_refuses_it(two: TwoShards) -> None:
    made = cluster.shards_init(two.access(), list(SHARDS), BUCKETS)
    assert made["status"] == "OK", made
    assert made["created"]
    again = cluster.shards_init(two.access(), list(SHARDS), BUCKETS)
    assert (again["status"], again["created"]) == ("OK", False)
    bucket_map = BucketMap.parse(json.dumps(made["map"]))
    with two.service("svc-a") as svc:
        c = svc.client
        placed: dict[str, str] = {}
        expected = {space: dict.fromkeys(SHARDS, 0) for space in ("cache", "registers", "queue_tasks")}
        for i in range(40):
            client = f"client-{i}"
            created = c.session_create(client, data={"i": i})
            assert created.ok, created
            assert created.session_id is not None
            sid = stored(created.session_id)
            assert buckets.session_bucket(created.session_id.bytes) == buckets.bucket_of(client, BUCKETS)
            assert buckets.session_bucket(uuid.UUID(sid).bytes) == buckets.bucket_of(client, BUCKETS)
            home = placed[sid] = _home(bucket_map, client)
            assert c.session_get(created.session_id).ok
            assert c.cache_put("k", {"i": i}, session_id=created.session_id).ok
            expected["cache"][home] += 1
            assert c.cache_put(f"otp:{i}", i).ok  # the global namespace: routed by the key
            expected["cache"][_home(bucket_map, f"otp:{i}")] += 1
            assert c.device_bind(f"dev-{i}", client).ok
            assert c.counter_add(f"ctr-{i}", 1).ok
            assert c.register_cas(f"reg-{i}", i).ok
            expected["registers"][_home(bucket_map, f"reg-{i}")] += 1
            assert c.queue_put(f"q-{i}", {"i": i}).ok
            expected["queue_tasks"][_home(bucket_map, f"q-{i}")] += 1
            assert c.session_list(client).body["sessions"][0]["handle"] == created.handle
            # From storage: the home shard holds it, the other refuses it having done nothing.
            assert two.ask(home, "session_locate", sid)["status"] == "OK"
            assert two.ask(_other(home), "session_get", sid)["status"] == "WRONG_BUCKET"
            assert two.ask(home, "cache_get", sid, "k")["status"] == "OK"
            assert two.ask(_other(home), "cache_get", sid, "k")["status"] == "WRONG_BUCKET"
            device_home = _home(bucket_map, f"dev-{i}")
            assert two.ask(device_home, "device_lookup", f"dev-{i}")["client_id"] == client
            assert two.ask(_other(device_home), "device_lookup", f"dev-{i}")["status"] == "WRONG_BUCKET"
            counter_home = _home(bucket_map, f"ctr-{i}")
            assert two.ask(counter_home, "counter_get", f"ctr-{i}")["value"] == 1
            assert two.ask(_other(counter_home), "counter_get", f"ctr-{i}")["status"] == "WRONG_BUCKET"
        assert set(placed.values()) == set(SHARDS), "forty clients land on both shards"
        for space, want in expected.items():
            assert two.rows(space) == want, space
        sessions = two.rows("sessions")
        assert sessions == {s: list(placed.values()).count(s) for s in SHARDS}
        _info_and_status_show_both_shards(c, two, sessions)


def _info_and_status_show_both_shards(c: Client, two: TwoShards, sessions: dict[str, int]) -> None:
    """INFO has each shard's leader's statistics and each instance's shard; cluster status each shard."""
    info = c.info().body
    assert set(info["storage_stats"]["shards"]) == set(SHARDS)
    assert {s: info["storage_stats"]["shards"][s]["spaces"]["sessions"] for s in SHARDS} == sessions
    assert {row["shard"] for row in info["storage"]} == set(SHARDS)
    seen = cluster.status(two.access())
    assert seen["healthy"], seen
    assert set(seen["shards"]) == set(SHARDS)
    assert all(len(seen["shards"][s]["instances"]) == 3 for s in SHARDS)


def _sessions_act_on_their_shard(c: Client, two: TwoShards, where: Callable[[str], tuple[str, str]]) -> None:
    """Sessions: update, touch, rotate, delete, delete_client."""
    s = c.session_create("types-client", data={"a": 1})
    assert s.session_id is not None
    home, other = where("types-client")
    assert c.session_update(s.session_id, set={"b": 2}).ok
    assert c.session_touch(s.session_id).ok
    got = two.ask(home, "session_get", stored(s.session_id))
    assert (got["status"], got["rev"]) == ("OK", 2), got
    assert two.ask(other, "session_get", stored(s.session_id))["status"] == "WRONG_BUCKET"
    rotated = c.session_rotate(s.session_id, grace_ms=0)
    assert rotated.session_id is not None
    assert two.ask(home, "session_locate", stored(rotated.session_id))["status"] == "OK"
    assert two.ask(home, "session_locate", stored(s.session_id))["status"] == "NOT_FOUND"
    assert c.cache_put("k", 1, session_id=rotated.session_id).ok
    assert c.cache_get("k", session_id=rotated.session_id).ok
    assert c.cache_delete("k", session_id=rotated.session_id).ok
    assert two.ask(home, "cache_get", stored(rotated.session_id), "k")["status"] == "NOT_FOUND"
    assert c.session_delete(rotated.session_id).ok
    assert two.ask(home, "session_locate", stored(rotated.session_id))["status"] == "NOT_FOUND"
    for _ in range(3):
        assert c.session_create("types-client").ok
    assert c.session_delete_client("types-client").body["deleted"] == 3
    assert two.ask(home, "session_list", "types-client")["sessions"] == []
    assert two.ask(other, "session_list", "types-client")["status"] == "WRONG_BUCKET"


def _global_cache_acts_on_its_shard(c: Client, two: TwoShards, where: Callable[[str], tuple[str, str]]) -> None:
    """The global cache namespace."""
    home, other = where("otp:types")
    assert c.cache_put("otp:types", 7).ok
    assert c.cache_delete("otp:types").ok
    assert two.ask(home, "cache_get", "", "otp:types")["status"] == "NOT_FOUND"
    assert two.ask(other, "cache_get", "", "otp:types")["status"] == "WRONG_BUCKET"


def _devices_act_on_their_shard(c: Client, two: TwoShards, where: Callable[[str], tuple[str, str]]) -> None:
    """Devices."""
    home, other = where("types-device")
    assert c.device_bind("types-device", "types-client").ok
    assert c.device_lookup("types-device").body["client_id"] == "types-client"
    assert two.ask(home, "device_lookup", "types-device")["client_id"] == "types-client"
    assert two.ask(other, "device_lookup", "types-device")["status"] == "WRONG_BUCKET"


def _counters_registers_sequences_act_on_their_shard(
    c: Client, two: TwoShards, where: Callable[[str], tuple[str, str]]
) -> None:
    """Counters, registers, sequences."""
    home, other = where("types-counter")
    assert c.counter_add("types-counter", 5).ok
    assert c.counter_cas("types-counter", 5, 9).ok
    assert c.counter_get("types-counter").body["value"] == 9
    assert two.ask(home, "counter_get", "types-counter")["value"] == 9
    assert two.ask(other, "counter_get", "types-counter")["status"] == "WRONG_BUCKET"
    home, other = where("types-register")
    assert c.register_cas("types-register", "v1").ok
    assert c.register_get("types-register").body["value"] == "v1"
    assert two.ask(home, "register_get", "types-register")["value"] == "v1"
    assert two.ask(other, "register_get", "types-register")["status"] == "WRONG_BUCKET"
    home, other = where("types-sequence")
    assert c.sequence_reserve("types-sequence", 10).ok
    assert c.sequence_get("types-sequence").ok
    assert two.ask(home, "sequence_get", "types-sequence")["status"] == "OK"
    assert two.ask(other, "sequence_get", "types-sequence")["status"] == "WRONG_BUCKET"


def _semaphores_act_on_their_shard(c: Client, two: TwoShards, where: Callable[[str], tuple[str, str]]) -> None:
    """Semaphores."""
    home, other = where("types-lock")
    assert c.semaphore_acquire("types-lock", "h1", 60_000).ok
    assert c.semaphore_renew("types-lock", "h1", 60_000).ok
    assert [h["holder"] for h in two.ask(home, "semaphore_get", "types-lock")["holders"]] == ["h1"]
    assert c.semaphore_get("types-lock").ok
    assert c.semaphore_release("types-lock", "h1").ok
    assert two.ask(home, "semaphore_get", "types-lock")["holders"] == []
    assert two.ask(other, "semaphore_get", "types-lock")["status"] == "WRONG_BUCKET"


def _latches_act_on_their_shard(c: Client, two: TwoShards, where: Callable[[str], tuple[str, str]]) -> None:
    """Latches."""
    home, other = where("types-latch")
    assert c.latch_create("types-latch", 2).ok
    assert c.latch_count_down("types-latch").ok
    assert c.latch_get("types-latch").body["count"] == 1
    assert c.latch_count_down("types-latch").ok
    assert c.latch_await("types-latch").ok
    assert two.ask(home, "latch_get", "types-latch")["count"] == 0
    assert two.ask(other, "latch_get", "types-latch")["status"] == "WRONG_BUCKET"


def _queues_act_on_their_shard(c: Client, two: TwoShards, where: Callable[[str], tuple[str, str]]) -> None:
    """Queues."""
    home, other = where("types-queue")
    assert c.queue_put("types-queue", {"n": 1}).ok
    assert c.queue_put("types-queue", {"n": 2}).ok
    first = c.queue_take("types-queue").body
    assert c.queue_ack("types-queue", first["task_id"], first["attempt"]).ok
    second = c.queue_take("types-queue").body
    assert c.queue_release("types-queue", second["task_id"], second["attempt"]).ok
    assert c.queue_stats("types-queue").body["ready"] == 1
    stats = two.ask(home, "queue_stats", "types-queue")
    assert (stats["ready"], stats["taken"]) == (1, 0), stats
    assert two.ask(other, "queue_stats", "types-queue")["status"] == "WRONG_BUCKET"


def _an_event_goes_to_its_key_s_log(c: Client, two: TwoShards, where: Callable[[str], tuple[str, str]]) -> None:
    """An application event with a key: in its key's shard's log."""
    home, other = where("types-event-key")
    head = {sh: two.ask(sh, "events_read", None, None, 1, 0)["head_seq"] for sh in SHARDS}
    assert c.event_publish("app.types", {"x": 1}, key="types-event-key").ok
    mine = two.ask(home, "events_read", head[home], ["app."], 10, 0)["events"]
    assert [e["key"] for e in mine] == ["types-event-key"]
    assert two.ask(other, "events_read", head[other], ["app."], 10, 0)["events"] == []


def test_every_message_type_of_a_key_acts_on_its_shard_only(two: TwoShards) -> None:
    """Each message type through a service, then asked of storage: its effect is on the key's shard, and the
    other shard refuses the key (the families of the test above, and every other type of the registry that is
    about one key)."""
    bucket_map = two.init()

    def where(key: str) -> tuple[str, str]:
        home = _home(bucket_map, key)
        return home, _other(home)

    with two.service("svc-a", worker_threads=2) as svc:
        _sessions_act_on_their_shard(svc.client, two, where)
        _global_cache_acts_on_its_shard(svc.client, two, where)
        _devices_act_on_their_shard(svc.client, two, where)
        _counters_registers_sequences_act_on_their_shard(svc.client, two, where)
        _semaphores_act_on_their_shard(svc.client, two, where)
        _latches_act_on_their_shard(svc.client, two, where)
        _queues_act_on_their_shard(svc.client, two, where)
        _an_event_goes_to_its_key_s_log(svc.client, two, where)


def test_a_stale_map_in_one_service_costs_retries_and_no_write_in_the_wrong_place(two: TwoShards) -> None:
    bucket_map = two.init()
    with two.service("svc-a") as a, two.service("svc-b") as b:
        # b routes by a map that gives every bucket to the other shard (as after a move it has not seen)
        swapped = replace(bucket_map, owners=tuple(_other(o) for o in bucket_map.owners))
        for w in b.service.pool.workers:
            assert w.storage is not None
            assert w.storage.sharded is not None
            w.storage.sharded.map = swapped
        made: dict[str, str] = {}
        for i in range(30):
            client = f"stale-{i}"
            r = (b if i % 2 else a).client.session_create(client, data={"i": i})
            assert r.ok, r
            assert r.session_id is not None
            made[stored(r.session_id)] = _home(bucket_map, client)
            assert b.client.counter_add(f"stale-ctr-{i}", 1).ok
        refused = metric(b.metrics_url, "smartcache_storage_wrong_bucket_total")
        assert refused >= 1, "b's first call went by the stale map and was refused"
        assert metric(a.metrics_url, "smartcache_storage_wrong_bucket_total") == 0
        for sid, home in made.items():
            assert two.ask(home, "session_locate", sid)["status"] == "OK"
        assert two.rows("sessions") == {s: list(made.values()).count(s) for s in SHARDS}
        counters = two.rows("counters")
        assert sum(counters.values()) == 30
        for i in range(30):
            assert two.ask(_home(bucket_map, f"stale-ctr-{i}"), "counter_get", f"stale-ctr-{i}")["value"] == 1
        assert all(w.storage.sharded.map == bucket_map for w in b.service.pool.workers)  # type: ignore[union-attr]


def test_app_start_reads_the_device_on_its_shard_and_prewarms_on_the_client_s(two: TwoShards) -> None:
    bucket_map = two.init()
    client = "client-app"
    device = next(d for i in range(1000) if _home(bucket_map, d := f"phone-{i}") != _home(bucket_map, client))
    backend = Backend(latency_ms=10).start()
    try:
        with two.service("svc-a", backend_url=backend.url, prewarm_types=(1, 2), backend_retries=0) as svc:
            assert svc.client.device_bind(device, client).ok
            svc.client.app_start(device)
            # A prewarm row exists from its claim on (state UPDATING), before the backend answered: wait for the
            # rows and for both backend calls, so the read below finds them stored or in flight, never absent.
            eventually(lambda: two.rows("prewarm")[_home(bucket_map, client)] == 2, 15, what="both types claimed")
            eventually(lambda: backend.state.stats()["calls"] == 2, 15, what="both types fetched")
            assert two.rows("prewarm")[_home(bucket_map, device)] == 0
            assert two.rows("device") == {_home(bucket_map, device): 1, _home(bucket_map, client): 0}
            got = svc.client.products_get(client, 1)
            assert got.ok, got
            assert backend.state.stats()["calls"] == 2, (
                "one backend call per type: the prewarm's, products then came from storage"
            )
    finally:
        backend.stop()


def test_one_shard_s_leader_killed_under_load_the_other_shard_writes_on_and_nothing_acked_is_lost(
    two: TwoShards,
) -> None:
    bucket_map = two.init()
    clients = {s: [c for i in range(200) if _home(bucket_map, c := f"load-{i}") == s][:8] for s in SHARDS}
    acked: dict[str, list[tuple[float, str]]] = {s: [] for s in SHARDS}
    failed: dict[str, list[tuple[float, str]]] = {s: [] for s in SHARDS}
    stop = threading.Event()
    with two.service("svc-a") as a, two.service("svc-b") as b:

        def load(shard: str, svc: Running) -> None:
            from smartcache.client import Client

            c = Client(svc.endpoint, timeout_s=10)
            try:
                n = 0
                while not stop.is_set():
                    client = clients[shard][n % len(clients[shard])]
                    n += 1
                    try:
                        r = c.session_create(client, data={"n": n})
                    except RequestError as e:  # STORAGE_UNAVAILABLE, OUTCOME_UNKNOWN (the leader died mid-call)
                        failed[shard].append((time.monotonic(), str(e)))
                        continue
                    t = time.monotonic()
                    if r.ok and r.session_id is not None:
                        acked[shard].append((t, stored(r.session_id)))
                    else:
                        failed[shard].append((t, str(r.status)))
            finally:
                c.close(linger_ms=0)

        threads = [threading.Thread(target=load, args=(s, svc)) for s in SHARDS for svc in (a, b)]
        for t in threads:
            t.start()
        try:
            time.sleep(2)
            victim = two.shards["s1"].leader()
            killed_at = time.monotonic()
            two.shards["s1"].nodes[victim].stop(sig=signal.SIGKILL)
            two.shards["s1"].drop_conn(victim)
            two.shards["s1"].leader(exclude=(victim,))
            eventually(
                lambda: any(t > killed_at + 1 for t, _ in acked["s1"]), 30, what="s1's writes resume"
            )  # fmt: skip
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        after = [x for x in failed["s2"] if x[0] > killed_at - 1]
        assert not after, f"s2's writes failed while s1 failed over: {after[:3]}"
        assert any(t > killed_at for t, _ in acked["s2"])
        assert failed["s1"], "s1's writes failed for a moment (its leader was gone)"
        for shard in SHARDS:
            for _, sid in acked[shard]:
                assert two.ask(shard, "session_locate", sid)["status"] == "OK", f"{sid} acked on {shard}, lost"


def test_events_of_both_shards_reach_a_subscriber_each_once_gap_free_per_shard(two: TwoShards) -> None:
    bucket_map = two.init()
    with two.service("svc-a", events_listen="tcp://127.0.0.1:0") as svc:
        assert svc.service.events is not None
        endpoint = svc.service.events.endpoint
        eventually(lambda: set(svc.service.events.cursors) == set(SHARDS), what="a reader per shard")  # type: ignore[union-attr]
        with svc.client.subscribe(from_seq=1, publishers=endpoint) as one, pytest.raises(ValueError, match="per shard"):
            one.poll(1)  # one number names no log of a sharded cluster
        refused = svc.client.call("EVENTS_READ", {"shard": "s9"})
        assert refused.status == "BAD_REQUEST"
        assert "s1, s2" in refused.body["message"]
        with svc.client.subscribe(["session."], publishers=endpoint) as sub:
            assert sub.sharded
            assert set(sub.cursors) == set(SHARDS)
            start = dict(sub.cursors)
            made: dict[str, str] = {}
            for i in range(60):
                r = svc.client.session_create(f"ev-{i}")
                assert r.session_id is not None
                made[str(r.handle)] = _home(bucket_map, f"ev-{i}")  # events name sessions by handle
            got: dict[str, list[int]] = {s: [] for s in SHARDS}
            seen: dict[str, str] = {}
            deadline = time.monotonic() + 30
            while len(seen) < len(made) and time.monotonic() < deadline:
                e = sub.poll(1)
                if e is not None and e.topic == "session.created":
                    assert e.key not in seen, f"{e.key} twice"
                    seen[e.key] = e.shard
                    got[e.shard].append(e.seq)
        assert seen == made, "every session's event came once, from the shard that holds it"
        for s in SHARDS:
            # one shard's creates are its only events here: its sequence runs on with no gap
            assert got[s] == list(range(start[s] + 1, start[s] + 1 + len(got[s]))), s
            assert got[s], f"{s} had events"
        read = svc.client.call("EVENTS_READ", {"after_seq": start["s2"], "shard": "s2", "limit": 1000})
        assert read.ok
        assert (read.body["shard"], read.body["shards"]) == ("s2", list(SHARDS))
        assert [e["seq"] for e in read.body["events"]] == got["s2"]


def test_a_service_started_before_cluster_init_routes_by_the_map_once_it_is_made(two: TwoShards) -> None:
    service = Service(two.settings("svc-early", events_listen="tcp://127.0.0.1:0"))
    service.start()  # not ready: the cluster has no map yet, and no instance of its own name
    svc = Running(service)
    try:
        time.sleep(1.5)  # it has looked for a map at least once and found none
        assert not all(service.ready().values())
        assert svc.service.events is not None
        bucket_map = two.init()
        created: dict[str, str] = {}

        def create() -> bool:
            try:
                r = svc.client.session_create("early-1")
            except RequestError:
                return False  # STORAGE_UNAVAILABLE until it reads the map: nothing written
            assert r.session_id is not None
            created[stored(r.session_id)] = _home(bucket_map, "early-1")
            return True

        eventually(create, 15, what="sessions created once the service found the map")
        for i in range(20):
            r = svc.client.session_create(f"early-{i}")
            assert r.session_id is not None
            created[stored(r.session_id)] = _home(bucket_map, f"early-{i}")
        for sid, home in created.items():
            assert two.ask(home, "session_locate", sid)["status"] == "OK"
        assert sum(two.rows("sessions").values()) == len(created)
        eventually(lambda: set(SHARDS) <= set(svc.service.events.cursors), 15, what="a reader per shard's log")  # type: ignore[union-attr]
        svc.wait_workers()
    finally:
        svc.client.close(linger_ms=0)
        service.stop()
