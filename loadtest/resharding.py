"""Online resharding under load: half of a shard's sessions moved to a new shard while the session scenario runs.

`python -m loadtest resharding [--sessions 1000000]` (`make bench-resharding`): two HA trios on three etcd members,
the bucket map naming only s1; s1 is loaded with the sessions (sc.session_create on its leader, 10 per client, each
under the stored id of a raw id carrying its client's bucket, derived as the service derives it);
then the session scenario (half SESSION_CREATE, half SESSION_GET, W=16) runs through one service while
`cluster shard add s2` and `rebalance --parallel 2` move half of the buckets (and so half of the sessions) to s2.
It prints the throughput before, during and after the move (ratios of the same minutes), the pause of each
bucket's calls (p50, p99, max), the rate in buckets/s and rows/s, and checks from storage that each bucket's rows
are on its owner only and that every session (the preloaded ones and those made during the move) is there once.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from typing import Any

import asynctnt

from loadtest import runner, storedids
from loadtest.generator import Job
from loadtest.report import format_line
from loadtest.stack import sharded_stack
from smartcache.wire.buckets import DEFAULT_BUCKETS, bucket_of

#: the development credentials of make run and the tests (the bench's instances use them)
SERVICE_USER, SERVICE_PASSWORD = "smartcache", os.environ.get("SC_SERVICE_PASSWORD") or "smartcache"
OPERATOR_PASSWORD = os.environ.get("SC_OPERATOR_PASSWORD") or "operator"
#: sessions per client in the preload (a client's sessions share its bucket)
PER_CLIENT = 10
#: how many sc.session_create calls the preload keeps in flight
PRELOAD_INFLIGHT = 256
#: each measured stretch of load (before, each slice during, after)
SLICE_S = 5.0


async def _preload(host: str, port: int, sessions: int) -> float:
    """sessions through sc.session_create on s1's leader, PRELOAD_INFLIGHT at once; the seconds it took."""
    conn = asynctnt.Connection(host=host, port=port, username=SERVICE_USER, password=SERVICE_PASSWORD)
    await conn.connect()
    started = time.monotonic()
    todo = iter(range(sessions))

    async def worker() -> None:
        for i in todo:
            client = f"reshard-{i // PER_CLIENT}"
            _, stored = storedids.new(bucket_of(client, DEFAULT_BUCKETS))  # a version 8 id, as the service makes
            r = await conn.call("sc.session_create", [None, stored, client, None, 3600, {"i": i}])
            if r[0]["status"] != "OK":
                raise RuntimeError(f"preload: {r[0]}")

    await asyncio.gather(*(worker() for _ in range(PRELOAD_INFLIGHT)))
    await conn.disconnect()
    return time.monotonic() - started


def _rows(nodes: list[Any], space: str) -> int | None:
    """Rows of a space on a trio's leader (sc.stats); None when no instance answers as writable."""
    import tarantool  # noqa: PLC0415 - the server extra's connector

    for n in nodes:
        try:
            conn = tarantool.Connection("127.0.0.1", n.port, user=SERVICE_USER, password=SERVICE_PASSWORD)
        except (tarantool.error.Error, OSError):
            continue
        try:
            if conn.call("sc.role", [None]).data[0].get("writable"):
                return int(conn.call("sc.stats", [None]).data[0]["spaces"][space])
        finally:
            conn.close()
    return None


