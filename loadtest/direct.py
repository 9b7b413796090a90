"""The same Lua procedures called straight from Python: the yardstick for the service's overhead.

4 threads, one `tarantool` connector connection each (blocking), the
session scenario (create with a 100-byte body, then get), each session named by the stored id
derived from a new raw id as the service derives it (loadtest/storedids.py). This is what the
original measured as "service to Tarantool": 12,000/s on its machine.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import tarantool

from loadtest import storedids
from loadtest.report import summarize
from loadtest.scenarios import BODY_100

DEFAULT_USER = DEFAULT_PASSWORD = "smartcache"  # noqa: S105 - the local default, as in lua/README.md


def run(
    address: str,
    *,
    threads: int = 4,
    duration_s: float = 10.0,
    user: str = DEFAULT_USER,
    password: str = DEFAULT_PASSWORD,
) -> dict[str, Any]:
    host, _, port = address.rpartition(":")
    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors = [0] * threads
    end = time.monotonic() + duration_s

    def work(i: int) -> None:
        conn = tarantool.connect(host, int(port), user=user, password=password)
        lat = latencies[i]
        try:
            while time.monotonic() < end:
                t0 = time.perf_counter()
                _, sid = storedids.new()
                created = conn.call("sc.session_create", [None, sid, f"c{i}", None, None, BODY_100]).data[0]
                t1 = time.perf_counter()
                got = conn.call("sc.session_get", [None, sid]).data[0]
                t2 = time.perf_counter()
                lat.append(t1 - t0)
                lat.append(t2 - t1)
                if created["status"] != "OK" or got["status"] != "OK":
                    errors[i] += 1
        finally:
            conn.close()

    started = time.monotonic()
    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.monotonic() - started
    merged = [x for lat in latencies for x in lat]
    return {
        "label": f"direct ({threads} threads)",
        "elapsed_s": round(elapsed, 3),
        "replies": len(merged),
        "throughput_rps": round(len(merged) / elapsed, 1),
        "latency": summarize(merged),
        "errors": sum(errors),
        "refusal_latency": None,
        "lost": 0,
        "refusals_rps": 0,
        "outcomes": {"OK": len(merged)},
    }
