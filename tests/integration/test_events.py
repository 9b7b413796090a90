"""The event log through the service (issue 16): what a change writes reaches a front server subscribed to
another service instance; EVENTS_READ answers at once or waits for a commit within its bulkhead and lifetime;
a subscriber killed and restarted mid-stream gets every event exactly once, in order."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import zmq
import zmq.auth

from smartcache.client import Client, CurveKeys, Event, Subscription
from smartcache.devstack.stack import Tarantool
from smartcache.server.parsers import parse_bulkheads
from smartcache.wire.errors import RequestError
from smartcache.wire.keys import create_key_pair
from tests.conftest import Running, running_service, service_settings
from tests.helpers import eventually, metric


@contextlib.contextmanager
def two_instances(storage: Tarantool, **overrides: object) -> Iterator[tuple[Running, Running]]:
    with (
        running_service(service_settings(storage, instance_id="ev-a", **overrides)) as a,
        running_service(service_settings(storage, instance_id="ev-b", **overrides)) as b,
    ):
        yield a, b


def _publisher(r: Running) -> str:
    assert r.service.events is not None
    return r.service.events.endpoint


def _reading(r: Running) -> bool:
    """The instance's reader has started (it publishes from the head it found)."""
    return r.service.events is not None and bool(r.service.events.cursors)


def _take(sub: Subscription, n: int, key_prefix: str, timeout_s: float = 10.0) -> list[Event]:
    """The next n events whose key starts with key_prefix (other tests' events are skipped)."""
    out: list[Event] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n:
        e = sub.poll(max(0.0, deadline - time.monotonic()))
        assert e is not None, f"{len(out)} of {n} events within {timeout_s} s: {out}"
        if e.key.startswith(key_prefix):
            out.append(e)
    return out


def test_each_change_reaches_a_subscriber_of_the_other_instance_in_order(storage: Tarantool) -> None:
    with two_instances(storage) as (a, b):
        eventually(lambda: _reading(a) and _reading(b), what="both readers started")
        with b.client.subscribe(["session.", "device."], publishers=_publisher(b)) as sub:
            created = a.client.session_create("client-ev", data={"n": 0})
            sid, handle = created.session_id, created.body["handle"]  # events name a session by handle
            assert a.client.session_update(sid, {"n": 1}).ok
            assert a.client.session_delete(sid).ok
            assert a.client.device_bind(f"{handle}-dev", "client-ev").ok
            got = _take(sub, 4, handle)
    assert [(e.topic, e.key) for e in got] == [
        ("session.created", handle),
        ("session.updated", handle),
        ("session.deleted", handle),
        ("device.bound", f"{handle}-dev"),
    ]
    assert [e.seq for e in got] == sorted(e.seq for e in got)
    assert got[0].payload == {"client_id": "client-ev"}
    assert got[1].payload == {"client_id": "client-ev", "rev": 2}


def test_with_nothing_connected_the_publisher_keeps_up_and_a_late_subscriber_reads_the_gap(svc: Running) -> None:
    eventually(lambda: _reading(svc), what="the reader started")
    assert metric(svc.metrics_url, "smartcache_events_subscribers") == 0
    start = svc.client.call("EVENTS_READ").body["head_seq"]
    sids = [svc.client.session_create("client-unwatched").body["handle"] for _ in range(5)]
    head = svc.client.call("EVENTS_READ").body["head_seq"]
    # Nobody listens: no message is built, but the cursor and the metrics follow the log (in batches).
    eventually(lambda: metric(svc.metrics_url, "smartcache_events_published_seq") >= head, what="cursor at the head")
    with svc.client.subscribe(["session.created"], from_seq=start + 1, publishers=_publisher(svc)) as sub:
        got: list[str] = []
        while len(got) < len(sids):
            e = sub.poll(10.0)
            assert e is not None, f"got {got}"
            if e.key in sids:
                got.append(e.key)
    assert got == sids, "every session's event once, in order, read from the log: nothing was connected"


