"""Moving buckets online (docs/design/resharding.md): shards of three real Tarantool instances each on three real
etcd members, real services that route by the bucket map, and writers that keep writing while buckets move.

Every check reads storage, not the service's word: at the end each bucket's rows are counted on every shard (the
owner holds them, every other shard none), each acknowledged session is read from its owner with its last
acknowledged value, and while the moves run a sampler asks every shard's leader which buckets it serves (a bucket
served by two shards at one generation would be two live copies).
"""

from __future__ import annotations

import collections
import contextlib
import json
import random
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from smartcache.cli import output
from smartcache.cli.main import main as cli_main
from smartcache.client import Client
from smartcache.devstack.etcd import EtcdCluster
from smartcache.devstack.stack import Tarantool
from smartcache.ops import audit, cluster, moves
from smartcache.wire import buckets, sessionkeys, topology
from smartcache.wire.errors import RequestError
from tests.conftest import Running, running_service, service_settings
from tests.helpers import eventually, metric
from tests.integration.conftest_ha import TTL_S, HACluster, ha_env

pytestmark = pytest.mark.slow

BUCKETS = 32


def stored(session_id: object) -> str:
    """The id storage knows a session by: derived from the client's (the services here run without a key, so with
    the all-zero one)."""
    return str(uuid.UUID(bytes=sessionkeys.derive(sessionkeys.ZERO_KEY, uuid.UUID(str(session_id)).bytes)))


class Shards:
    """Replica sets s1, s2, ... of one sharded cluster; the map names the first `mapped` of them."""

    def __init__(self, name: str, etcd: EtcdCluster, shards: dict[str, HACluster]) -> None:
        self.name, self.etcd, self.shards = name, etcd, shards

    def access(self) -> cluster.Access:
        return cluster.Access(
            addresses=(), user="operator", password="operator", etcd=[m.url for m in self.etcd.members],
            cluster=self.name,
        )  # fmt: skip

    def init(self, names: list[str]) -> None:
        made = cluster.shards_init(self.access(), names, BUCKETS)
        assert made["status"] == "OK", made

    @contextlib.contextmanager
    def service(self, instance_id: str, events_listen: str = "") -> Iterator[Running]:
        any_node = next(iter(self.shards["s1"].nodes.values()))
        settings = service_settings(
            any_node, tarantool=(), etcd=tuple(m.url for m in self.etcd.members), cluster=self.name, workers=10,
            events_listen=events_listen, instance_id=instance_id,
        )  # fmt: skip
        with running_service(replace(settings)) as svc:
            yield svc

    def ask(self, shard: str, procedure: str, *args: Any) -> dict[str, Any]:
        c = self.shards[shard]
        answer = c.call(c.leader(), procedure, *args)
        assert answer is not None, f"{shard}'s leader did not answer {procedure}"
        return answer

    def map(self) -> dict[str, Any]:
        doc, _ = moves.read_map(self.access())
        return doc

    def check_placement(self) -> dict[str, int]:
        """Every bucket active on exactly the shard the map names, its rows there and nowhere else, no move
        left; the buckets each shard holds."""
        owner = moves.owners(self.map())
        held = {s: self.ask(s, "buckets_held") for s in self.shards}
        for s, h in held.items():
            assert h["moving"] == [], f"{s} has moves left: {h['moving']}"
            for b, _gen in h["active"]:
                assert owner[b] == s, f"bucket {b} active on {s}, the map says {owner[b]}"
        for b in range(BUCKETS):
            on = [s for s, h in held.items() if any(x[0] == b for x in h["active"])]
            assert on == [owner[b]], f"bucket {b} active on {on}, the map says {owner[b]}"
            for s in self.shards:
                rows = self.ask(s, "bucket_state", b)["rows"]
                if s != owner[b]:
                    assert rows == 0, f"bucket {b}: {rows} rows left on {s}, which does not own it"
        return {s: len(h["active"]) for s, h in held.items()}


