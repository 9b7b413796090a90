"""`smartcache --processes 2`: one endpoint, two real service processes behind a ZeroMQ proxy, one metrics view."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import zmq
import zmq.auth
from prometheus_client.parser import text_string_to_metric_families

from smartcache.client.base import request_frames
from smartcache.devstack.stack import Tarantool
from smartcache.wire import FLAG_DATA_ERROR, REGISTRY, STATUS, TRANSPORT_ERROR, Header, decode_body, decode_header
from smartcache.wire import encode_header as encode
from tests.conftest import service_env
from tests.helpers import eventually, metric
from tests.tcpproxy import DELAY_REPLIES, TcpProxy

PROCESSES = 2
#: each client's bad-input answers per second and child: low, so that one client runs out of them
BAD_INPUT_PER_PEER_PER_S = 5
GOOD_HEADER = encode(Header.request(REGISTRY.types["CACHE_GET"].id, request_id=5))


@dataclasses.dataclass
class Parent:
    proc: subprocess.Popen[bytes]
    endpoint: str
    metrics_port: int
    log_path: Path

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def health(self, path: str = "/health/ready") -> tuple[int, dict]:
        r = httpx.get(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=10)
        return r.status_code, r.json()

    def child_pids(self) -> list[int]:
        _, doc = self.health()
        return [doc["processes"][str(i)]["pid"] for i in range(PROCESSES)]

    def log_lines(self) -> list[dict]:
        lines = []
        for line in self.log_path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                lines.append(json.loads(line))
        return lines


@contextlib.contextmanager
def parent_process(tarantool_address: str, tmp_path: Path, **env: str) -> Iterator[Parent]:
    """`python -m smartcache.server --processes 2` on free ports, ready (every child ready); stopped by PID."""
    full_env, port, metrics_port = service_env(
        tarantool_address, SMARTCACHE_DRAIN_TIMEOUT_S="10", SMARTCACHE_LOG_LEVEL="info", **env
    )
    log_path = tmp_path / "parent.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "smartcache.server", "--processes", str(PROCESSES)],
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    parent = Parent(proc, f"tcp://127.0.0.1:{port}", metrics_port, log_path)

    def ready() -> bool:
        assert proc.poll() is None, f"the parent exited {proc.returncode}: {log_path.read_text()[-3000:]}"
        try:
            return parent.health()[0] == 200
        except httpx.HTTPError:
            return False

    try:
        eventually(ready, 60, interval_s=0.1, what="every process ready")
        yield parent
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


def gone(pid: int) -> bool:
    """The process has exited (a zombie nobody reaped yet counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "State:\tZ" in status


@pytest.fixture(scope="module")
def parent(storage: Tarantool, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Parent]:
    with parent_process(
        storage.address,
        tmp_path_factory.mktemp("processes"),
        SMARTCACHE_BAD_INPUT_PER_PEER_PER_S=str(BAD_INPUT_PER_PEER_PER_S),
    ) as p:
        yield p


def dealer(endpoint: str, socket_type: int = zmq.DEALER) -> zmq.Socket[bytes]:
    sock = zmq.Context.instance().socket(socket_type)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


Replies = dict[int, tuple[Header, dict]]


def exchange(
    sock: zmq.Socket[bytes], messages: dict[int, list[bytes]], timeout_ms: int = 20_000
) -> tuple[Counter[int], Replies]:
    """Send every message, then read until each request id has an answer, and what else arrives at once:
    (request id -> answers received, request id -> its last answer)."""
    for frames in messages.values():
        sock.send_multipart(frames)
    answers: Counter[int] = Counter()
    replies: Replies = {}
    while set(answers) < set(messages) and sock.poll(timeout_ms):
        frames = sock.recv_multipart()
        header = decode_header(frames[0], check_type=False)
        answers[header.request_id] += 1
        replies[header.request_id] = (header, decode_body(frames[1]))
    while sock.poll(200):  # anything more already on its way: a second answer
        frames = sock.recv_multipart()
        answers[decode_header(frames[0], check_type=False).request_id] += 1
    return answers, replies


def oks(replies: Replies) -> int:
    return sum(1 for _, body in replies.values() if body["status"] == STATUS["OK"])


def samples(url: str) -> dict[str, list]:
    """family name -> its samples, from one scrape; fails if a family appears twice."""
    text = httpx.get(url, timeout=10).text
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types)), "a family written twice"
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