def test_events_read_answers_at_once_or_waits_for_the_next_commit(svc: Running) -> None:
    c = svc.client
    head = c.call("EVENTS_READ").body["head_seq"]
    first = c.event_publish("app.read-now", {"n": 1}, key="k1")
    assert first.ok
    assert first.body["seq"] == head + 1
    r = c.call("EVENTS_READ", {"after_seq": head, "topics": ["app.read-now"]})
    assert [(e["seq"], e["key"], e["payload"]) for e in r.body["events"]] == [(head + 1, "k1", {"n": 1})]
    # Nothing new: it waits in storage and is woken by the commit of the next event.
    waiting = svc.client.twin()
    rid = waiting.send("EVENTS_READ", {"after_seq": head + 1, "wait_ms": 5000}, lifetime_ms=6000)
    eventually(lambda: metric(svc.metrics_url, "smartcache_events_readers_waiting") == 1, what="a reader waits")
    published = time.monotonic()
    second = c.event_publish("app.read-now", {"n": 2})
    reply = waiting.wait(rid, 6)
    woken_s = time.monotonic() - published
    waiting.close()
    assert [e["seq"] for e in reply.body["events"]] == [second.body["seq"]]
    assert woken_s < 0.5, f"answered {woken_s * 1000:.0f} ms after the commit"


def test_a_wait_is_cut_to_the_message_lifetime(svc: Running) -> None:
    """A fuzzed or careless wait_ms cannot outlive its message: the answer is an empty OK in time."""
    head = svc.client.call("EVENTS_READ").body["head_seq"]
    started = time.monotonic()
    r = svc.client.call("EVENTS_READ", {"after_seq": head + 10**9, "wait_ms": 60000}, lifetime_ms=300)
    took = time.monotonic() - started
    assert r.ok
    assert r.body["events"] == []
    assert 0.2 < took < 1.0, took


def test_cli_events_tail_prints_events_from_a_sequence_as_json_lines(svc: Running) -> None:
    topic = f"app.cli-{uuid.uuid4().hex[:8]}"
    seqs = [svc.client.event_publish(topic, {"n": n}, key=f"k{n}").body["seq"] for n in range(2)]
    assert svc.service.events is not None
    args = ["--endpoint", svc.endpoint, "events", "tail", "--topic", topic, "--from", str(seqs[0])]
    args += ["--publishers", svc.service.events.endpoint, "--count", "2"]
    cmd = [sys.executable, "-m", "smartcache.cli", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(e["seq"], e["topic"], e["key"], e["payload"]) for e in lines] == [
        (seqs[0], topic, "k0", {"n": 0}),
        (seqs[1], topic, "k1", {"n": 1}),
    ]


def test_with_curve_the_events_socket_takes_allowed_keys_only(storage: Tarantool, tmp_path: Path) -> None:
    server, clients = tmp_path / "server", tmp_path / "clients"
    for d in (server, clients):
        d.mkdir()
    zmq.auth.create_certificates(server, "smartcache")
    create_key_pair(clients, "front")
    curve = CurveKeys.from_files(server / "smartcache.key", clients / "front.key_secret")
    settings = service_settings(
        storage, curve_secret_key_file=str(server / "smartcache.key_secret"), curve_clients_dir=str(clients)
    )
    with running_service(settings) as r:
        assert r.service.events is not None
        endpoint = r.service.events.endpoint
        plain = zmq.Context.instance().socket(zmq.SUB)
        plain.setsockopt(zmq.LINGER, 0)
        plain.setsockopt(zmq.SUBSCRIBE, b"")
        plain.connect(endpoint)
        try:
            with (
                Client(r.endpoint, curve=curve, timeout_s=5) as c,
                c.subscribe(["app.curve"], publishers=endpoint) as sub,
            ):
                seq = c.event_publish("app.curve", {"secret": True}).body["seq"]
                got = sub.poll(5)
                assert got is not None
                assert (got.seq, got.payload) == (seq, {"secret": True})
            assert plain.poll(1500) == 0  # without CURVE: nothing, not even a heartbeat (one a second)
        finally:
            plain.close()


