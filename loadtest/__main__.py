"""``python -m loadtest``: load generator, benchmark, overload and prewarm experiments.

python -m loadtest run --endpoint tcp://127.0.0.1:5555 --scenario session --inflight 128 --procs 2
python -m loadtest run --scenario overload --rate 15000 --duration 10
python -m loadtest bench                # what `make bench` runs
python -m loadtest overload             # 2.5x capacity against a fresh stack
python -m loadtest prewarm              # the original's claim: products before login
python -m loadtest coordination         # issue 17's four numbers: counters, lock hand-over, ids, kill -9
python -m loadtest events               # issue 16's four numbers: latency, subscriber restart, on/off, drop
python -m loadtest profile              # py-spy on the service at W=16: threads, the loop's top functions
python -m loadtest resharding          # issue 27: half of 1,000,000 sessions moved to a new shard under load
python -m loadtest near                 # issue 38: a front server's session reads with and without its near cache
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from loadtest import ceiling, coordination, cpu, direct, runner
from loadtest import events as events_bench
from loadtest import nearcache as near_bench
from loadtest.backend import Backend
from loadtest.generator import Job
from loadtest.prewarm import run as run_prewarm
from loadtest.report import format_line
from loadtest.stack import (
    ServiceUnderTest,
    curve_keys,
    ha_stack,
    process_cpu_seconds,
    service,
    sharded_stack,
    stack,
)
from smartcache.client import Client

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"
WS = (1, 16, 128)  # the bench's closed-loop concurrencies (requests in flight)
#: measured after the service at each W (loadtest/ceiling.py): the bare path as the issue sketched it (zmq.asyncio),
#: the bare path read as the service reads (a socket drained at each readiness, the service's loop: the ratio goal's
#: yardstick, the stricter), and the transport alone (ZeroMQ's echo, in C)
CEILINGS = ("sketch", "sketch drained", "zmq echo")


def _save(path: str | None, doc: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"\nwrote {path}")


def cmd_run(a: argparse.Namespace) -> int:
    job = Job(
        endpoint=a.endpoint,
        scenario=a.scenario,
        duration_s=a.duration,
        inflight=a.inflight,
        rate=a.rate,
        lifetime_ms=a.lifetime_ms,
    )
    mode = f"rate {a.rate:.0f}/s" if a.rate else f"W={a.inflight}"
    rep = runner.run(job, a.procs, label=f"{a.scenario} {mode}")
    print(format_line(rep))
    print("outcomes:", json.dumps(rep["outcomes"]))
    _save(a.json, rep)
    return 0 if not rep["lost"] else 1


def cmd_bench(a: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    ceilings: list[dict[str, Any]] = []  # CEILINGS at each W, right after the service: every later change is judged
    # against the ceilings of the same minute
    # The baseline rows: one instance with wal_mode write (survives a process crash), as measured before, each W
    # with its ceilings (the sketches on the same Tarantool).
    with (
        stack(tarantool_env={"SC_WAL_MODE": "write"}) as (master, sut),
        ceiling.running("sketch", tarantool=master.address) as sketch,
        ceiling.running("sketch", tarantool=master.address, drained=True) as drained,
        ceiling.running("echo") as echo,
    ):
        cpu0 = sut.cpu_seconds()
        for inflight in WS:
            rows.append(_timed(sut.endpoint, inflight, a.duration, "service", sut.proc.pid, tarantool=master.pid))
            ceilings.append(_timed(sketch.endpoint, inflight, a.duration, "sketch", sketch.pid, tarantool=master.pid))
            ceilings.append(
                _timed(drained.endpoint, inflight, a.duration, "sketch drained", drained.pid, tarantool=master.pid)
            )
            ceilings.append(_timed(echo.endpoint, inflight, a.duration, "zmq echo", echo.pid))
        service_cpu = sut.cpu_seconds() - cpu0
        answered = sum(r["replies"] for r in rows)
        peak_rss = sut.rss_bytes("VmHWM")
        if a.quick:
            _print_ratios(rows, ceilings)
            at = time.strftime("%FT%TZ", time.gmtime())
            _save(a.json, {"machine": _machine(), "runs": [*rows, *ceilings], "at": at})
            return 0
        curve_row, d = _curve_and_direct(master, a.duration)
        rows.append(d)
    # More than one core behind one endpoint: --processes 2 against 1, back to back (fresh stacks, W=128).
    print("  processes: one endpoint served by 1 and by 2 service processes...", file=sys.stderr, flush=True)
    processes = [_processes_row(n, a.duration) for n in (1, 2)]
    # The durability profiles: one instance with fsync (the standalone default), and HA (three instances,
    # synchronous sessions: an acknowledged write is on a quorum).
    print("  profiles: one instance with fsync; three with synchronous replication...", file=sys.stderr, flush=True)
    profiles = []
    with stack(tarantool_env={"SC_WAL_MODE": "fsync"}) as (_, fsynced):
        job = Job(endpoint=fsynced.endpoint, scenario="session", duration_s=a.duration, inflight=128)
        profiles.append(runner.run(job, 2, label="service session W=128 fsync"))
        print(format_line(profiles[-1]), flush=True)
    with ha_stack() as (_, ha):
        job = Job(endpoint=ha.endpoint, scenario="session", duration_s=a.duration, inflight=128)
        profiles.append(runner.run(job, 2, label="service session W=128 HA 3 sync"))
        print(format_line(profiles[-1]), flush=True)
        reads = [_read_heavy(ha, "service session-read W=16 HA 3 sync", a.duration)]
    # Sharded by client: one replica set and two, the same discovery path, back to back; on one box this
    # shows what routing costs and where the CPU goes (what a shard and a service instance carry), not scale.
    print("  sharded: one shard and two (three HA instances each), found in etcd...", file=sys.stderr, flush=True)
    sharding = [_sharded_row(shards, a.duration) for shards in (1, 2)]
    # The front tier's shape: 20 reads to 1 write, with today's refresh (after a tenth of the TTL) and
    # the one before it (after 1 s: SC_REFRESH_FRACTION=0), storage writes per read beside each.
    print("  session-read: 20 reads to 1 write, refresh after ttl/10 and after 1 s...", file=sys.stderr, flush=True)
    with ha_stack(tarantool_env={"SC_REFRESH_FRACTION": "0"}) as (_, ha):
        reads.append(_read_heavy(ha, "service session-read W=16 HA 3 sync, refresh after 1 s", a.duration))
    with stack(tarantool_env={"SC_WAL_MODE": "write"}) as (_, one):
        reads.append(_read_heavy(one, "service session-read W=16", a.duration))
        # Issue 38: one front-server process reading sessions (20:1) with and without its near cache.
        print("  near cache: a front server's session reads, with and without it...", file=sys.stderr, flush=True)
        near_rows = near_bench.rows(one.endpoint, one.events_endpoint, a.duration)
    with stack(tarantool_env={"SC_WAL_MODE": "write", "SC_REFRESH_FRACTION": "0"}) as (_, one):
        reads.append(_read_heavy(one, "service session-read W=16, refresh after 1 s", a.duration))
    best = max(r["throughput_rps"] for r in rows[:3])
    summary = {
        "service_best_rps": best,
        **{f"ratio_service_to_{name.replace(' ', '_')}": r for name, r in _ratios(rows, ceilings).items()},
        "direct_rps": d["throughput_rps"],
        "ratio_service_to_direct": round(best / d["throughput_rps"], 2),
        "ratio_curve_to_plain_at_W128": round(curve_row["throughput_rps"] / rows[2]["throughput_rps"], 2),
        "ratio_fsync_to_write_at_W128": round(profiles[0]["throughput_rps"] / rows[2]["throughput_rps"], 2),
        "ratio_ha_sync_to_write_at_W128": round(profiles[1]["throughput_rps"] / rows[2]["throughput_rps"], 2),
        "ratio_two_processes_to_one_at_W128": round(processes[1]["throughput_rps"] / processes[0]["throughput_rps"], 2),
        "ratio_two_shards_to_one_at_W128": round(sharding[1]["throughput_rps"] / sharding[0]["throughput_rps"], 2),
        "service_peak_rss_mib": round(peak_rss / 2**20, 1),
        "service_cpu_seconds_per_1000_requests": round(service_cpu / answered * 1000, 3),
        "target_12000_rps_at_W128": rows[2]["throughput_rps"] >= 12000,
        "target_p99_under_10ms_at_W16": rows[1]["latency"]["p99_ms"] < 10,
        **near_bench.summary(near_rows),
    }
    _print_summary(summary)
    _save(
        a.json,
        {
            "machine": _machine(),
            "runs": [*rows, *ceilings, curve_row, *processes, *profiles, *sharding, *reads, *near_rows],
            "summary": summary,
            "at": time.strftime("%FT%TZ", time.gmtime()),
        },
    )
    return 0


def cmd_overload(a: argparse.Namespace) -> int:
    """Measure capacity closed-loop, then drive factor x that rate open-loop; watch refusals and RSS."""
    backend = Backend(latency_ms=a.backend_ms).start()
    env = {"SMARTCACHE_QUEUE_CAPACITY": str(a.queue), "SMARTCACHE_BACKEND_URL": backend.url}
    try:
        with stack(env) as (_, sut):
            probe = Job(endpoint=sut.endpoint, scenario=a.scenario, duration_s=4, inflight=a.probe_inflight)
            cap = runner.run(probe, 2, label="capacity probe")
            rate = cap["throughput_rps"] * a.factor
            print(format_line(cap), flush=True)
            rss: list[int] = []
            stop = threading.Event()

            def sample() -> None:
                while not stop.wait(0.5):
                    rss.append(sut.rss_bytes())

            t = threading.Thread(target=sample, daemon=True)
            t.start()
            job = Job(endpoint=sut.endpoint, scenario=a.scenario, duration_s=a.duration, rate=rate)
            rep = runner.run(job, a.procs, label=f"{a.scenario} {a.factor}x = {rate:.0f}/s")
            stop.set()
            t.join()
    finally:
        backend.stop()
    print(format_line(rep))
    print("outcomes:", json.dumps(rep["outcomes"]))
    rss_mib = [round(x / 2**20, 1) for x in rss]
    print(
        f"service RSS during overload (MiB): first {rss_mib[0]}, min {min(rss_mib)}, max {max(rss_mib)}, "
        f"last {rss_mib[-1]}"
    )
    _save(a.json, {"capacity": cap, "overload": rep, "rss_mib": rss_mib})
    return 0


def cmd_coordination(a: argparse.Namespace) -> int:
    doc = coordination.run(
        duration_s=a.duration,
        inflight=a.inflight,
        rounds=a.rounds,
        ids_total=a.ids,
        clients=a.clients,
        lease_ms=a.lease_ms,
        kills=a.kills,
        wal_mode=a.wal_mode,
    )
    _save(a.json, {"machine": _machine(), **doc, "at": time.strftime("%FT%TZ", time.gmtime())})
    return 0


def cmd_events(a: argparse.Namespace) -> int:
    doc = events_bench.run(
        rate=a.rate,
        duration_s=a.duration,
        inflight=a.inflight,
        rounds=a.rounds,
        drop_events=a.drop_events,
        readers=a.readers,
    )
    _save(a.json, {"machine": _machine(), **doc, "at": time.strftime("%FT%TZ", time.gmtime())})
    return 0


def cmd_prewarm(a: argparse.Namespace) -> int:
    doc = run_prewarm(logins=a.logins, latency_ms=a.latency_ms, reads_per_type=a.reads)
    _save(a.json, doc)
    return 0


def _session_counts(sut: ServiceUnderTest) -> tuple[int, int]:
    """(SESSION_GET answered OK, deadlines refreshed by storage's leader) so far: INFO's own counts."""
    with Client(sut.endpoint, timeout_s=5) as c:
        info = c.info().body
    gets = int(info["messages"].get("session_get", {}).get("ok", 0))  # metric labels: lower case
    return gets, int(info["storage_stats"].get("session_refreshes", 0))


def _timed(endpoint: str, inflight: int, duration_s: float, what: str, pid: int, *, tarantool: int = 0) -> dict:
    """The session scenario at W=inflight against one target, with the CPU each thread of the target, of its
    Tarantool and of the load generator spent per request."""
    job = Job(endpoint=endpoint, scenario="session", duration_s=duration_s, inflight=inflight)
    pids = {what: pid, "tarantool": tarantool} if tarantool else {what: pid}
    before = {name: cpu.snapshot(p) for name, p in pids.items()}
    rep = runner.run(job, 1 if inflight == 1 else 2, label=f"{what}{' session' * (what == 'service')} W={inflight}")
    n = rep["replies"]
    per = {name: cpu.per_request(before[name], cpu.snapshot(p), n) for name, p in pids.items()}
    per["load generator"] = {"all": round(rep["generator_cpu_s"] / max(1, n) * 1e6, 1)}
    rep["cpu_us_per_request"] = per
    shown = "; ".join(
        f"{name} {cpu.total(threads)} ({', '.join(f'{t} {v}' for t, v in threads.items())})" if len(threads) > 1
        else f"{name} {cpu.total(threads)}"
        for name, threads in per.items()
    )  # fmt: skip
    print(f"{format_line(rep)}\n    CPU µs per request: {shown}", flush=True)
    return rep


def _ratios(rows: list[dict[str, Any]], ceilings: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Service/ceiling per W: rows are the service's at WS, ceilings those of CEILINGS after each."""
    return {
        name: {f"W={w}": round(rows[i]["throughput_rps"] / ceilings[len(CEILINGS) * i + k]["throughput_rps"], 2)
               for i, w in enumerate(WS)}
        for k, name in enumerate(CEILINGS)
    }  # fmt: skip


def _print_ratios(rows: list[dict[str, Any]], ceilings: list[dict[str, Any]]) -> None:
    for name, ratios in _ratios(rows, ceilings).items():
        print(f"ratio service/{name} (same minute): {', '.join(f'{w} {r}' for w, r in ratios.items())}")


def _print_summary(summary: dict[str, Any]) -> None:
    print()
    for name in CEILINGS:
        ratios = ", ".join(f"{w} {r}" for w, r in summary[f"ratio_service_to_{name.replace(' ', '_')}"].items())
        print(f"ratio service/{name} (same minute): {ratios}")
    print(f"ratio service/direct: {summary['ratio_service_to_direct']} (original: 7000/12000 = 0.58)")
    print(f"ratio CURVE/plain at W=128: {summary['ratio_curve_to_plain_at_W128']} (aim: at least 0.75)")
    print(
        f"durability at W=128, ratio to wal_mode write: fsync {summary['ratio_fsync_to_write_at_W128']}, "
        f"HA 3 instances with synchronous sessions {summary['ratio_ha_sync_to_write_at_W128']}"
    )
    two = summary["ratio_two_processes_to_one_at_W128"]
    print(f"--processes 2 to 1 at W=128: {two} (2 cores, shared with the load generator and Tarantool)")
    print(f"sharded at W=128, two shards to one: {summary['ratio_two_shards_to_one_at_W128']} (one box: routing cost)")
    print(
        f"service peak RSS: {summary['service_peak_rss_mib']} MiB; "
        f"CPU per 1,000 requests: {summary['service_cpu_seconds_per_1000_requests']} s"
    )
    print(near_bench.summary_line(summary))
    print(
        f"targets: 12,000/s at W=128: {'met' if summary['target_12000_rps_at_W128'] else 'NOT met'}; "
        f"p99 < 10 ms at W=16: {'met' if summary['target_p99_under_10ms_at_W16'] else 'NOT met'}"
    )


def _curve_and_direct(master: Any, duration_s: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The W=128 row through a second service that requires CURVE (the cost of encryption), and the same
    procedures called straight from 4 threads (direct)."""
    print("  CURVE: a second service with encryption and client keys...", file=sys.stderr, flush=True)
    keys_dir = Path(tempfile.mkdtemp(prefix="smartcache-bench-keys-"))
    curve_env, keys = curve_keys(keys_dir)
    with service(master, keys_dir / "service.log", curve_env, curve=keys) as secure:
        job = Job(endpoint=secure.endpoint, scenario="session", duration_s=duration_s, inflight=128, curve=keys)
        curve_row = runner.run(job, 2, label="service session W=128 CURVE")
        print(format_line(curve_row), flush=True)
    print("  direct: 4 threads calling the same procedures...", file=sys.stderr, flush=True)
    d = direct.run(master.address, threads=4, duration_s=duration_s)
    print(format_line(d), flush=True)
    return curve_row, d


def _processes_row(n: int, duration_s: float) -> dict[str, Any]:
    """The session scenario at W=128 through `smartcache --processes n` (one endpoint), with the CPU per 1,000
    requests of the parent (its proxy) and of all its service processes, and of Tarantool."""
    with stack({"SMARTCACHE_PROCESSES": str(n)}, {"SC_WAL_MODE": "write"}) as (master, sut):
        parent0, all0, tnt0 = sut.cpu_seconds(), process_cpu_seconds(sut.proc.pid), process_cpu_seconds(master.pid)
        threads0 = cpu.snapshot(sut.proc.pid)
        job = Job(endpoint=sut.endpoint, scenario="session", duration_s=duration_s, inflight=128)
        rep = runner.run(job, 2, label=f"service session W=128 --processes {n}")
        parent, everything = sut.cpu_seconds() - parent0, process_cpu_seconds(sut.proc.pid) - all0
        if n > 1:  # the parent's threads: the proxy's (the busiest python one) and libzmq's I/O threads
            rep["parent_cpu_us_per_request"] = cpu.per_request(threads0, cpu.snapshot(sut.proc.pid), rep["replies"])
        tnt = process_cpu_seconds(master.pid) - tnt0
    per = 1000 / max(1, rep["replies"])
    rep["cpu_seconds_per_1000"] = {
        "service processes": round((everything - parent) * per if n > 1 else everything * per, 3),
        **({"parent (proxy)": round(parent * per, 3)} if n > 1 else {}),
        "tarantool": round(tnt * per, 3),
        "load generator": round(rep["generator_cpu_s"] * per, 3),
    }
    print(f"{format_line(rep)}\n    CPU s per 1,000 requests: {rep['cpu_seconds_per_1000']}", flush=True)
    if n > 1:
        print(f"    the parent's threads, CPU µs per request: {rep['parent_cpu_us_per_request']}", flush=True)
    return rep


def _sharded_row(shards: int, duration_s: float) -> dict[str, Any]:
    """The session scenario at W=128 against `shards` HA trios found in etcd, with the CPU each process
    spent per 1,000 answered requests (the capacity model's inputs: docs/sharding.md)."""
    label = f"service session W=128 {'one shard' if shards == 1 else f'{shards} shards'}, discovery"
    with sharded_stack(shards) as st:
        cpu0 = st.cpu()
        rep = runner.run(Job(endpoint=st.service.endpoint, scenario="session", duration_s=duration_s, inflight=128), 2,
                         label=label)  # fmt: skip
        cpu1 = st.cpu()
    per = 1000 / max(1, rep["replies"])
    rep["cpu_seconds_per_1000"] = {k: round((cpu1[k] - cpu0[k]) * per, 3) for k in cpu0}
    print(f"{format_line(rep)}\n    CPU s per 1,000 requests: {rep['cpu_seconds_per_1000']}", flush=True)
    return rep


def _read_heavy(sut: ServiceUnderTest, label: str, duration_s: float) -> dict[str, Any]:
    """The session-read scenario at W=16, with the storage writes each read cost (refreshes per read)."""
    gets0, refreshes0 = _session_counts(sut)
    job = Job(endpoint=sut.endpoint, scenario="session-read", duration_s=duration_s, inflight=16)
    rep = runner.run(job, 2, label=label)
    gets, refreshes = _session_counts(sut)
    rep["storage_writes_per_read"] = round((refreshes - refreshes0) / max(1, gets - gets0), 4)
    print(f"{format_line(rep)}  storage writes per read {rep['storage_writes_per_read']}", flush=True)
    return rep


def _machine() -> dict[str, Any]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "?",
    )
    return {"cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version(), "kernel": platform.release()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one load run against a running service")
    r.add_argument("--endpoint", default=DEFAULT_ENDPOINT)
    r.add_argument(
        "--scenario", default="session", choices=["session", "cache", "mixed", "overload", "slow-backend", "counter"]
    )
    r.add_argument("--inflight", type=int, default=16, help="closed loop: requests in flight in all")
    r.add_argument("--rate", type=float, default=0.0, help="open loop: requests per second in all")
    r.add_argument("--procs", type=int, default=2)
    r.add_argument("--duration", type=float, default=10.0)
    r.add_argument("--lifetime-ms", type=int, default=0)
    r.add_argument("--json", default="var/run.json")
    _resharding_parser(sub)
    _profile_parser(sub)
    _bench_parser(sub)
    o = sub.add_parser("overload", help="open loop at factor x measured capacity")
    o.add_argument("--scenario", default="slow-backend", choices=["slow-backend", "session", "cache"])
    o.add_argument("--factor", type=float, default=2.5)
    o.add_argument("--duration", type=float, default=10.0)
    o.add_argument("--queue", type=int, default=300)
    o.add_argument("--backend-ms", type=float, default=200.0, help="simulated backend latency (slow-backend)")
    o.add_argument("--probe-inflight", type=int, default=128)
    o.add_argument("--procs", type=int, default=2)
    o.add_argument("--json", default="var/overload.json")
    w = sub.add_parser("prewarm", help="time to products after login, with and without prewarm")
    w.add_argument("--logins", type=int, default=200)
    w.add_argument("--latency-ms", type=float, default=200.0)
    w.add_argument("--reads", type=int, default=4, help="product reads per data type per session")
    w.add_argument("--json", default="var/prewarm.json")
    c = sub.add_parser("coordination", help="issue 17: COUNTER_ADD vs sessions, lock hand-over, ids, kill -9")
    c.add_argument("--duration", type=float, default=10.0, help="seconds per throughput row")
    c.add_argument("--inflight", type=int, default=128, help="requests in flight, throughput rows")
    c.add_argument("--rounds", type=int, default=2000, help="lock hand-overs measured")
    c.add_argument("--ids", type=int, default=10_000_000, help="ids drawn in all by 2 x --clients clients")
    c.add_argument("--clients", type=int, default=16, help="id clients per service instance")
    c.add_argument("--lease-ms", type=int, default=1000, help="lease of the holder killed with kill -9")
    c.add_argument("--kills", type=int, default=5, help="holders killed")
    c.add_argument("--wal-mode", default="write", choices=["write", "fsync"], help="Tarantool's SC_WAL_MODE")
    c.add_argument("--json", default="var/coordination.json")
    e = sub.add_parser("events", help="issue 16: event latency, subscriber restart, events on/off, partition drop")
    e.add_argument("--rate", type=float, default=5000.0, help="events per second, latency and restart runs")
    e.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    e.add_argument("--inflight", type=int, default=128, help="requests in flight, session throughput runs")
    e.add_argument("--rounds", type=int, default=3, help="throughput rounds (off, on, on without a subscriber)")
    e.add_argument("--drop-events", type=int, default=1_000_000, help="events in the partition dropped")
    e.add_argument("--readers", type=int, default=1000, help="EVENTS_READ waiting at once")
    e.add_argument("--json", default="var/events.json")
    a = p.parse_args(argv)
    Path("var").mkdir(exist_ok=True)
    commands = {"run": cmd_run, "bench": cmd_bench, "overload": cmd_overload, "prewarm": cmd_prewarm}
    commands |= {"coordination": cmd_coordination, "events": cmd_events, "resharding": cmd_resharding}
    return {**commands, "profile": cmd_profile, "near": cmd_near}[a.cmd](a)


def cmd_near(a: argparse.Namespace) -> int:
    """Issue 38's rows alone, against a fresh one-instance stack."""
    with stack(tarantool_env={"SC_WAL_MODE": "write"}) as (_, one):
        doc = near_bench.rows(one.endpoint, one.events_endpoint, a.duration, tuple(a.ws))
    summary = near_bench.summary(doc)
    print(near_bench.summary_line(summary))
    _save(
        a.json, {"machine": _machine(), "runs": doc, "summary": summary, "at": time.strftime("%FT%TZ", time.gmtime())}
    )
    return 0


def _bench_parser(sub: Any) -> None:
    n = sub.add_parser("near", help="a front server's session reads (20:1) with and without its near cache")
    n.add_argument("--duration", type=float, default=5.0)
    n.add_argument("--ws", type=int, nargs="+", default=list(near_bench.WS))
    n.add_argument("--json", default="var/near.json")
    b = sub.add_parser("bench", help="session scenario W=1/16/128 through the service, its ceilings, and direct")
    b.add_argument("--duration", type=float, default=10.0)
    b.add_argument("--json", default="var/bench.json")
    b.add_argument("--quick", action="store_true", help="only the service rows and their ceilings (about 2 min)")


def _profile_parser(sub: Any) -> None:
    pr = sub.add_parser("profile", help="py-spy samples of the service at W=16: threads and the loop's top functions")
    pr.add_argument("--inflight", type=int, default=16)
    pr.add_argument("--duration", type=float, default=15.0)
    pr.add_argument("--out", default="var/profile-w16.txt")
    pr.add_argument("--target", default="", choices=["", "sketch", "sketch drained"], help="a ceiling instead")


def _resharding_parser(sub: Any) -> None:
    rs = sub.add_parser("resharding", help="half of a shard's sessions moved to a new shard under the session load")
    rs.add_argument("--sessions", type=int, default=1_000_000, help="sessions preloaded on the first shard")
    rs.add_argument("--parallel", type=int, default=2, help="moves at once (rebalance --parallel)")
    rs.add_argument("--pause-ms", type=int, default=0, help="rest after each move, per worker (rebalance --pause-ms)")
    rs.add_argument("--json", default="var/resharding.json")


def cmd_profile(a: argparse.Namespace) -> int:
    from loadtest import profile  # noqa: PLC0415 - needs py-spy (a dev dependency)

    return profile.run(a.inflight, a.duration, out=a.out, target=a.target)


def cmd_resharding(a: argparse.Namespace) -> int:
    from loadtest import resharding  # noqa: PLC0415 - its stack needs the server extra

    return resharding.main(a.sessions, a.json, parallel=a.parallel, pause_ms=a.pause_ms)


if __name__ == "__main__":
    sys.exit(main())