def main(sessions: int, out_path: str, *, parallel: int = 2, pause_ms: int = 0) -> int:
    from smartcache.ops import cluster, moves  # noqa: PLC0415 - the server extra's connector

    print(f"resharding: two trios, the map naming s1 only; preloading {sessions:,} sessions", file=sys.stderr)
    # On tmpfs: six instances' WAL of a million sessions on this VM's disk stalled writes for up to 21 s (the
    # kernel's writeback), a failover that measures the disk, not the move.
    with sharded_stack(2, buckets=DEFAULT_BUCKETS, mapped=1, memtx_memory=str(3 << 30), data_dir="/dev/shm") as st:  # noqa: S108 - mkdtemp in it
        leader = next(n for n in st.shards["s1"] if _writable(n))
        took = asyncio.run(_preload("127.0.0.1", leader.port, sessions))
        print(f"  preloaded in {took:.0f} s ({sessions / took:,.0f}/s)", file=sys.stderr, flush=True)
        access = cluster.Access(addresses=(), user="operator", password=OPERATOR_PASSWORD, etcd=st.etcd_urls,
                                cluster="bench")  # fmt: skip
        job = Job(endpoint=st.service.endpoint, scenario="session", duration_s=SLICE_S * 2, inflight=16)
        before = runner.run(job, 2, label="before the move", progress=False)
        print(format_line(before), flush=True)
        added = moves.shard_add(access, "s2")
        if added.get("status") != "OK":
            raise RuntimeError(f"shard add: {added}")
        plan = moves.plan_even(moves.read_map(access)[0], ["s1", "s2"])
        result: dict[str, Any] = {}

        def rebalance() -> None:
            result.update(moves.run_moves(access, plan, parallel=parallel, pause_s=pause_ms / 1000))

        mover = threading.Thread(target=rebalance)
        mover.start()
        during: list[dict[str, Any]] = []
        while mover.is_alive():
            rep = runner.run(
                Job(endpoint=st.service.endpoint, scenario="session", duration_s=SLICE_S, inflight=16), 2,
                label=f"during the move, slice {len(during) + 1}", progress=False,
            )  # fmt: skip
            during.append(rep)
            print(format_line(rep), flush=True)
        mover.join()
        after = runner.run(job, 2, label="after the move", progress=False)
        print(format_line(after), flush=True)
        counts = {s: _rows(nodes, "sessions") for s, nodes in st.shards.items()}
        placement = _placement(access)
    replies = sum(r["replies"] for r in during)
    elapsed = sum(r["elapsed_s"] for r in during)
    summary = {
        "sessions_preloaded": sessions,
        "parallel": parallel,
        "pause_ms": pause_ms,
        "plan_buckets": len(plan),
        "move": result,
        "throughput_before_rps": before["throughput_rps"],
        "throughput_during_rps": round(replies / elapsed, 1) if elapsed else None,
        "throughput_after_rps": after["throughput_rps"],
        "ratio_during_to_before": round(replies / elapsed / before["throughput_rps"], 2) if elapsed else None,
        "sessions_per_shard_after": counts,
        "placement": placement,
        "failed_outcomes_during": {k: v for r in during for k, v in r["outcomes"].items() if k != "OK"},
    }
    print(json.dumps(summary, indent=2))
    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    with open(out_path, "w") as f:
        json.dump({"summary": summary, "runs": [before, *during, after]}, f, indent=2)
    ok = result.get("status") == "OK" and placement["wrong"] == 0 and placement["leftover_rows"] == 0
    return 0 if ok else 1


def _writable(node: Any) -> bool:
    import tarantool  # noqa: PLC0415

    try:
        conn = tarantool.Connection("127.0.0.1", node.port, user=SERVICE_USER, password=SERVICE_PASSWORD)
    except (tarantool.error.Error, OSError):
        return False
    try:
        return bool(conn.call("sc.role", [None]).data[0].get("writable"))
    finally:
        conn.close()


def _placement(access: Any) -> dict[str, int]:
    """From storage: buckets active on a shard the map does not name (or on none, or two), and rows of a bucket
    left on a shard that does not own it."""
    from smartcache.ops import moves  # noqa: PLC0415

    doc, _ = moves.read_map(access)
    owner = moves.owners(doc)
    links = moves.Links(access)
    try:
        held = {s: links[s].call("buckets_held") for s in doc["shards"]}
        active = {s: {b for b, _ in h["active"]} for s, h in held.items()}
        wrong = sum(1 for b in range(len(owner)) if [s for s in doc["shards"] if b in active[s]] != [owner[b]])
        leftover = 0
        for s in doc["shards"]:
            for b in range(len(owner)):
                if owner[b] != s:
                    leftover += int(links[s].call("bucket_state", b).get("rows") or 0)
        moving = sum(len(h["moving"]) for h in held.values())
    finally:
        links.close()
    return {"wrong": wrong, "leftover_rows": leftover, "moving": moving,
            **{f"buckets_{s}": len(a) for s, a in active.items()}}  # fmt: skip