def test_bad_arguments_are_bad_request(svc: Running) -> None:
    c = svc.client
    assert c.event_publish("session.created", {}).status == "BAD_REQUEST"  # system topics are storage's
    assert c.event_publish("app.big", "x" * 70000).status == "BAD_REQUEST"
    assert c.call("EVENTS_READ", {"after_seq": -1}).status == "BAD_REQUEST"
    assert c.call("EVENTS_READ", {"after_seq": 0, "limit": 5000}).status == "BAD_REQUEST"
    assert c.call("EVENTS_READ", {"topics": "app."}).status == "BAD_REQUEST"  # a list


def test_waiting_readers_keep_to_their_bulkhead_while_sessions_pass(storage: Tarantool) -> None:
    """20 slots: EVENTS_READ may hold 2 (10 %); 10 long polls wait, sessions are answered meanwhile."""
    with running_service(service_settings(storage, workers=20, bulkheads=parse_bulkheads("", 20))) as r:
        head = r.client.call("EVENTS_READ").body["head_seq"]
        pollers = r.client.twin()
        rids = [
            pollers.send("EVENTS_READ", {"after_seq": head + 10**9, "wait_ms": 3000}, lifetime_ms=4000)
            for _ in range(10)
        ]
        busy = {"type": "events_read"}
        eventually(lambda: metric(r.metrics_url, "smartcache_workers_busy_by_type", busy) == 2, what="two wait")
        started = time.monotonic()
        for i in range(20):
            assert r.client.session_create(f"client-bulkhead-{i}").ok
        sessions_s = time.monotonic() - started
        assert metric(r.metrics_url, "smartcache_workers_busy_by_type", busy) <= 2
        outcomes = []
        for rid in rids:
            try:
                outcomes.append(pollers.wait(rid, 10).status)
            except RequestError as e:
                outcomes.append(e.transport_error)
        pollers.close()
    assert sessions_s < 2.0, f"20 sessions took {sessions_s:.2f} s beside the waiting readers"
    assert outcomes.count("OK") >= 2
    assert set(outcomes) <= {"OK", "EXPIRED"}, outcomes


# -- a subscriber killed and restarted mid-stream -------------------------------------------------------

SUBSCRIBER = textwrap.dedent(
    """
    import os, sys
    from smartcache.client import Client
    endpoint, publishers, topic, from_seq, out = sys.argv[1:6]
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with Client(endpoint, timeout_s=5) as c:
        for event in c.subscribe([topic], int(from_seq), publishers=publishers):
            os.write(fd, f"{event.seq}\\n".encode())  # processed: one write(2), so a kill never leaves half a line
    """
)


def _seqs(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().splitlines()] if path.exists() else []


class Producer(threading.Thread):
    """Publishes events of one topic through two service instances in turn; records the acknowledged sequences."""

    def __init__(self, endpoints: tuple[str, str], topic: str, count: int) -> None:
        super().__init__(daemon=True)
        self.endpoints, self.topic, self.count = endpoints, topic, count
        self.acked: list[int] = []

    def run(self) -> None:
        clients = [Client(e, timeout_s=5, retries=5) for e in self.endpoints]
        try:
            for i in range(self.count):
                reply = clients[i % 2].event_publish(self.topic, {"i": i}, key=str(i))
                assert reply.ok, reply.body
                self.acked.append(int(reply.body["seq"]))
                if i % 50 == 0:
                    time.sleep(0.005)  # about 2,000 events/s: the subscriber gets killed mid-stream
        finally:
            for c in clients:
                c.close()