@contextlib.contextmanager
def make_shards(tmp_path: Path, count: int) -> Iterator[Shards]:
    etcd = EtcdCluster.create(tmp_path)
    etcd.start()
    shards: dict[str, HACluster] = {}
    try:
        etcd.wait_ready()
        name = f"r{random.randrange(1 << 30)}"
        for i in range(1, count + 1):
            s = f"s{i}"
            env = ha_env(etcd, topology.shard_cluster(name, s))
            nodes = {f"{s}-{j}": Tarantool.create(f"{s}-{j}", tmp_path, extra_env=env) for j in (1, 2, 3)}
            shards[s] = HACluster(tmp_path, etcd, nodes)
            for node in nodes.values():
                node.start()
        for c in shards.values():
            leader = c.leader()
            for n in c.nodes:
                if n != leader:
                    c.wait_role(n, "follower")
        yield Shards(name, etcd, shards)
    finally:
        for c in shards.values():
            c.close_conns()
            for node in c.nodes.values():
                node.stop()
        etcd.stop()
        etcd.cleanup()


@dataclass
class Writers:
    """Threads that create sessions for many clients and update them, remembering what was acknowledged."""

    endpoints: list[str]
    clients: int = 64
    stop: threading.Event = field(default_factory=threading.Event)
    #: session id -> (client, the last acknowledged value, values sent after it whose outcome is unknown)
    acked: dict[str, tuple[str, int, set[int]]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    calls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self, per_endpoint: int = 2) -> None:
        for i, endpoint in enumerate(self.endpoints * per_endpoint):
            t = threading.Thread(target=self._run, args=(endpoint, random.Random(i)), daemon=True)
            t.start()
            self.threads.append(t)

    def _run(self, endpoint: str, rnd: random.Random) -> None:
        c = Client(endpoint, timeout_s=10)
        mine: list[str] = []
        try:
            while not self.stop.is_set():
                with self.lock:
                    self.calls += 1
                if not mine or rnd.random() < 0.3:
                    client = f"client-{rnd.randrange(self.clients)}"
                    try:
                        r = c.session_create(client, data={"v": 0})
                    except RequestError as e:
                        with self.lock:
                            self.failed.append(f"create: {e}")
                        continue
                    if r.ok and r.session_id is not None:
                        sid = str(r.session_id)
                        mine.append(sid)
                        with self.lock:
                            self.acked[sid] = (client, 0, set())
                    else:
                        with self.lock:
                            self.failed.append(f"create: {r.status}")
                    continue
                sid = rnd.choice(mine)
                client, last, unknown = self.acked[sid]
                value = last + 1 + len(unknown)
                try:
                    r = c.session_update(sid, set={"v": value})
                except RequestError as e:
                    with self.lock:
                        self.failed.append(f"update: {e}")
                        self.acked[sid] = (client, last, {*unknown, value})
                    continue
                with self.lock:
                    if r.ok:
                        self.acked[sid] = (client, value, set())
                    else:
                        self.failed.append(f"update: {r.status}")
                        self.acked[sid] = (client, last, {*unknown, value})
        finally:
            c.close(linger_ms=0)

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def check(self, shards: Shards) -> int:
        """Every acknowledged session is on the shard its bucket names, with its last acknowledged value (or a
        later one whose answer was lost); returns how many were checked."""
        owner = moves.owners(shards.map())
        for sid, (client, last, unknown) in self.acked.items():
            home = owner[buckets.bucket_of(client, BUCKETS)]
            got = shards.ask(home, "session_get", stored(sid))
            assert got["status"] == "OK", f"{sid} of {client} acknowledged, not on {home}: {got}"
            value = (got.get("data") or {}).get("v")
            assert value == last or value in unknown, f"{sid}: v={value}, last acknowledged {last}"
        return len(self.acked)