# -- every message answered exactly once, by both processes ---------------------------------------


def test_every_request_of_several_clients_is_answered_exactly_once_and_both_processes_serve(parent: Parent) -> None:
    clients, per_client = 4, 400
    results: list[tuple[Counter[int], Counter[int], int, int]] = []

    def client(n: int) -> None:
        sock = dealer(parent.endpoint)
        try:
            creates = {
                rid: request_frames(
                    "SESSION_CREATE",
                    {"client_id": f"proc-{n}-{rid}", "data": rid},
                    request_id=rid,
                    session_id=None,
                    lifetime_ms=0,
                    no_reply=False,
                )
                for rid in range(1, per_client + 1)
            }
            created, replies = exchange(sock, creates)
            sids = {rid: uuid.UUID(bytes=header.session_id) for rid, (header, _) in replies.items()}
            gets = {
                per_client + rid: request_frames(
                    "SESSION_GET", None, request_id=per_client + rid, session_id=sid, lifetime_ms=0, no_reply=False
                )
                for rid, sid in sids.items()
            }
            got, found = exchange(sock, gets)
            results.append((created, got, oks(replies), oks(found)))
        finally:
            sock.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == clients
    for created, got, made, found in results:
        assert set(created) == set(range(1, per_client + 1))
        assert set(created.values()) == {1}, "a create answered twice"
        assert set(got) == set(range(per_client + 1, 2 * per_client + 1))
        assert set(got.values()) == {1}, "a get answered twice"
        assert (made, found) == (per_client, per_client)  # every session made, and found by whichever process
    served = [
        metric(parent.metrics_url, "smartcache_messages_total", {"type": "session_create", "process": str(i)})
        for i in range(PROCESSES)
    ]
    assert all(n > 0 for n in served), f"creates by process: {served}"


# -- one metrics view ---------------------------------------------------------------------------


def test_the_parents_metrics_hold_each_family_once_with_both_processes_and_counts_that_add_up(parent: Parent) -> None:
    def pings() -> float:
        return metric(parent.metrics_url, "smartcache_messages_total", {"type": "ping", "outcome": "ok"})

    before = pings()
    sock = dealer(parent.endpoint)
    try:
        n = 300
        messages = {
            rid: request_frames("PING", None, request_id=rid, session_id=None, lifetime_ms=0, no_reply=False)
            for rid in range(1, n + 1)
        }
        answers, _ = exchange(sock, messages)
    finally:
        sock.close()
    assert answers == dict.fromkeys(messages, 1)
    assert pings() - before == n
    families = samples(parent.metrics_url)
    for name in ("smartcache_messages", "smartcache_request_duration_seconds", "smartcache_queue_depth"):
        assert {s.labels["process"] for s in families[name]} == {"0", "1"}, name
    assert {s.labels["process"]: s.value for s in families["smartcache_process_up"]} == {"0": 1.0, "1": 1.0}
    assert [s.value for s in families["smartcache_processes"]] == [PROCESSES]
    # the histogram's counts add up too: every ping observed once, by one process
    ping_counts = [
        s.value
        for s in families["smartcache_request_duration_seconds"]
        if s.name.endswith("_count") and s.labels["type"] == "ping"
    ]
    assert len(ping_counts) == PROCESSES
    assert sum(ping_counts) >= n


def test_health_is_ready_with_each_processs_own_answer(parent: Parent) -> None:
    code, doc = parent.health()
    assert code == 200
    assert doc["checks"] == {"proxy": True, "accepting": True, "process_0": True, "process_1": True}
    assert {doc["processes"][str(i)]["status"] for i in range(PROCESSES)} == {"pass"}
    assert parent.health("/health/live")[0] == 200


def test_children_log_their_process_index(parent: Parent) -> None:
    started = [line for line in parent.log_lines() if line.get("event") == "service_started"]
    assert sorted(line["process"] for line in started) == list(range(PROCESSES))


