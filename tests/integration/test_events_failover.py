"""Events across a leader failover (etcd + three Tarantool instances): the sequence stays gap-free, and a
subscriber gets every acknowledged event once, in order, while the leader is killed under load."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from smartcache.client import Client, Event, Subscription
from smartcache.wire.errors import RequestError
from tests.conftest import running_service, service_settings
from tests.helpers import eventually
from tests.integration.conftest_ha import TTL_S, HACluster, ha_cluster


@pytest.fixture
def ha(tmp_path: Path) -> Iterator[HACluster]:
    with ha_cluster(tmp_path) as c:
        c.leader()
        yield c


class Producer(threading.Thread):
    """Publishes app events numbered i = 0, 1, ...; each under its own idempotency key, sent again until
    acknowledged (so each i is applied once, whatever a failover answers meanwhile)."""

    def __init__(self, endpoint: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.topic = endpoint, topic
        #: (i, seq) acknowledged, and when
        self.acked: list[tuple[int, int, float]] = []
        self.errors: dict[str, int] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        with Client(self.endpoint, timeout_s=3) as c:
            i = 0
            while not self.stop.is_set():
                key = f"{self.topic}-{i}"
                try:
                    reply = c.event_publish(self.topic, {"i": i}, key=str(i), idempotency_key=key)
                except RequestError as e:
                    self.errors[e.transport_error] = self.errors.get(e.transport_error, 0) + 1
                    time.sleep(0.05)
                    continue  # the same i, the same key
                assert reply.ok, reply.body
                self.acked.append((i, int(reply.body["seq"]), time.monotonic()))
                i += 1
                time.sleep(0.002)


class Collector(threading.Thread):
    """Follows a subscription into a list."""

    def __init__(self, sub: Subscription) -> None:
        super().__init__(daemon=True)
        self.sub = sub
        self.got: list[Event] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                e = self.sub.poll(0.2)
                if e is not None:
                    self.got.append(e)
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_a_leader_failover_keeps_the_sequence_gap_free_and_loses_or_repeats_no_event(ha: HACluster) -> None:
    leader = ha.leader()
    addresses = tuple(i.address for i in ha.nodes.values())
    topic = "app.failover"
    with running_service(service_settings(ha.nodes["ha1"], tarantool=addresses, workers=20)) as r:
        events = r.service.events
        assert events is not None
        eventually(lambda: bool(events.cursors), what="the reader started")
        start = int(r.client.call("EVENTS_READ").body["head_seq"])
        sub = r.client.subscribe([topic], start + 1, publishers=events.endpoint)
        collector = Collector(sub)
        producer = Producer(r.endpoint, topic)
        collector.start()
        producer.start()
        try:
            eventually(lambda: len(producer.acked) >= 200, timeout_s=30, what="events flowing")
            killed_at = time.monotonic()
            ha.nodes[leader].send_signal(signal.SIGKILL)
            eventually(
                lambda: any(t > killed_at for _, _, t in producer.acked),
                timeout_s=TTL_S + 20,
                what="an event acknowledged by the new leader",
            )
            after = len(producer.acked)
            eventually(lambda: len(producer.acked) >= after + 200, timeout_s=30, what="events flowing again")
        finally:
            producer.stop.set()
            producer.join(10)
        acked = producer.acked
        eventually(
            lambda: len(collector.got) >= len(acked) or collector.error is not None,
            timeout_s=30,
            what=lambda: f"{len(collector.got)} of {len(acked)} delivered",
        )
        time.sleep(0.3)  # a duplicate would arrive now
        collector.stop.set()
        collector.join(5)
        sub.close()
        # The whole log after `start`, every topic, from the new leader: numbered without a gap.
        seqs, cursor = [], start
        while True:
            page = r.client.call("EVENTS_READ", {"after_seq": cursor, "limit": 1000}).body
            seqs += [e["seq"] for e in page["events"]]
            cursor = page["last_seq"]
            if cursor >= page["head_seq"]:
                break
    assert collector.error is None, collector.error
    recovered_s = min(t for _, _, t in acked if t > killed_at) - killed_at
    print(f"\n{len(acked)} events, leader killed after 200; first event acknowledged {recovered_s:.2f} s later")
    assert seqs == list(range(start + 1, start + 1 + len(seqs))), "the log has a gap"
    # A publish applied twice (a retry after OUTCOME_UNKNOWN without its key) would be an extra event here.
    delivered = [(e.payload["i"], e.seq) for e in collector.got]
    assert delivered == [(i, seq) for i, seq, _ in acked], "every acknowledged event once, in order"