class Sampler(threading.Thread):
    """Asks every shard's leader which buckets it serves, again and again: a bucket served by two shards at the
    same generation is two live copies (a bucket seen on two at two generations moved between the two reads)."""

    def __init__(self, shards: Shards) -> None:
        super().__init__(daemon=True)
        self.shards, self.stop, self.samples, self.doubled = shards, threading.Event(), 0, []  # type: ignore[var-annotated]
        self.links = moves.Links(shards.access())

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                seen: dict[int, set[tuple[str, int]]] = {}
                for s in self.shards.shards:
                    with contextlib.suppress(moves.MoveError):
                        for b, gen in self.links[s].call("buckets_held")["active"]:
                            seen.setdefault(b, set()).add((s, gen))
                for b, where in seen.items():
                    gens = [g for _, g in where]
                    if len(gens) != len(set(gens)):
                        self.doubled.append((b, sorted(where)))
                self.samples += 1
                time.sleep(0.05)
        finally:
            self.links.close()

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join(30)


def test_add_a_third_shard_and_rebalance_under_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with make_shards(tmp_path, 3) as three:
        three.init(["s1", "s2"])
        with three.service("svc-a", events_listen="tcp://127.0.0.1:0") as a, three.service("svc-b") as b:
            writers = Writers([a.endpoint, b.endpoint])
            writers.start()
            try:
                time.sleep(2)
                added = moves.shard_add(three.access(), "s3")
                assert added["status"] == "OK", added
                assert added["shards"] == ["s1", "s2", "s3"]
                assert moves.shard_add(three.access(), "s3")["status"] == "OK"  # again: nothing changes
                # each shard add written to the audit before it acted and with its outcome, on the map's shards
                found = audit.read(three.access(), after={}, limit=100, shard_names=["s1", "s2", "s3"])
                assert found["errors"] == {}, found
                mine = [e for e in found["entries"] if e["action"] == "cluster.shard_add"]
                assert [(e["target"], e["details"]["phase"], e["shard"]) for e in mine] == [("s3", "asked", "s1"),
                        ("s3", "done", "s1")] * 2, mine  # fmt: skip
                assert mine[0]["who"] == audit.UNATTENDED.who
                # smartcache-cli audit reads every shard's, and says where each goes on from
                etcd_urls = ",".join(m.url for m in three.etcd.members)
                argv = ["--json", "audit", "--tarantool", "", "--etcd", etcd_urls, "--cluster", three.name]
                capsys.readouterr()
                assert cli_main(argv) == 0
                # the JSON lines the CLI printed (the in-process services' debug lines share stdout)
                out = capsys.readouterr().out.splitlines()
                printed = [json.loads(line) for line in out if line.startswith("{")]
                assert [e["seq"] for e in printed[:-1] if e["action"] == "cluster.shard_add"] == [
                    e["seq"] for e in mine
                ]
                assert set(printed[-1]["next"]) == {"s1", "s2", "s3"}
                publisher = a.service.events
                assert publisher is not None
                eventually(lambda: "s3" in publisher.cursors, 20, what="the publisher reads the new shard's log")
                plan = moves.plan_even(three.map(), ["s1", "s2", "s3"])
                assert len(plan) == BUCKETS // 3, plan
                with Sampler(three) as sampler:
                    result = moves.run_moves(three.access(), plan, parallel=2)
                    time.sleep(1)
                assert result["status"] == "OK", result
                assert result["moved"] == len(plan)
                assert result["rows"] > 0
                time.sleep(1)  # writes go on to every shard after the moves
            finally:
                writers.finish()
            assert sampler.samples > 5
            assert sampler.doubled == [], f"buckets active on two shards at once: {sampler.doubled[:5]}"
            held = three.check_placement()
            assert sorted(held.values()) == [10, 11, 11], held
            checked = writers.check(three)
            assert checked > 50
            assert writers.calls > 100
            print(f"moved {result['moved']} buckets, {result['rows']} rows, {result['buckets_per_s']} buckets/s, "
                  f"pause p99 {result['paused_ms']['p99']} ms; {checked} sessions checked, "
                  f"{len(writers.failed)} of {writers.calls} calls not acknowledged: "
                  f"{collections.Counter(f.split(' (')[0] for f in writers.failed).most_common(5)}")  # fmt: skip