# -- bad input through the proxy ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frames", "error", "request_id"),
    [
        ([GOOD_HEADER], "BAD_FRAMES", 5),
        ([GOOD_HEADER, b"", b"extra"], "BAD_FRAMES", 5),
        ([GOOD_HEADER[:20], b""], "BAD_HEADER", 0),
        ([b"\x02" + GOOD_HEADER[1:], b""], "UNSUPPORTED_VERSION", 5),
        ([GOOD_HEADER, b"\x81\xa3key\xc1"], "BAD_BODY", 5),
    ],
    ids=["one-frame", "three-frames", "short-header", "version", "bad-msgpack"],
)
def test_bad_input_through_the_proxy_gets_its_precise_error(
    parent: Parent, frames: list[bytes], error: str, request_id: int
) -> None:
    sock = dealer(parent.endpoint)
    try:
        sock.send_multipart(frames)
        assert sock.poll(10_000), "no answer"
        reply = sock.recv_multipart()
    finally:
        sock.close()
    header, body = decode_header(reply[0], check_type=False), decode_body(reply[1])
    assert header.transport_error == TRANSPORT_ERROR[error]
    assert header.flags & FLAG_DATA_ERROR
    assert header.request_id == request_id
    assert body["error"] == error


def test_a_req_client_is_answered_through_the_proxy(parent: Parent) -> None:
    """A REQ socket's empty delimiter comes after the proxy's hop and the client's identity."""
    sock = dealer(parent.endpoint, zmq.REQ)
    try:
        sock.send_multipart(request_frames("PING", None, request_id=9, session_id=None, lifetime_ms=0, no_reply=False))
        assert sock.poll(10_000), "no answer"
        header = decode_header(sock.recv_multipart()[0])
    finally:
        sock.close()
    assert (header.request_id, header.transport_error) == (9, 0)


def test_the_bad_input_rate_is_each_clients_not_the_proxys(parent: Parent) -> None:
    """A client that sends garbage past its rate is left unanswered; another client behind the same proxy
    is still answered (the rate keys on the client's identity, not on the proxy's hop)."""
    flood, other = dealer(parent.endpoint), dealer(parent.endpoint)
    try:
        sent = 20 * BAD_INPUT_PER_PEER_PER_S
        for _ in range(sent):
            flood.send_multipart([GOOD_HEADER])
        other.send_multipart([GOOD_HEADER])  # right behind the flood, within the same second
        assert other.poll(10_000), "the other client was throttled with the flooder"
        assert decode_body(other.recv_multipart()[1])["error"] == "BAD_FRAMES"
        answered = 0
        while flood.poll(1000):
            flood.recv_multipart()
            answered += 1
        assert answered < sent  # the flooder was throttled
    finally:
        flood.close()
        other.close()
    assert metric(parent.metrics_url, "smartcache_bad_input_throttled_total") > 0


def test_an_absurdly_large_frame_disconnects_its_sender_and_the_proxy_keeps_serving(parent: Parent) -> None:
    sock = dealer(parent.endpoint)
    try:
        sock.send_multipart([GOOD_HEADER, b"\x00" * 8_000_000])
        assert sock.poll(1000) == 0  # never buffered, never answered
    finally:
        sock.close()
    sock = dealer(parent.endpoint)
    try:
        assert set(exchange(sock, {1: [GOOD_HEADER, b"\x80"]})[0].values()) == {1}
    finally:
        sock.close()
    assert all(parent.proc.poll() is None and not gone(pid) for pid in parent.child_pids())


# -- lifecycle ---------------------------------------------------------------------------------


