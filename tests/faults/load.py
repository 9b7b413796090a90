"""The load family (issue 35): what production brings and a quiet lab does not.

A slow disk, a GC pause, a noisy neighbour, a follower that acknowledges late, a burst of events,
and a client that sends garbage beside its real requests. Each row's timeline uses the pieces here:

* ``BusyLoops``: processes that only burn CPU, each ending by itself after ``BUSY_LIFETIME_S`` and
  stopped by its PID: the noisy neighbours of a two-core machine.
* ``CpuQuota``: a cgroup (v1 ``cpu``) that caps the processes put in it at a share of one CPU
  (``cpu.cfs_quota_us``); a starved follower acknowledges late, in bursts.
* ``WalStalls``: the leader's WAL thread alone frozen (a cgroup v1 ``freezer`` holding that one
  thread) in pulses: a disk that stalls, while the instance's other threads run on.
* ``pulses``: SIGSTOP/SIGCONT of followers, 0.3-3 s each, repeated: acknowledgements delayed around
  the synchronous timeout, on one follower or on both.
* ``EventBurst``: sessions created and rotated, counters added, as fast as they go: a leader whose
  event rate is high at the moment of the fault.
* ``FuzzMix``: the independent client's mix that stopped the cluster (issue 35): well-formed requests
  with lifetimes of 2-5 ms and mutated frames (tests/mutator.py), every answer counted against what
  PROTOCOL.md promises (one answer per message, none under the NO_REPLY rule).

And what every row checks besides (harness.py calls them): ``EventWatcher`` reads the event log
through a service for the whole row and keeps each sequence number's event; ``event_seq_twice``
counts numbers seen with two different events (a number the leader gave again after a rollback its
followers did not share) or held differently by the final log; ``follower_only_rows`` compares each
caught-up follower's data with the leader's (``sc.digest``) and counts the rows a follower has that
the leader does not, or has otherwise.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tarantool
import zmq

from smartcache import Client, RequestError
from smartcache.wire import HEADER_STRUCT, OFFSET, frame_request_id
from tests.mutator import Mutator, bound_lifetime, expected_answers, with_rid

if TYPE_CHECKING:
    from tests.faults.cluster import Cluster

#: a busy loop ends by itself after this (a row stops it long before)
BUSY_LIFETIME_S = 600
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
CGROUP_FREEZER = Path("/sys/fs/cgroup/freezer")
CFS_PERIOD_US = 100_000
#: an observer's digest call may scan every space: give it time
DIGEST_TIMEOUT_S = 10.0


class BusyLoops:
    """n processes burning CPU beside the cluster, each stopped by its PID (and ending by itself)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> BusyLoops:
        code = f"import time\nend = time.monotonic() + {BUSY_LIFETIME_S}\nwhile time.monotonic() < end: pass\n"
        for _ in range(self.n):
            self.procs.append(
                subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)