def test_drain_a_shard_under_load_and_a_stale_copy_left_by_a_dead_driver_is_settled(tmp_path: Path) -> None:
    with make_shards(tmp_path, 2) as two:
        two.init(["s1", "s2"])
        with two.service("svc-a") as a:
            assert a.service.settler is not None
            writers = Writers([a.endpoint])
            writers.start()
            try:
                time.sleep(1)
                owner = moves.owners(two.map())
                # A driver that died after send_start and one chunk: the bucket paused on s1, a partial copy on s2.
                b = owner.index("s1")
                links = moves.Links(two.access())
                try:
                    gen = links["s1"].call("bucket_send_start", b, "s2", 1)["generation"]
                    assert links["s2"].call("bucket_recv_start", b, "s1", gen)["status"] == "OK"
                finally:
                    links.close()
                seen = cluster.status(two.access())["shards"]
                assert [(m["bucket"], m["state"], m["peer"]) for m in seen["s1"]["buckets"]["moving"]] == [
                    (b, "sending", "s2")
                ], seen["s1"]["buckets"]
                assert [(m["bucket"], m["state"]) for m in seen["s2"]["buckets"]["moving"]] == [(b, "receiving")]
                assert "1 moving" in output.sharded_status(cluster.status(two.access()))
                a.service.settler.interval_s = 0.5
                eventually(
                    lambda: metric(a.metrics_url, "smartcache_buckets_moving", {"shard": "s1"}) == 1, 10,
                    what="the settler's gauge: one bucket of s1 moving",
                )  # fmt: skip
                stall = moves.settler.STALL_S
                moves.settler.STALL_S = 1.0
                try:
                    eventually(
                        lambda: two.ask("s1", "bucket_state", b)["state"] == "active", 20,
                        what="the settler of the service gives the dead driver's move up",
                    )  # fmt: skip
                    eventually(lambda: two.ask("s2", "bucket_state", b)["state"] is None, 20, what="copy deleted")
                finally:
                    moves.settler.STALL_S = stall
                assert two.ask("s1", "bucket_state", b)["generation"] == gen + 1  # the old copy can never be active
                plan = moves.plan_even(two.map(), ["s1", "s2"], away=["s2"])
                with Sampler(two) as sampler:
                    result = moves.run_moves(two.access(), plan, parallel=2)
                assert result["status"] == "OK", result
            finally:
                writers.finish()
            assert sampler.doubled == []
            held = two.check_placement()
            assert held == {"s1": BUCKETS, "s2": 0}
            eventually(
                lambda: metric(a.metrics_url, "smartcache_buckets_active", {"shard": "s1"}) == BUCKETS
                and metric(a.metrics_url, "smartcache_buckets_moving") == 0, 10, what="the gauges: all on s1",
            )  # fmt: skip
            assert json.loads(json.dumps(two.map()))["ranges"] == [[0, BUCKETS - 1, "s1"]]
            writers.check(two)


