"""``python -m loadtest coordination``: the four numbers of issue 17, on one Tarantool and two services.

1. COUNTER_ADD throughput against the session scenario's, same stack, same run
   (closed loop, W in flight over 2 generator processes);
2. lock hand-over: holder on service A releases, the waiter on service B
   (waiting inside Tarantool) gets the lock: from the release's send to the
   waiter's answer, alternating directions;
3. ids from SEQUENCE_RESERVE ranges (the client library's id generator): ids
   per second to one client, then 2 instances x 16 clients drawing N ids in
   all, every id checked for duplicates;
4. a lock holder killed with kill -9 (a child process renewing its lease): how
   long until a waiter on the other instance has the lock, against lease + 100 ms.

Tarantool runs standalone with ``SC_WAL_MODE=write`` by default (the bench's
baseline rows; ``--wal-mode fsync`` for the standalone default).
"""

from __future__ import annotations

import array
import contextlib
import itertools
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loadtest import runner
from loadtest.generator import Job
from loadtest.report import format_line, percentile
from loadtest.stack import ServiceUnderTest, service
from smartcache.client import Client
from smartcache.devstack.stack import Tarantool

TARGET_COUNTER_RATIO = 0.8
TARGET_HANDOVER_P99_MS = 2.0
TARGET_IDS_PER_S = 1_000_000
KILL_MARGIN_MS = 100


@contextlib.contextmanager
def two_services(wal_mode: str) -> Iterator[tuple[ServiceUnderTest, ServiceUnderTest]]:
    base = Path(tempfile.mkdtemp(prefix="smartcache-coord-"))
    master = Tarantool.create("coord-master", base, extra_env={"SC_LOG_LEVEL": "4", "SC_WAL_MODE": wal_mode})
    master.start()
    try:
        master.wait_ready()
        with service(master, base / "a.log") as a, service(master, base / "b.log") as b:
            yield a, b
    finally:
        master.stop()


# -- 1. counters against sessions ------------------------------------------------------------------


def throughput(endpoint: str, duration_s: float, inflight: int) -> dict[str, Any]:
    rows = []
    for scenario in ("session", "counter"):
        job = Job(endpoint=endpoint, scenario=scenario, duration_s=duration_s, inflight=inflight)
        rows.append(runner.run(job, 2, label=f"{scenario} W={inflight}"))
        print(format_line(rows[-1]), flush=True)
    ratio = rows[1]["throughput_rps"] / max(rows[0]["throughput_rps"], 1e-9)
    return {"session": rows[0], "counter": rows[1], "ratio": round(ratio, 2)}


# -- 2. lock hand-over ---------------------------------------------------------------------------


def handover(a: str, b: str, rounds: int) -> dict[str, Any]:
    name = f"bench-lock-{os.getpid()}"
    with Client(a, timeout_s=10) as ca, Client(b, timeout_s=10) as cb:
        holder, waiter = (ca, "holder-a"), (cb, "holder-b")
        if not ca.semaphore_acquire(name, "holder-a", 60_000).ok:
            raise RuntimeError("first acquire failed")
        samples = []
        for _ in range(rounds):
            (hc, hname), (wc, wname) = holder, waiter
            body = {"name": name, "holder": wname, "lease_ms": 60_000, "wait_ms": 5_000}
            rid = wc.send("SEMAPHORE_ACQUIRE", body, lifetime_ms=6_000)
            while hc.semaphore_get(name).body["waiters"] < 1:  # until it waits inside Tarantool
                pass
            started = time.perf_counter()
            release = hc.send("SEMAPHORE_RELEASE", {"name": name, "holder": hname})
            got = wc.wait(rid)
            samples.append(time.perf_counter() - started)
            if not got.ok or not hc.wait(release).ok:
                raise RuntimeError(f"hand-over failed: {got.body}")
            holder, waiter = waiter, holder
    samples.sort()
    ms = {f"p{p:g}_ms": round(percentile(samples, p) * 1000, 3) for p in (50, 90, 99, 99.9)}
    return {"rounds": rounds, **ms, "max_ms": round(samples[-1] * 1000, 3)}


# -- 3. ids --------------------------------------------------------------------------------------


def ids_to_one_client(endpoint: str, seconds: float) -> dict[str, Any]:
    with Client(endpoint, timeout_s=10) as c:
        ids = c.ids(f"bench-ids-one-{os.getpid()}")
        next(ids)  # the first reservation is not the steady state
        n, started = 0, time.perf_counter()
        end = started + seconds
        while time.perf_counter() < end:
            for _ in range(100_000):  # one next() per id, as an application takes them
                next(ids)
            n += 100_000
        elapsed = time.perf_counter() - started
    return {"ids": n, "ids_per_s": round(n / elapsed), "reservations": ids.reservations, "block": ids.block}


def _draw(endpoint: str, name: str, clients: int, per_client: int, out: Any) -> None:
    """One process: `clients` threads, each with its own client and generator; sends the ids back."""
    results: list[bytes] = [b""] * clients

    def one(i: int) -> None:
        with Client(endpoint, timeout_s=10) as c:
            gen = c.ids(name, max_block=100_000)
            results[i] = array.array("q", itertools.islice(gen, per_client)).tobytes()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        out.put(r)