def test_a_subscriber_killed_and_restarted_mid_stream_gets_every_event_once_in_order(
    storage: Tarantool, tmp_path: Path
) -> None:
    topic = f"app.restart-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "seqs.txt"
    with two_instances(storage) as (a, b):
        eventually(lambda: _reading(a) and _reading(b), what="both readers started")
        publishers = f"{_publisher(a)},{_publisher(b)}"
        first_seq = a.client.call("EVENTS_READ").body["head_seq"] + 1

        def subscriber(from_seq: int) -> subprocess.Popen[bytes]:
            args = [sys.executable, "-c", SUBSCRIBER, a.endpoint, publishers, topic, str(from_seq), str(out)]
            return subprocess.Popen(args, env={**os.environ, "PYTHONPATH": os.getcwd()})

        proc = subscriber(first_seq)
        producer = Producer((a.endpoint, b.endpoint), topic, 3000)
        try:
            producer.start()
            eventually(lambda: len(_seqs(out)) >= 500, timeout_s=30, what="the subscriber is mid-stream")
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            killed_at = len(_seqs(out))
            restart_from = _seqs(out)[-1] + 1
            proc = subscriber(restart_from)
            producer.join(60)
            assert not producer.is_alive()
            eventually(lambda: len(_seqs(out)) >= len(producer.acked), timeout_s=30, what="every event delivered")
            time.sleep(0.2)  # nothing more may come: a duplicate would arrive now
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
    got = _seqs(out)
    print(f"\nsubscriber killed after {killed_at} of {len(producer.acked)} events, restarted from {restart_from}")
    assert killed_at < len(producer.acked), "the kill came after the last event"
    assert got == producer.acked == sorted(producer.acked), "every event once, in order"


# -- what PROTOCOL.md 11 says since a client author had to guess it -------------------------------------


def test_an_event_published_without_key_or_payload_has_the_empty_key_and_a_nil_payload(svc: Running) -> None:
    eventually(lambda: _reading(svc), what="the reader started")
    topic = f"app.bare-{uuid.uuid4().hex[:8]}"
    with svc.client.subscribe([topic], publishers=_publisher(svc)) as sub:
        seq = svc.client.call("EVENT_PUBLISH", {"topic": topic}).body["seq"]
        streamed = sub.poll(10)
    read = svc.client.call("EVENTS_READ", {"after_seq": seq - 1, "limit": 1}).body["events"][0]
    assert (read["seq"], read["key"], read["payload"]) == (seq, "", None)
    assert streamed is not None
    assert (streamed.seq, streamed.key, streamed.payload) == (seq, "", None)


def test_a_cursor_beyond_the_head_is_answered_with_the_head_as_last_seq(svc: Running) -> None:
    """A reader that sends last_seq back, as it MUST, then gets the events that come after the head."""
    head = svc.client.call("EVENTS_READ").body["head_seq"]
    r = svc.client.call("EVENTS_READ", {"after_seq": head + 1000}).body
    assert (r["events"], r["last_seq"], r["head_seq"]) == ([], head, head)
    seq = svc.client.event_publish("app.after-head", {"n": 1}).body["seq"]
    r = svc.client.call("EVENTS_READ", {"after_seq": r["last_seq"], "topics": ["app.after-head"]}).body
    assert seq in [e["seq"] for e in r["events"]]


def test_a_session_expired_event_comes_at_the_deadline_whatever_the_longest_sweeper_sleep(tmp_path: Path) -> None:
    """SC_SWEEP_MAX_SLEEP_S = 30: a 1 s session's session.expired came up to 30 s after its deadline (13 s,
    as a client author saw it); a new session's deadline now wakes the sweeper."""
    storage = Tarantool.create("sweep", tmp_path, extra_env={"SC_SWEEP_MAX_SLEEP_S": "30"})
    try:
        storage.start()
        storage.wait_ready()
        with running_service(service_settings(storage)) as r:
            eventually(lambda: _reading(r), what="the reader started")
            time.sleep(1.5)  # the sweeper's first nap on an empty space is the longest: 30 s
            with r.client.subscribe(["session.expired"], publishers=_publisher(r)) as sub:
                created = time.monotonic()
                handle = r.client.session_create("client-sweep", ttl_s=1).body["handle"]
                got = _take(sub, 1, handle, timeout_s=10)
                took = time.monotonic() - created
    finally:
        storage.stop()
    assert got[0].topic == "session.expired"
    assert got[0].payload == {"client_id": "client-sweep", "reason": "idle"}
    assert 1.0 <= took < 1.5, f"session.expired {took:.2f} s after a 1 s session was created"