class CpuQuota:
    """A cgroup v1 ``cpu`` group capping its processes at ``percent`` of one CPU; removed on exit (its
    processes moved back to the root group first)."""

    def __init__(self, percent: int) -> None:
        self.percent = percent
        self.path = CGROUP_CPU / f"smartcache-faults-{uuid.uuid4().hex[:8]}"
        self.pids: list[int] = []

    @staticmethod
    def available() -> bool:
        return (CGROUP_CPU / "cgroup.procs").exists() and os.access(CGROUP_CPU, os.W_OK)

    def __enter__(self) -> CpuQuota:
        self.path.mkdir()
        (self.path / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
        (self.path / "cpu.cfs_quota_us").write_text(str(CFS_PERIOD_US * self.percent // 100))
        return self

    def add(self, pid: int) -> None:
        """Every thread of pid into the group (cgroup.procs moves the whole process)."""
        (self.path / "cgroup.procs").write_text(str(pid))
        self.pids.append(pid)

    def __exit__(self, *exc: object) -> None:
        for pid in self.pids:
            with contextlib.suppress(OSError):
                (CGROUP_CPU / "cgroup.procs").write_text(str(pid))
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def thread_of(pid: int, name: str) -> int | None:
    """The id of pid's thread named name (Tarantool names its WAL writer "wal"), or None."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            if (task / "comm").read_text().strip() == name:
                return int(task.name)
    return None


class WalStalls:
    """Pulses of a frozen WAL thread: one thread of the process in a freezer cgroup of its own, FROZEN
    for lo_s..hi_s at a time. Writes queue in the WAL, the transaction thread, replication and the
    failover loops run on: a disk that stalls, as a slow or overloaded one does."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.path = CGROUP_FREEZER / f"smartcache-faults-{uuid.uuid4().hex[:8]}"
        self.tid: int | None = None

    @staticmethod
    def available() -> bool:
        return (CGROUP_FREEZER / "tasks").exists() and os.access(CGROUP_FREEZER, os.W_OK)

    def __enter__(self) -> WalStalls:
        self.tid = thread_of(self.pid, "wal")
        if self.tid is None:
            raise RuntimeError(f"no thread named wal in process {self.pid}")
        self.path.mkdir()
        (self.path / "tasks").write_text(str(self.tid))
        return self

    def _state(self, state: str) -> None:
        (self.path / "freezer.state").write_text(state)

    def run(self, seconds: float, *, lo_s: float = 0.1, hi_s: float = 1.5, seed: int = 0) -> list[float]:
        """Stall pulses for seconds, a pause of 0.2..1 s between; the stall lengths."""
        rng, done, end = random.Random(seed), [], time.monotonic() + seconds
        while time.monotonic() < end:
            d = rng.uniform(lo_s, hi_s)
            self._state("FROZEN")
            try:
                time.sleep(d)
            finally:
                self._state("THAWED")
            done.append(round(d, 2))
            time.sleep(rng.uniform(0.2, 1.0))
        return done

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            self._state("THAWED")
        if self.tid is not None:
            with contextlib.suppress(OSError):
                (CGROUP_FREEZER / "tasks").write_text(str(self.tid))
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def pulses(
    cluster: Cluster, nodes: list[str], seconds: float, *, lo_s: float = 0.3, hi_s: float = 3.0, seed: int = 0
) -> list[tuple[str, float]]:
    """SIGSTOP then SIGCONT each of nodes in pulses of lo_s..hi_s, a pause of 0.2..1 s between, for seconds.
    Each node pulses on its own thread (both followers: their pauses overlap at random). The pulses done."""
    done: list[tuple[str, float]] = []
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def one(name: str, rng: random.Random) -> None:
        while time.monotonic() < end:
            d = rng.uniform(lo_s, hi_s)
            cluster.signal_node(name, signal.SIGSTOP)
            try:
                time.sleep(d)
            finally:
                cluster.signal_node(name, signal.SIGCONT)
            with lock:
                done.append((name, round(d, 2)))
            time.sleep(rng.uniform(0.2, 1.0))

    threads = [
        threading.Thread(target=one, args=(n, random.Random(seed * 31 + i)), daemon=True) for i, n in enumerate(nodes)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 10)
    for n in nodes:
        cluster.signal_node(n, signal.SIGCONT)
    return done


class EventBurst(threading.Thread):
    """Sessions created and rotated and counters added, as fast as one client goes (not in the checked
    history: their writes are checked by the digests and the event watcher)."""

    def __init__(self, endpoint: str, index: int) -> None:
        super().__init__(daemon=True, name=f"event-burst-{index}")
        self.endpoint = endpoint
        self.index = index
        self.stopping = threading.Event()
        self.answers: Counter[str] = Counter()

    def run(self) -> None:
        with Client(self.endpoint, timeout_s=2.0) as c:
            n = 0
            while not self.stopping.is_set():
                n += 1
                try:
                    created = c.session_create(f"burst-{self.index}-{n % 50}", data={"n": n}, ttl_s=600)
                    self.answers[f"create {created.status}"] += 1
                    if created.status == "OK" and created.session_id is not None:
                        rotated = c.session_rotate(created.session_id)
                        self.answers[f"rotate {rotated.status}"] += 1
                    added = c.counter_add(f"burst-{self.index}", 1)
                    self.answers[f"counter {added.status}"] += 1
                except RequestError as e:
                    self.answers[e.transport_error] += 1

    def stop(self) -> None:
        self.stopping.set()
        self.join(15)


class FuzzMix(threading.Thread):
    """Mutated frames and well-formed requests to one service, in batches, every answer counted.

    ``frames`` messages in all; a third of the well-formed ones carry a lifetime of 2..5 ms. Missing or
    extra answers per request id are kept: exactly one answer per message (none under NO_REPLY) must
    hold under load too."""

    BATCH = 500
    #: how long a batch's answers may take (the longest lifetime of a fuzzed message is 2 s)
    SETTLE_S = 10.0

    def __init__(self, endpoint: str, frames: int, seed: int) -> None:
        super().__init__(daemon=True, name="fuzz-mix")
        self.endpoint = endpoint
        self.frames = frames
        self.seed = seed
        self.stopping = threading.Event()
        self.sent = 0
        self.missing: list[int] = []
        self.extra = 0
        self.errors: Counter[str] = Counter()
        self.done = threading.Event()

    def run(self) -> None:
        rng = random.Random(self.seed)
        m = Mutator(rng)
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        rid = 1
        try:
            while self.sent < self.frames and not self.stopping.is_set():
                expected: set[int] = set()
                anonymous = 0
                for _ in range(min(self.BATCH, self.frames - self.sent)):
                    well_formed = rng.random() < 0.5
                    short = well_formed and rng.random() < 1 / 3
                    frames = m.seed(max_lifetime_ms=5 if short else 2000)
                    if short:
                        frames[0] = bound_lifetime(frames[0], 5)
                        frames[0] = _lifetime_at_least(frames[0], 2)
                    if not well_formed:
                        frames = m.mutate(frames)
                    i = 1 if len(frames) > 1 and frames[0] == b"" else 0
                    if i < len(frames) and len(frames[i]) == HEADER_STRUCT.size:
                        frames[i] = with_rid(bound_lifetime(frames[i]), rid)
                        if expected_answers(frames):
                            expected.add(rid)
                        rid += 1
                    else:
                        anonymous += expected_answers(frames)
                    sock.send_multipart(frames)
                    self.sent += 1
                got: Counter[int] = Counter()
                deadline = time.monotonic() + self.SETTLE_S
                while sum(got.values()) < len(expected) + anonymous and time.monotonic() < deadline:
                    if sock.poll(100):
                        reply = sock.recv_multipart()
                        header = reply[1] if reply[0] == b"" else reply[0]
                        got[frame_request_id(header)] += 1
                        self.errors[str(int.from_bytes(header[4:6], "big"))] += 1
                got.pop(0, None)
                self.missing.extend(sorted(expected - set(got)))
                self.extra += sum(n - 1 for n in got.values() if n > 1) + sum(
                    n for r, n in got.items() if r not in expected
                )
        finally:
            sock.close()
            self.done.set()

    def stop(self) -> None:
        self.stopping.set()
        self.join(60)


def _lifetime_at_least(header: bytes, ms: int) -> bytes:
    o = OFFSET["lifetime_ms"]
    lifetime = int.from_bytes(header[o : o + 4], "big")
    return header[:o] + max(lifetime, ms).to_bytes(4, "big") + header[o + 4 :]


class EventWatcher(threading.Thread):
    """Reads the event log through one service for the whole row: seq -> (topic, key, time_ms), and each
    sequence number seen with a second, different event."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(daemon=True, name="event-watcher")
        self.endpoint = endpoint
        self.stopping = threading.Event()
        self.seen: dict[int, tuple[str, str, int]] = {}
        self.twice: list[dict[str, Any]] = []
        self.reads = 0
        self.errors: Counter[str] = Counter()

    def run(self) -> None:
        cursor: int | None = None
        with Client(self.endpoint, timeout_s=3.0) as c:
            while not self.stopping.is_set():
                try:
                    r = c.call("EVENTS_READ", {"after_seq": cursor, "limit": 1000, "wait_ms": 300})
                except RequestError as e:
                    self.errors[e.transport_error] += 1
                    time.sleep(0.1)
                    continue
                self.reads += 1
                if r.status == "CURSOR_TOO_OLD":
                    cursor = int(r.body["oldest_seq"]) - 1
                    continue
                if r.status != "OK":
                    self.errors[r.status] += 1
                    time.sleep(0.1)
                    continue
                for e in r.body["events"]:
                    self.note(int(e["seq"]), (str(e["topic"]), str(e["key"]), int(e["time_ms"])), "read")
                cursor = int(r.body["last_seq"])

    def note(self, seq: int, event: tuple[str, str, int], where: str) -> None:
        was = self.seen.setdefault(seq, event)
        if was != event:
            self.twice.append({"seq": seq, "first": list(was), "then": list(event), "where": where})

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)


def final_events(conn: tarantool.Connection, after: int = 0) -> dict[int, tuple[str, str, int]]:
    """The whole event log of one instance (sc.events_read, as stored rows)."""
    out: dict[int, tuple[str, str, int]] = {}
    cursor = after
    while True:
        r = conn.call("sc.events_read", [None, cursor, None, 1000, 0, True]).data[0]
        if r["status"] != "OK":
            raise AssertionError(f"events_read answered {r}")
        for t in r["events"]:
            out[int(t[0])] = (str(t[2]), str(t[3]), int(t[1]))
        if int(r["last_seq"]) <= cursor or int(r["last_seq"]) >= int(r["head_seq"]):
            return out
        cursor = int(r["last_seq"])


def event_seq_twice(watcher: EventWatcher | None, final: dict[int, tuple[str, str, int]]) -> list[dict[str, Any]]:
    """Sequence numbers seen with two different events during the row, or seen once and held otherwise by
    the final log (the leader's, every follower caught up with it)."""
    if watcher is None:
        return []
    for seq, event in final.items():
        if seq in watcher.seen:
            watcher.note(seq, event, "final log")
    return watcher.twice


def digest(cluster: Cluster, node: str, keys_of: list[str] | None = None) -> dict[str, Any]:
    """sc.digest of one instance, scanned without a yield (one state of its data)."""
    conn = cluster.open_conn(node, DIGEST_TIMEOUT_S, user="operator", password="operator")
    try:
        r: dict[str, Any] = conn.call("sc.digest", [None, keys_of, True]).data[0]
    finally:
        conn.close()
    if r.get("status") != "OK":
        raise AssertionError(f"sc.digest on {node}: {r}")
    return r


def _vclock(d: dict[str, Any]) -> dict[str, int]:
    return {k: int(v) for k, v in d["vclock"].items() if k != "0"}


def _at(cluster: Cluster, node: str, target: dict[str, int], keys_of: list[str] | None) -> dict[str, Any] | None:
    """The follower's digest once its vclock is exactly target (it catches up within milliseconds, and the
    leader's sweepers write only now and then); None when it went past target first, or after a second."""
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        d = digest(cluster, node, keys_of)
        v = _vclock(d)
        if v == target:
            return d
        if any(v.get(k, 0) > lsn for k, lsn in target.items()) or set(v) - set(target):
            return None
        time.sleep(0.005)
    return None


def follower_only_rows(cluster: Cluster, leader: str, followers: list[str], tries: int = 40) -> dict[str, Any]:
    """Per follower, the rows it has that the leader does not (or has otherwise): the leader's data at one
    vclock (a scan without a yield), and the follower's at the same vclock, taken the moment it gets
    there; asked again, up to ``tries`` times, when the leader wrote meanwhile (its sweepers). "compared"
    says whether they ever were."""
    out: dict[str, Any] = {}
    for f in followers:
        differ: list[str] = []
        result: dict[str, Any] = {"rows": 0, "spaces": {}, "differ": [], "compared": False}
        for _ in range(tries):
            lead = digest(cluster, leader, differ or None)
            mine = _at(cluster, f, _vclock(lead), differ or None)
            if mine is None:
                continue
            ls, ms = lead["spaces"], mine["spaces"]
            now_differ = sorted(s for s in set(ls) | set(ms) if ls.get(s) != ms.get(s))
            if not now_differ:
                result = {"rows": 0, "spaces": {}, "differ": [], "compared": True}
                break
            if now_differ != differ:  # ask again with these spaces' keys, at one vclock
                differ = now_differ
                continue
            rows: dict[str, int] = {}
            for space in differ:
                lk = {_key(k): h for k, h in (lead["keys"] or {}).get(space) or []}
                fk = {_key(k): h for k, h in (mine["keys"] or {}).get(space) or []}
                n = sum(1 for k, h in fk.items() if lk.get(k) != h)
                if n:
                    rows[space] = n
            result = {"rows": sum(rows.values()), "spaces": rows, "differ": differ, "compared": True}
            break
        out[f] = result
    return out


def _key(k: Any) -> str:
    return repr(k)
