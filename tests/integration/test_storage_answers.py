"""What the service answers when storage fails in ways the fault suite found (tests/faults):
a leader this service alone cannot reach, a synchronous write rolled back for want of a quorum,
and a storage wall clock that jumps. Real Tarantool (HA with etcd where failover matters), real
ZeroMQ, real faults: a TCP proxy that black-holes one link, SIGSTOP, libfaketime."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog

from smartcache.client import Client, Reply
from smartcache.devstack.stack import Tarantool
from smartcache.server import logs
from smartcache.wire.errors import RequestError
from tests.conftest import Running, running_service, service_settings
from tests.helpers import eventually, metric
from tests.integration.conftest_ha import HACluster, ha_cluster
from tests.tcpproxy import BLACKHOLE, PASS, TcpProxy

pytestmark = pytest.mark.slow

FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")


def _answer(fn: Callable[[], Reply]) -> str:
    """The transport error a call ends with ('NONE' when it was answered), 'TIMEOUT' when the client gave up."""
    try:
        fn()
    except RequestError as e:
        return e.transport_error
    return "NONE"


def _answers(
    c: Client, n: int, type_name: str, body: dict, *, lifetime_ms: int = 0, timeout_s: float = 10
) -> Counter[str]:
    """Send n requests at once, then collect how each was answered."""
    rids = [c.send(type_name, body, lifetime_ms=lifetime_ms) for _ in range(n)]
    return Counter(_answer(lambda rid=rid: c.wait(rid, timeout_s=timeout_s)) for rid in rids)


@pytest.fixture
def ha(tmp_path: Path) -> Iterator[HACluster]:
    with ha_cluster(tmp_path) as c:
        yield c


def _stalled(r: Running, address: str) -> bool:
    return metric(r.metrics_url, "smartcache_storage_state_changes_total", {"address": address, "state": "stalled"}) > 0


# -- a leader this service cannot reach ------------------------------------------------------


def test_a_service_cut_off_from_a_leader_the_followers_still_follow_answers_storage_unavailable_at_once(
    ha: HACluster,
) -> None:
    """Fault suite, partition-service-leader: the followers still follow the leader (no election is
    coming), so waiting for one only made the answer late, or EXPIRED when the deadline sweep came first."""
    leader = ha.leader()
    with TcpProxy(ha.nodes[leader].port) as proxy:
        addresses = tuple(proxy.address if n == leader else node.address for n, node in ha.nodes.items())
        with running_service(service_settings(ha.nodes[leader], tarantool=addresses, workers=40)) as r:
            c = r.client
            assert c.session_create("client-cut").ok
            proxy.set_mode(BLACKHOLE)
            eventually(lambda: _stalled(r, proxy.address), what="the leader's link stalls")
            # The default lifetime (2 s), 20 at once: every one STORAGE_UNAVAILABLE, none EXPIRED.
            assert _answers(c, 20, "SESSION_CREATE", {"client_id": "c-cut"}) == {"STORAGE_UNAVAILABLE": 20}
            # Not at the end of the lifetime: a 30 s lifetime is answered within the client's 5 s.
            late = _answer(lambda: c.call("SESSION_CREATE", {"client_id": "c"}, lifetime_ms=30_000, timeout_s=5))
            assert late == "STORAGE_UNAVAILABLE"
            assert ha.leader() == leader  # nobody else was elected meanwhile
            proxy.set_mode(PASS)
            eventually(lambda: _answer(lambda: c.session_create("client-healed")) == "NONE", what="writes again")


def test_while_an_election_is_coming_writes_wait_for_it_and_none_is_answered_expired(ha: HACluster) -> None:
    """A frozen leader: the followers stop hearing from it and elect another after the TTL. Meanwhile
    a write waits for the new leader, or is answered STORAGE_UNAVAILABLE before its lifetime ends."""
    leader = ha.leader()
    addresses = tuple(node.address for node in ha.nodes.values())
    with running_service(service_settings(ha.nodes[leader], tarantool=addresses, workers=40)) as r:
        c = r.client
        assert c.session_create("client-frozen").ok
        ha.nodes[leader].send_signal(signal.SIGSTOP)
        try:
            eventually(lambda: _stalled(r, ha.nodes[leader].address), what="the leader stalls")
            seen: Counter[str] = Counter()

            def round_until_written() -> bool:
                answers = _answers(c, 20, "SESSION_CREATE", {"client_id": "c-frozen"}, lifetime_ms=1000)
                seen.update(answers)
                return answers["NONE"] > 0

            eventually(round_until_written, timeout_s=30, interval_s=0, what="a write acknowledged by a new leader")
        finally:
            ha.nodes[leader].send_signal(signal.SIGCONT)
    assert set(seen) <= {"NONE", "STORAGE_UNAVAILABLE"}, seen
    assert ha.leader() != leader


# -- synchronous writes rolled back ------------------------------------------------------------


def test_a_synchronous_write_without_its_quorum_is_outcome_unknown_counted_and_logged_once(ha: HACluster) -> None:
    """Tarantool 2.6.0 answers SYNC_QUORUM_TIMEOUT (the write that waited) and SYNC_ROLLBACK (those
    queued behind it); neither is definitive there (a leader that dies before its ROLLBACK replicates
    may have the write confirmed by the next one), so the client hears OUTCOME_UNKNOWN, not INTERNAL."""
    leader = ha.leader()
    followers = [n for n in ha.nodes if n != leader]
    addresses = tuple(node.address for node in ha.nodes.values())
    out = io.StringIO()
    with running_service(service_settings(ha.nodes[leader], tarantool=addresses, workers=40)) as r:
        c = r.client
        assert c.session_create("client-sync").ok
        logs.configure("info", out, cache=False)
        try:
            for n in followers:
                ha.nodes[n].send_signal(signal.SIGSTOP)
            try:
                answers = _answers(c, 10, "SESSION_CREATE", {"client_id": "c-sync"}, lifetime_ms=10_000, timeout_s=15)
            finally:
                for n in followers:
                    ha.nodes[n].send_signal(signal.SIGCONT)
            eventually(lambda: _answer(lambda: c.session_create("client-after")) == "NONE", what="writes again")
        finally:
            structlog.reset_defaults()
        quorum_timeouts = metric(
            r.metrics_url, "smartcache_storage_write_failures_total", {"reason": "sync_quorum_timeout"}
        )
        rollbacks = metric(r.metrics_url, "smartcache_storage_write_failures_total", {"reason": "sync_rollback"})
        internal = metric(r.metrics_url, "smartcache_internal_errors_total")
    assert answers == {"OUTCOME_UNKNOWN": 10}
    assert quorum_timeouts >= 1
    assert quorum_timeouts + rollbacks == 10
    assert internal == 0
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    # A leader answers NOT_LEADER for the few ms it holds writes to raise its quorum when a follower
    # (re)attaches; the service retries those, and they are a streak of their own in the log.
    failing = [line for line in lines if line["event"] == "storage_writes_failing" and line["reason"] != "not_leader"]
    assert [line["reason"] for line in failing] == ["sync_quorum_timeout", "sync_rollback"][: len(failing)]
    assert len(failing) == (2 if rollbacks else 1)  # once per streak of a reason, not once per write
    assert not [line for line in lines if line["event"] == "handler_failed"]


def test_a_read_of_a_key_whose_write_waits_for_its_quorum_is_never_dirty(ha: HACluster) -> None:
    """No MVCC on 2.6.0: an update waiting for its quorum is in the space already. A read of that
    session waits for the outcome; when its lifetime ends first it is STORAGE_UNAVAILABLE (not
    executed), never the value that is then rolled back."""
    leader = ha.leader()
    followers = [n for n in ha.nodes if n != leader]
    addresses = tuple(node.address for node in ha.nodes.values())
    with running_service(service_settings(ha.nodes[leader], tarantool=addresses, workers=40)) as r:
        c = r.client
        created = c.session_create("client-dirty", data="clean")
        assert created.ok
        sid = created.session_id
        assert sid is not None
        for n in followers:
            ha.nodes[n].send_signal(signal.SIGSTOP)
        try:
            update = c.send("SESSION_UPDATE", {"data": "dirty"}, session_id=sid, lifetime_ms=10_000)
            eventually(
                lambda: ha.call(leader, "stats")["synchronous"]["pending_keys"] > 0,  # type: ignore[index]
                what="the update waits for its quorum on the leader",
            )
            read = _answer(lambda: c.call("SESSION_GET", session_id=sid, lifetime_ms=300, timeout_s=5))
            assert read == "STORAGE_UNAVAILABLE"
            assert _answer(lambda: c.wait(update, timeout_s=15)) == "OUTCOME_UNKNOWN"  # rolled back
        finally:
            for n in followers:
                ha.nodes[n].send_signal(signal.SIGCONT)
        got = eventually(lambda: (g := c.session_get(sid)).ok and g, what="reads again")
        assert got.body["data"] == "clean"


# -- a storage wall clock that jumps ---------------------------------------------------------


@contextlib.contextmanager
def _faketime_storage(tmp_path: Path) -> Iterator[tuple[Tarantool, Path]]:
    """A standalone instance whose wall clock (not its monotonic clock) follows a file: '+600' jumps it."""
    clock = tmp_path / "clock.faketime"
    clock.write_text("+0\n")
    env = {
        "LD_PRELOAD": str(FAKETIME_LIB),
        "FAKETIME_TIMESTAMP_FILE": str(clock),
        "FAKETIME_CACHE_DURATION": "1",
        "DONT_FAKE_MONOTONIC": "1",
    }
    instance = Tarantool.create("jumpy", tmp_path, extra_env=env)
    instance.start()
    try:
        instance.wait_ready()
        yield instance, clock
    finally:
        instance.stop()


class Writers:
    """Threads creating sessions through the service as fast as it answers; every answer counted."""

    def __init__(self, endpoint: str, n: int = 4) -> None:
        self.answers: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(endpoint,), daemon=True) for _ in range(n)]

    def _run(self, endpoint: str) -> None:
        with Client(endpoint, timeout_s=10) as c:
            while not self._stop.is_set():
                answer = _answer(lambda: c.session_create("client-clock"))
                with self._lock:
                    self.answers[answer] += 1

    def count(self) -> int:
        with self._lock:
            return sum(self.answers.values())

    def __enter__(self) -> Writers:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)


@pytest.mark.skipif(not FAKETIME_LIB.exists(), reason="needs libfaketime: apt-get install faketime")
@pytest.mark.parametrize("jump_s", [600, -600], ids=["ahead", "behind"])
def test_a_jump_of_the_storage_wall_clock_expires_no_write(tmp_path: Path, jump_s: int) -> None:
    """Fault suite, clock-jump: every write was EXPIRED until the service measured the new offset
    (up to 3.8 s). Now the offset follows the jump at once, and a call storage refuses as past its
    deadline while our own clock says time is left is sent again with a fresh offset."""
    with _faketime_storage(tmp_path) as (instance, clock), running_service(service_settings(instance)) as r:
        address = instance.address

        def offset_s() -> float:
            return metric(r.metrics_url, "smartcache_storage_clock_offset_seconds", {"address": address})

        with Writers(r.endpoint) as w:
            eventually(lambda: w.count() >= 200, what="writes flowing")
            clock.write_text(f"{jump_s:+d}\n")
            eventually(lambda: abs(offset_s() - jump_s) < 1, what="the service measures the jump")
            now = w.count()
            eventually(lambda: w.count() >= now + 200, what="writes after the jump")
            clock.write_text("+0\n")
            eventually(lambda: abs(offset_s()) < 1, what="the service measures the jump back")
            now = w.count()
            eventually(lambda: w.count() >= now + 200, what="writes after the jump back")
    assert set(w.answers) == {"NONE"}, w.answers
