"""Issue 38's bench rows: session reads of one front-server process, with the near cache and without it.

One process (this one) plays the front server: W threads, each with its own client (``twin``: one
socket per thread), all sharing one :class:`~smartcache.client.NearCache` (or none), each in a closed
loop over SESSIONS sessions made first: 20 reads (``session_get``) to 1 write (``session_update``),
the session-read mix of the service rows. A row: reads per second of the whole process, the hit
ratio, and the p50 of a read answered from memory and of one answered by the service. The p50 of a
hit is measured alone as well (W=1, reads of a session kept), so that the GIL of 128 threads does not
stand in it. Each row starts warm: every session read once (what a front server's cache holds of its
active sessions); the row's own misses are the writes' invalidations and the races with them.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from loadtest.report import percentile
from smartcache.client import Client, NearCache, RequestError

SESSIONS = 1000
READS_PER_WRITE = 20
WS = (1, 16, 128)
#: reads timed alone for the p50 of a hit
HIT_SAMPLES = 20_000


def _worker(client: Client, sids: list[Any], stop: threading.Event, out: dict[str, Any], seed: int) -> None:
    rnd = random.Random(seed)
    reads = writes = errors = 0
    hit_lat: list[float] = []
    miss_lat: list[float] = []
    n = 0
    while not stop.is_set():
        sid = sids[rnd.randrange(len(sids))]
        n += 1
        try:
            if n % (READS_PER_WRITE + 1) == 0:
                client.session_update(sid, set={"n": n})
                writes += 1
                continue
            t0 = time.perf_counter()
            r = client.session_get(sid)
            dt = time.perf_counter() - t0
            reads += 1
            (hit_lat if r.near else miss_lat).append(dt)
        except RequestError:  # counted; the bench reports them
            errors += 1
    out.update(reads=reads, writes=writes, errors=errors, hit_lat=hit_lat, miss_lat=miss_lat)


def row(endpoint: str, publishers: str | None, inflight: int, duration_s: float) -> dict[str, Any]:
    """One row: W=inflight threads for duration_s, with a near cache following publishers (None: without)."""
    near = NearCache(publishers=publishers, max_lag_s=2.0) if publishers else None
    first = Client(endpoint, timeout_s=10, near_cache=near)
    try:
        sids = [first.session_create("bench-near", data={"n": 0}).session_id for _ in range(SESSIONS)]
        if near is not None:
            deadline = time.monotonic() + 10
            while not any(near.stats()["shards"].values()) and time.monotonic() < deadline:
                time.sleep(0.05)
        for sid in sids:  # warm: a front server's cache holds its active sessions (a no-op without one)
            first.session_get(sid)
        clients = [first.twin() for _ in range(inflight)]
        outs: list[dict[str, Any]] = [{} for _ in clients]
        stop = threading.Event()
        threads = [
            threading.Thread(target=_worker, args=(c, sids, stop, o, i), daemon=True)
            for i, (c, o) in enumerate(zip(clients, outs, strict=True))
        ]
        before = near.stats() if near is not None else {}
        t0 = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(duration_s)  # the run's length
        stop.set()
        for t in threads:
            t.join(30)
        elapsed = time.monotonic() - t0
        after = near.stats() if near is not None else {}
        for c in clients:
            c.close(linger_ms=0)
        hit_p50 = _hit_p50(first, sids[0]) if near is not None else None
    finally:
        first.close(linger_ms=0)
    reads = sum(o["reads"] for o in outs)
    hits = after.get("hits", 0) - before.get("hits", 0)
    lookups = hits + after.get("misses", 0) - before.get("misses", 0)
    hit_lat = sorted(x for o in outs for x in o["hit_lat"])
    miss_lat = sorted(x for o in outs for x in o["miss_lat"])
    label = f"front server session-read W={inflight} {'near cache' if near is not None else 'no near cache'}"
    return {
        "label": label,
        "inflight": inflight,
        "reads_per_s": round(reads / elapsed),
        "writes": sum(o["writes"] for o in outs),
        "errors": sum(o["errors"] for o in outs),
        "hit_ratio": round(hits / lookups, 3) if lookups else None,
        "p50_hit_us_under_load": round(percentile(hit_lat, 50) * 1e6, 1) if hit_lat else None,
        "p50_service_read_us": round(percentile(miss_lat, 50) * 1e6, 1) if miss_lat else None,
        "p50_hit_us_alone": hit_p50,
        "near_cache": {k: after[k] - before.get(k, 0) for k in ("invalidations", "gaps", "not_served_stale")}
        if near is not None
        else None,
    }


def _hit_p50(client: Client, sid: Any) -> float | None:
    """The p50 of a hit alone: one thread reading a session kept in memory."""
    client.session_get(sid)
    samples = []
    for _ in range(HIT_SAMPLES):
        t0 = time.perf_counter()
        r = client.session_get(sid)
        dt = time.perf_counter() - t0
        if r.near:
            samples.append(dt)
    samples.sort()
    return round(percentile(samples, 50) * 1e6, 1) if samples else None


def rows(endpoint: str, publishers: str, duration_s: float, ws: tuple[int, ...] = WS) -> list[dict[str, Any]]:
    """Without and with the near cache at each W, back to back."""
    out = []
    for w in ws:
        for pubs in (None, publishers):
            r = row(endpoint, pubs, w, duration_s)
            print(format_row(r), flush=True)
            out.append(r)
    return out


def format_row(r: dict[str, Any]) -> str:
    text = f"{r['label']:<52} {r['reads_per_s']:>8} reads/s"
    if r["hit_ratio"] is not None:
        text += (
            f"  hit ratio {r['hit_ratio']:.2f}, p50 hit {r['p50_hit_us_alone']} µs alone / "
            f"{r['p50_hit_us_under_load']} µs under load, p50 service read {r['p50_service_read_us']} µs; "
            f"{r['near_cache']}"
        )
    else:
        text += f"  p50 service read {r['p50_service_read_us']} µs"
    if r["errors"]:
        text += f"  errors {r['errors']}"
    return text


def summary(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """Near cache to service, reads/s, at each W; the hit ratio and the p50 of a hit at W=16 (the issue's aims:
    10x at W=16, under 50 µs)."""
    by = {(r["inflight"], r["hit_ratio"] is not None): r for r in rs}
    out: dict[str, Any] = {
        f"near_cache_to_service_reads_at_W{w}": round(
            by[w, True]["reads_per_s"] / max(1, by[w, False]["reads_per_s"]), 1
        )
        for w, _ in by
        if (w, True) in by and (w, False) in by
    }
    if (16, True) in by:
        out["near_cache_hit_ratio_at_W16"] = by[16, True]["hit_ratio"]
        out["near_cache_p50_hit_us"] = by[16, True]["p50_hit_us_alone"]
    return out


def summary_line(s: dict[str, Any]) -> str:
    ratios = ", ".join(f"W={k.rsplit('W', 1)[1]} {v}" for k, v in s.items() if k.startswith("near_cache_to_service"))
    return (
        f"near cache/service, session reads of one front-server process (20:1): {ratios} (aim: 10 at W=16); "
        f"hit ratio at W=16 {s.get('near_cache_hit_ratio_at_W16')}, p50 of a hit {s.get('near_cache_p50_hit_us')} µs "
        "(aim: under 50)"
    )