def test_a_move_left_past_send_done_is_finished_by_the_service_with_no_command(tmp_path: Path) -> None:
    with make_shards(tmp_path, 2) as two:
        two.init(["s1", "s2"])
        with two.service("svc-a") as a:
            assert a.service.settler is not None
            a.service.settler.interval_s = 0.5
            owner = moves.owners(two.map())
            b = owner.index("s1")
            client = next(f"c{i}" for i in range(10_000) if buckets.bucket_of(f"c{i}", BUCKETS) == b)
            sid = a.client.session_create(client, data={"v": 1}).session_id
            assert sid is not None
            # A driver that copied everything and turned the source sent, then died.
            links = moves.Links(two.access())
            try:
                gen = links["s1"].call("bucket_send_start", b, "s2", 1)["generation"]
                links["s2"].call("bucket_recv_start", b, "s1", gen)
                for space in moves.SPACES:
                    page = links["s1"].call("bucket_rows", b, gen, space, None, 1000)
                    if page["rows"]:
                        links["s2"].call("bucket_recv", b, gen, space, page["rows"])
                assert links["s1"].call("bucket_send_done", b, gen)["status"] == "OK"
                # A driver (or settler) that took the move for stalled and gives it up now finds the source sent:
                # it goes forward, never deleting the destination's copy (the only one that can become active).
                assert moves.give_up(links, b, "s1", "s2", gen) == "forward"
                assert links["s2"].call("bucket_state", b)["state"] == "active"
            finally:
                links.close()
            # The front server's read waits out the pause (BUCKET_MOVING, then the new owner) within its lifetime.
            got = a.client.session_get(sid)
            assert got.ok, got
            assert got.body["data"] == {"v": 1}
            eventually(lambda: moves.owners(two.map())[b] == "s2", 20, what="the map names s2")
            eventually(lambda: two.ask("s1", "bucket_state", b)["state"] is None, 20, what="s1's garbage deleted")
            assert two.ask("s2", "bucket_state", b)["state"] == "active"
            assert a.client.session_update(sid, set={"v": 2}).ok
            assert two.ask("s2", "session_get", stored(sid))["data"] == {"v": 2}
            two.check_placement()


def test_a_move_whose_source_leader_freezes_mid_copy_goes_on_on_the_new_leader_in_about_a_failover(
    tmp_path: Path,
) -> None:
    """The driver's call on a frozen leader (it answers nothing, its socket stays open) is dropped once the leader
    key names another instance, and asked of the new leader: the copy goes on about a failover after the freeze,
    not after the call's own timeout (ANSWER_TIMEOUT_S), and the move ends with the bucket active on s2 only."""
    with make_shards(tmp_path, 2) as two:
        two.init(["s1", "s2"])
        b = moves.owners(two.map()).index("s1")
        client = next(f"c{i}" for i in range(10_000) if buckets.bucket_of(f"c{i}", BUCKETS) == b)
        sids = [two.ask("s1", "session_create", None, client, None, 600, {"v": i})["session_id"] for i in range(6)]
        s1 = two.shards["s1"]
        frozen = s1.leader()
        links = moves.Links(two.access())
        try:
            gen = links["s1"].call("bucket_send_start", b, "s2", 1)["generation"]
            assert links["s2"].call("bucket_recv_start", b, "s1", gen)["status"] == "OK"
            page = links["s1"].call("bucket_rows", b, gen, "sessions", None, 2)
            assert links["s2"].call("bucket_recv", b, gen, "sessions", page["rows"])["status"] == "OK"
            s1.nodes[frozen].send_signal(signal.SIGSTOP)
            try:
                started = time.monotonic()
                page = links["s1"].call("bucket_rows", b, gen, "sessions", page["last"], 2)
                took = time.monotonic() - started
                assert page["status"] == "OK", page
                assert links["s1"].leader != f"127.0.0.1:{s1.nodes[frozen].port}", "asked of the frozen one"
                assert links["s1"].dropped == 1
                assert took < moves.ANSWER_TIMEOUT_S, f"{took:.1f} s: waited for the call's timeout"
                while True:
                    assert links["s2"].call("bucket_recv", b, gen, "sessions", page["rows"])["status"] == "OK"
                    if page["done"]:
                        break
                    page = links["s1"].call("bucket_rows", b, gen, "sessions", page["last"], 2)
                assert links["s1"].call("bucket_send_done", b, gen)["status"] == "OK"
                assert links["s2"].call("bucket_recv_done", b, gen)["status"] == "OK"
                moves.assign(two.access(), {b: "s2"}, was={b: "s1"})
                assert links["s1"].call("bucket_gc", b, gen)["status"] == "OK"
            finally:
                s1.nodes[frozen].send_signal(signal.SIGCONT)
        finally:
            links.close()
        print(f"the copy went on {took:.1f} s after the source's leader froze (TTL {TTL_S} s)")
        s1.wait_role(frozen, "follower", 60)
        two.check_placement()
        for i, sid in enumerate(sids):
            assert two.ask("s2", "session_get", sid)["data"] == {"v": i}