def test_sigterm_drains_every_process_answers_what_is_in_flight_once_and_exits_0(
    fresh_master: Tarantool, tmp_path: Path
) -> None:
    with TcpProxy(fresh_master.port) as slow, parent_process(slow.address, tmp_path) as p:
        pids = p.child_pids()
        slow.set_mode(DELAY_REPLIES, delay_s=0.4)  # each storage answer late: requests are running at the stop
        sock = dealer(p.endpoint)
        try:
            n = 60
            for rid in range(1, n + 1):
                sock.send_multipart(
                    request_frames(
                        "SESSION_CREATE",
                        {"client_id": f"drain-{rid}"},
                        request_id=rid,
                        session_id=None,
                        lifetime_ms=20_000,
                        no_reply=False,
                    )
                )
            eventually(lambda: metric(p.metrics_url, "smartcache_workers_busy") > 0, what="requests running")
            os.kill(p.proc.pid, signal.SIGTERM)
            answers: Counter[int] = Counter()
            outcomes: Counter[str] = Counter()
            while sock.poll(20_000):
                frames = sock.recv_multipart()
                header = decode_header(frames[0], check_type=False)
                answers[header.request_id] += 1
                body = decode_body(frames[1])
                outcomes["OK" if body["status"] == STATUS["OK"] else body.get("error", "?")] += 1
                if len(answers) == n and sock.poll(200) == 0:
                    break
        finally:
            sock.close()
        assert p.proc.wait(60) == 0
        assert set(answers) == set(range(1, n + 1))
        assert set(answers.values()) == {1}
        assert set(outcomes) <= {"OK", "SHUTTING_DOWN"}, outcomes
        assert outcomes["OK"] > 0
        eventually(lambda: all(gone(pid) for pid in pids), what="every child gone")
        events = [line.get("event") for line in p.log_lines()]
        assert events.count("service_stopped") == PROCESSES
        assert "processes_stopped" in events


def ping_frames(first: int, n: int) -> dict[int, list[bytes]]:
    return {
        rid: request_frames("PING", None, request_id=rid, session_id=None, lifetime_ms=0, no_reply=False)
        for rid in range(first, first + n)
    }


def assert_each_answered_once(endpoint: str, messages: dict[int, list[bytes]]) -> None:
    sock = dealer(endpoint)
    try:
        assert exchange(sock, messages)[0] == dict.fromkeys(messages, 1)
    finally:
        sock.close()


def test_a_child_that_dies_is_started_again_and_the_endpoint_keeps_serving(storage: Tarantool, tmp_path: Path) -> None:
    with parent_process(storage.address, tmp_path) as p:
        first = p.child_pids()
        os.kill(first[1], signal.SIGKILL)
        eventually(lambda: gone(first[1]), what="the child killed")
        # Once the parent has seen the death, before the restart: none is handed to the dead one.
        eventually(lambda: any(x.get("event") == "process_died" for x in p.log_lines()), what="process_died")
        assert_each_answered_once(p.endpoint, ping_frames(1000, 50))
        eventually(lambda: p.health()[0] == 200 and p.child_pids()[1] != first[1], 30, 0.1, "process 1 again")
        assert p.child_pids()[0] == first[0]
        assert_each_answered_once(p.endpoint, ping_frames(1, 50))
        assert metric(p.metrics_url, "smartcache_process_restarts_total", {"process": "1"}) == 1
        died = [line for line in p.log_lines() if line.get("event") == "process_died"]
        assert [(d["process"], d["pid"]) for d in died] == [(1, first[1])]
        assert p.proc.poll() is None


def test_kill_9_of_the_parent_leaves_no_child(storage: Tarantool, tmp_path: Path) -> None:
    with parent_process(storage.address, tmp_path) as p:
        pids = p.child_pids()
        os.kill(p.proc.pid, signal.SIGKILL)
        p.proc.wait(10)
        eventually(lambda: all(gone(pid) for pid in pids), 30, 0.1, "every child gone after the parent's kill -9")


def test_curve_with_processes_stops_at_start_naming_both_settings(tmp_path: Path) -> None:
    _, key = zmq.auth.create_certificates(str(tmp_path), "server")
    env = {
        **os.environ,
        "SMARTCACHE_CURVE_SECRET_KEY_FILE": str(key),
        "SMARTCACHE_CURVE_CLIENTS_DIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-m", "smartcache.server", "--processes", "2"],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    line = next(json.loads(x) for x in done.stdout.decode().splitlines() if '"bad_settings"' in x)
    assert "SMARTCACHE_PROCESSES=2" in line["error"]
    assert "SMARTCACHE_CURVE_SECRET_KEY_FILE" in line["error"]