def ids_unique(a: str, b: str, clients: int, total: int) -> dict[str, Any]:
    """`clients` clients on each instance draw `total` ids in all; counts every id seen twice."""
    name = f"bench-ids-many-{os.getpid()}"
    per_client = total // (2 * clients)
    ctx = mp.get_context("fork")
    out: Any = ctx.Queue()
    started = time.perf_counter()
    procs = [ctx.Process(target=_draw, args=(ep, name, clients, per_client, out)) for ep in (a, b)]
    for p in procs:
        p.start()
    chunks = [array.array("q", out.get(timeout=600)) for _ in range(2 * clients)]
    for p in procs:
        p.join(60)
    elapsed = time.perf_counter() - started
    seen = bytearray(max(max(c) for c in chunks) + 1)
    duplicates = drawn = 0
    for chunk in chunks:
        for i in chunk:
            duplicates += seen[i]
            seen[i] = 1
        drawn += len(chunk)
    return {
        "clients": 2 * clients,
        "ids": drawn,
        "duplicates": duplicates,
        "seconds": round(elapsed, 1),
        "ids_per_s_all": round(drawn / elapsed),
    }


# -- 4. kill -9 ------------------------------------------------------------------------------------

HOLDER = """
import sys, time
from smartcache.client import Client
with Client(sys.argv[1]) as c:
    c.lock(sys.argv[2], lease_ms=int(sys.argv[3])).acquire()
    print("held", flush=True)
    time.sleep(600)
"""


def killed_holder(a: str, b: str, lease_ms: int, times: int) -> dict[str, Any]:
    """Each time: a child on A holds the lock and renews it; a waiter on B; kill -9 the child at a random
    point of its renewal cycle; how long until the waiter has the lock."""
    waits = []
    with Client(b, timeout_s=30) as cb:
        for k in range(times):
            name = f"bench-killed-{os.getpid()}-{k}"
            proc = subprocess.Popen([sys.executable, "-c", HOLDER, a, name, str(lease_ms)], stdout=subprocess.PIPE)
            try:
                assert proc.stdout is not None
                if proc.stdout.readline().strip() != b"held":
                    raise RuntimeError("the holder did not start")
                time.sleep(lease_ms / 1000 * (1 + k / times))  # renewals carry it; the kill lands anywhere
                body = {"name": name, "holder": "waiter", "lease_ms": 60_000, "wait_ms": 2 * lease_ms + 2_000}
                rid = cb.send("SEMAPHORE_ACQUIRE", body, lifetime_ms=2 * lease_ms + 3_000)
                while cb.semaphore_get(name).body["waiters"] < 1:
                    pass
                killed = time.perf_counter()
                os.kill(proc.pid, signal.SIGKILL)
                got = cb.wait(rid, timeout_s=2 * lease_ms / 1000 + 5)
                waits.append(time.perf_counter() - killed)
                if not got.ok:
                    raise RuntimeError(f"the waiter did not get the lock: {got.body}")
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
                if proc.stdout is not None:
                    proc.stdout.close()
    return {
        "lease_ms": lease_ms,
        "times": times,
        "after_kill_ms": [round(w * 1000) for w in waits],
        "max_ms": round(max(waits) * 1000),
    }


# -- all four ------------------------------------------------------------------------------------


def run(
    *,
    duration_s: float,
    inflight: int,
    rounds: int,
    ids_total: int,
    clients: int,
    lease_ms: int,
    kills: int,
    wal_mode: str,
) -> dict[str, Any]:
    with two_services(wal_mode) as (a, b):
        print(f"1. COUNTER_ADD vs the session scenario (W={inflight}, {duration_s:g} s each)", flush=True)
        tp = throughput(a.endpoint, duration_s, inflight)
        print(f"   ratio {tp['ratio']} (target >= {TARGET_COUNTER_RATIO})", flush=True)
        print(f"2. lock hand-over across instances, {rounds} rounds", flush=True)
        ho = handover(a.endpoint, b.endpoint, rounds)
        print(f"   p50 {ho['p50_ms']} p99 {ho['p99_ms']} max {ho['max_ms']} ms (target p99 <= 2 ms)", flush=True)
        print("3. ids from client-side ranges", flush=True)
        one = ids_to_one_client(a.endpoint, 5.0)
        print(
            f"   one client: {one['ids_per_s']:,} ids/s (target >= 1,000,000), {one['reservations']} reservations,"
            f" block grew to {one['block']}",
            flush=True,
        )
        many = ids_unique(a.endpoint, b.endpoint, clients, ids_total)
        print(
            f"   2 instances x {clients} clients: {many['ids']:,} ids, {many['duplicates']} duplicates,"
            f" {many['ids_per_s_all']:,} ids/s in all",
            flush=True,
        )
        print(f"4. lock holder killed with kill -9 (lease {lease_ms} ms), {kills} times", flush=True)
        kill = killed_holder(a.endpoint, b.endpoint, lease_ms, kills)
        print(
            f"   waiter had it {kill['after_kill_ms']} ms after the kill (target <= lease + {KILL_MARGIN_MS})",
            flush=True,
        )
    summary = {
        "counter_to_session_ratio": tp["ratio"],
        "handover_p99_ms": ho["p99_ms"],
        "ids_per_s_one_client": one["ids_per_s"],
        "ids_duplicates": many["duplicates"],
        "kill9_max_ms_after_kill": kill["max_ms"],
        "met": {
            "counter_ratio": tp["ratio"] >= TARGET_COUNTER_RATIO,
            "handover_p99": ho["p99_ms"] <= TARGET_HANDOVER_P99_MS,
            "ids_per_s": one["ids_per_s"] >= TARGET_IDS_PER_S,
            "ids_unique": many["duplicates"] == 0 and many["ids"] >= ids_total - 2 * clients,
            "kill9": kill["max_ms"] <= lease_ms + KILL_MARGIN_MS,
        },
    }
    print("targets:", ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in summary["met"].items()))
    return {"throughput": tp, "handover": ho, "ids_one_client": one, "ids_unique": many, "kill9": kill, **summary}
