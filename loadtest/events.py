"""``python -m loadtest events``: the numbers of issue 16, on one Tarantool and the service.

1. latency from an event's transaction in Tarantool to a subscribed front server (the client
   library's subscription on the service's PUB socket), at 5,000 events/s (EVENT_PUBLISH,
   open loop); p99 aimed at 5 ms. The event's time is taken inside its transaction, before the
   WAL write, so the number includes the commit;
2. a subscriber killed (SIGKILL) and restarted from its last sequence + 1 mid-stream: every
   published event delivered once, in order (checked by sequence);
3. the session scenario (closed loop) with events on (storage writes them, the service
   publishes, one subscriber follows) and off (``SC_EVENTS=false``, no publisher), alternating,
   same run: aimed within 15 %;
4. dropping a day partition of 1,000,000 events (``events_drop.lua``, a standalone instance):
   the drop, and the longest loop stall and write around it against the same window without one;

plus 1,000 concurrent EVENTS_READ waiting for a commit through one service (100 slots, the
bulkhead gives EVENTS_READ 10): what the readers get, and session latency meanwhile.

Tarantool runs with ``SC_WAL_MODE=write`` (the bench's baseline rows). Load generator,
subscriber, service and Tarantool share the machine's cores: compare rows of one run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asynctnt

from loadtest import runner
from loadtest.generator import Job
from loadtest.report import format_line, percentile
from loadtest.stack import ServiceUnderTest, stack
from smartcache.client import AsyncClient, Client
from smartcache.server.config import DEVELOPMENT_PASSWORD
from smartcache.wire import REGISTRY
from smartcache.wire.errors import RequestError

TARGET_P99_MS = 5.0
TARGET_THROUGHPUT_RATIO = 0.85
TARGET_DROP_MS = 100.0
WAL_WRITE = {"SC_WAL_MODE": "write", "SC_MEMTX_MEMORY": str(512 * 1024 * 1024)}
ROOT = Path(__file__).resolve().parents[1]


# -- processes: an open-loop producer, a subscriber that records what it got --------------------------------


class _Reply:
    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body


class _Direct:
    """sc.event_publish on Tarantool itself, pipelined: events made without the service's CPU."""

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        user, password = "smartcache", DEVELOPMENT_PASSWORD  # the test stack's service user
        self.conn = asynctnt.Connection(host=host, port=int(port), username=user, password=password)
        self.connected: asyncio.Future[Any] | None = None

    def call(self, _type: str, body: dict[str, Any]) -> asyncio.Future[Any]:
        return asyncio.ensure_future(self._call(body))

    async def _call(self, body: dict[str, Any]) -> _Reply:
        if self.connected is None:
            self.connected = asyncio.ensure_future(self.conn.connect())
        await self.connected
        resp = await self.conn.call("sc.event_publish", [None, body["topic"], body["key"], body["payload"]])
        return _Reply(resp.body[0])

    def close(self) -> None:
        self.conn.close()


def _produce(target: str, topic: str, rate: float, duration_s: float, out: Any) -> None:
    """Publish at `rate` per second for duration_s; puts {acked seqs, errors, sent} on out. target: the
    service (tcp://...: EVENT_PUBLISH) or Tarantool (host:port: sc.event_publish, as the service user)."""

    async def main() -> dict[str, Any]:
        client = _Direct(target) if not target.startswith("tcp://") else AsyncClient(target, timeout_s=10)
        loop = asyncio.get_running_loop()
        acked: list[int] = []
        errors: dict[str, int] = {}
        pending: set[asyncio.Future[Any]] = set()

        def done(f: asyncio.Future[Any]) -> None:
            pending.discard(f)
            if f.cancelled():
                errors["cancelled"] = errors.get("cancelled", 0) + 1
            elif (e := f.exception()) is not None:
                name = e.transport_error if isinstance(e, RequestError) else type(e).__name__
                errors[name] = errors.get(name, 0) + 1
            else:
                acked.append(int(f.result().body["seq"]))

        started, sent = loop.time(), 0
        while (elapsed := loop.time() - started) < duration_s:
            while sent < int(elapsed * rate):
                f = client.call("EVENT_PUBLISH", {"topic": topic, "key": str(sent), "payload": {"n": sent}})
                pending.add(f)
                f.add_done_callback(done)
                sent += 1
            await asyncio.sleep(0.001)
        if pending:
            await asyncio.wait(pending, timeout=15)
        client.close()
        return {"acked": sorted(acked), "errors": errors, "sent": sent, "seconds": loop.time() - started}

    out.put(asyncio.run(main()))


def _subscribe(where: tuple[str, str, str, int | None, str], ready: Any) -> None:
    """Follow a topic, one line per event: seq and delivery delay (ms, wall clocks of one machine).
    where: the service's endpoint, its events endpoint, the topic, the first sequence wanted, the file."""
    endpoint, publishers, topic, from_seq, path = where
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with Client(endpoint, timeout_s=5) as c, c.subscribe([topic], from_seq, publishers=publishers) as sub:
        ready.set()
        while True:
            e = sub.poll(3600)
            if e is not None:
                os.write(fd, f"{e.seq} {time.time() * 1000 - e.time_ms:.3f}\n".encode())


def _follow(endpoint: str, publishers: str, topic: str, ready: Any) -> None:
    """A front server's share of the work: follow `topic` and drop each event (no I/O per event)."""
    with Client(endpoint, timeout_s=5) as c, c.subscribe([topic], None, publishers=publishers) as sub:
        ready.set()
        while True:
            sub.poll(3600)


def _lines(path: Path) -> list[tuple[int, float]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        seq, delay = line.split()
        out.append((int(seq), float(delay)))
    return out


class Subscriber:
    """A subscriber process writing what it gets to a file; start, kill -9, start again from a sequence."""

    def __init__(self, sut: ServiceUnderTest, topic: str, path: Path) -> None:
        self.sut, self.topic, self.path = sut, topic, path
        self.ctx = mp.get_context("spawn")
        self.proc: Any = None

    def start(self, from_seq: int | None, *, record: bool = True) -> None:
        """record=False: follow without writing anything per event (the throughput rows)."""
        ready = self.ctx.Event()
        where = (self.sut.endpoint, self.sut.events_endpoint, self.topic, from_seq, str(self.path))
        target, args = (_subscribe, (where, ready)) if record else (_follow, (*where[:3], ready))
        self.proc = self.ctx.Process(target=target, args=args, daemon=True)
        self.proc.start()
        if not ready.wait(30):
            raise TimeoutError("subscriber not ready")
        time.sleep(0.3)  # the SUB socket's connection and subscription reach the publisher

    def kill(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.join(10)


def _publish_for(target: str, topic: str, rate: float, duration_s: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_produce, args=(target, topic, rate, duration_s, out), daemon=True)
    proc.start()
    result: dict[str, Any] = out.get(timeout=duration_s + 60)
    proc.join(10)
    return result


def _wait_lines(path: Path, n: int, timeout_s: float) -> list[tuple[int, float]]:
    deadline = time.monotonic() + timeout_s
    while len(_lines(path)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # a late duplicate would arrive now
    return _lines(path)


# -- the numbers --------------------------------------------------------------------------------------------


def latency(sut: ServiceUnderTest, target: str, rate: float, duration_s: float, base: Path) -> dict[str, Any]:
    """Events made by `target` (Tarantool's address, or the service's endpoint), followed through sut."""
    topic = f"app.bench-{uuid.uuid4().hex[:6]}"
    sub = Subscriber(sut, topic, base / f"latency-{topic}.txt")
    sub.start(None)
    try:
        produced = _publish_for(target, topic, rate, duration_s)
        got = _wait_lines(sub.path, len(produced["acked"]), 30)
    finally:
        sub.kill()
    delays = sorted(d for _, d in got)
    seqs = [s for s, _ in got]
    return {
        "made_by": "service" if target.startswith("tcp://") else "tarantool",
        "rate_asked": rate,
        "rate_published": round(len(produced["acked"]) / produced["seconds"]),
        "published": len(produced["acked"]),
        "delivered": len(got),
        "exact": seqs == produced["acked"],
        "publish_errors": produced["errors"],
        "p50_ms": round(percentile(delays, 50), 2),
        "p90_ms": round(percentile(delays, 90), 2),
        "p99_ms": round(percentile(delays, 99), 2),
        "p99_9_ms": round(percentile(delays, 99.9), 2),
        "max_ms": round(delays[-1], 2) if delays else None,
    }


def restart(sut: ServiceUnderTest, rate: float, duration_s: float, base: Path) -> dict[str, Any]:
    """Events made through the service (EVENT_PUBLISH); the subscriber killed at 40 %, restarted at 50 %."""
    topic = f"app.restart-{uuid.uuid4().hex[:6]}"
    sub = Subscriber(sut, topic, base / "restart.txt")
    sub.start(None)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    producer = ctx.Process(target=_produce, args=(sut.endpoint, topic, rate, duration_s, out), daemon=True)
    producer.start()
    try:
        time.sleep(duration_s * 0.4)
        sub.kill()
        killed_after = len(_lines(sub.path))
        time.sleep(duration_s * 0.1)  # events keep coming while it is down
        from_seq = _lines(sub.path)[-1][0] + 1
        sub.start(from_seq)
        produced = out.get(timeout=duration_s + 60)
        producer.join(10)
        got = [s for s, _ in _wait_lines(sub.path, len(produced["acked"]), 60)]
    finally:
        sub.kill()
    acked = produced["acked"]
    return {
        "published": len(acked),
        "killed_after": killed_after,
        "restarted_from": from_seq,
        "delivered": len(got),
        "duplicates": len(got) - len(set(got)),
        "missing": len(set(acked) - set(got)),
        "in_order": got == sorted(got),
        "exact": got == acked,
    }


def throughput(duration_s: float, inflight: int, rounds: int) -> dict[str, Any]:
    """Alternate events off / on / on without a subscriber here (fresh stacks), `rounds` times each.

    on: storage writes events, the service publishes them, and a subscriber process (the client
    library, as a front server runs it) follows every session event on this machine's cores too;
    on_no_subscriber: the same without it (a front server elsewhere)."""
    rows: dict[str, list[dict[str, Any]]] = {"off": [], "on": [], "on_no_subscriber": []}
    modes = list(rows)
    for i in range(rounds):
        # The order turns each round: a machine getting busier or quieter favours none of them.
        for mode in modes[i % 3 :] + modes[: i % 3]:
            done = rows[mode]
            tarantool_env = {**WAL_WRITE, **({"SC_EVENTS": "false"} if mode == "off" else {})}
            service_env = {"SMARTCACHE_EVENTS_LISTEN": "none"} if mode == "off" else {}
            with stack(service_env, tarantool_env) as (_, sut):
                sub = None
                if mode == "on":
                    sub = Subscriber(sut, "session.", Path(tempfile.mkdtemp()) / "sessions.txt")
                    sub.start(None, record=False)
                try:
                    job = Job(endpoint=sut.endpoint, scenario="session", duration_s=duration_s, inflight=inflight)
                    rep = runner.run(job, 2, label=f"session W={inflight} events {mode}")
                finally:
                    if sub is not None:
                        sub.kill()
                print(format_line(rep), flush=True)
                done.append(rep)

    def ratio(mode: str) -> float:
        """The median over rounds of (mode / off, same round): rows a few seconds apart share the machine's state."""
        pairs = sorted(a["throughput_rps"] / b["throughput_rps"] for a, b in zip(rows[mode], rows["off"], strict=True))
        return round(float(statistics.median(pairs)), 3)

    return {
        "inflight": inflight,
        **{f"{m}_rps": [r["throughput_rps"] for r in rs] for m, rs in rows.items()},
        **{f"{m}_p99_ms": [r["latency"]["p99_ms"] for r in rs] for m, rs in rows.items()},
        "ratio_on_to_off": ratio("on"),
        "ratio_on_no_subscriber_to_off": ratio("on_no_subscriber"),
    }


def drop(events: int) -> dict[str, Any]:
    done = subprocess.run(
        [shutil.which("tarantool") or "tarantool", str(ROOT / "loadtest" / "events_drop.lua"), str(events)],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
        cwd=tempfile.mkdtemp(prefix="smartcache-drop-"),
    )
    doc: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return doc


def waiting_readers(sut: ServiceUnderTest, readers: int, wait_ms: int) -> dict[str, Any]:
    """`readers` EVENTS_READ waiting at once; one event after 1 s; sessions measured meanwhile."""

    async def main() -> dict[str, Any]:
        c = AsyncClient(sut.endpoint, timeout_s=wait_ms / 1000 + 5)
        head = (await c.call("EVENTS_READ")).body["head_seq"]
        body = {"after_seq": head, "topics": ["app.wake"], "wait_ms": wait_ms}
        outcomes: dict[str, int] = {}
        woken: list[float] = []
        published_at: list[float] = []

        async def reader() -> None:
            try:
                r = await c.call("EVENTS_READ", body, lifetime_ms=wait_ms + 1000)
            except RequestError as e:
                outcomes[e.transport_error] = outcomes.get(e.transport_error, 0) + 1
                return
            got = "event" if r.body.get("events") else "empty"
            outcomes[got] = outcomes.get(got, 0) + 1
            if got == "event" and published_at:
                woken.append(time.monotonic() - published_at[0])

        async def sessions(until: float) -> list[float]:
            lat = []
            while time.monotonic() < until:
                t0 = time.monotonic()
                await c.call("SESSION_CREATE", {"client_id": "client-waiters"})
                lat.append(time.monotonic() - t0)
                await asyncio.sleep(0.005)
            return lat

        alone = sorted(await sessions(time.monotonic() + 2))  # the same without waiting readers, first
        started = time.monotonic()
        tasks = [asyncio.ensure_future(reader()) for _ in range(readers)]
        lat_task = asyncio.ensure_future(sessions(started + wait_ms / 1000 + 1))
        await asyncio.sleep(1.0)
        published_at.append(time.monotonic())
        await c.call("EVENT_PUBLISH", {"topic": "app.wake", "payload": {}})
        await asyncio.gather(*tasks)
        lat = sorted(await lat_task)
        c.close()
        woken.sort()
        return {
            "readers": readers,
            "outcomes": outcomes,
            "woken_p50_ms": round(percentile(woken, 50) * 1000, 1) if woken else None,
            "woken_max_ms": round(woken[-1] * 1000, 1) if woken else None,
            "session_create_p50_ms": round(percentile(lat, 50) * 1000, 2),
            "session_create_p99_ms": round(percentile(lat, 99) * 1000, 2),
            "session_create_max_ms": round(lat[-1] * 1000, 2),
            "session_create_alone_p50_ms": round(percentile(alone, 50) * 1000, 2),
            "session_create_alone_p99_ms": round(percentile(alone, 99) * 1000, 2),
        }

    return asyncio.run(main())


def run(
    *, rate: float, duration_s: float, inflight: int, rounds: int, drop_events: int, readers: int
) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="smartcache-events-"))
    doc: dict[str, Any] = {}
    print("1. latency, transaction -> subscriber...", flush=True)
    with stack(tarantool_env=WAL_WRITE) as (master, sut):
        doc["latency"] = latency(sut, master.address, rate, duration_s, base)
        print(f"   {json.dumps(doc['latency'])}", flush=True)
        print("   the same with the events made through the service (EVENT_PUBLISH)...", flush=True)
        doc["latency_via_service"] = latency(sut, sut.endpoint, rate, duration_s, base)
        print(f"   {json.dumps(doc['latency_via_service'])}", flush=True)
        print("2. a subscriber killed and restarted mid-stream...", flush=True)
        doc["restart"] = restart(sut, rate, duration_s, base)
        print(f"   {json.dumps(doc['restart'])}", flush=True)
        print(f"5. {readers} EVENTS_READ waiting at once...", flush=True)
        doc["waiting_readers"] = waiting_readers(sut, readers, 3000)
        doc["waiting_readers"]["bulkhead_slots"] = REGISTRY.types["EVENTS_READ"].max_busy_percent
        print(f"   {json.dumps(doc['waiting_readers'])}", flush=True)
    print("3. session scenario, events on vs off...", flush=True)
    doc["throughput"] = throughput(duration_s, inflight, rounds)
    print(f"   {json.dumps(doc['throughput'])}", flush=True)
    print(f"4. dropping a day partition of {drop_events:,} events...", flush=True)
    doc["drop"] = drop(drop_events)
    print(f"   {json.dumps(doc['drop'])}", flush=True)
    lat, rs, tp, dr = doc["latency"], doc["restart"], doc["throughput"], doc["drop"]
    doc["summary"] = {
        "latency_p99_ms": lat["p99_ms"],
        "latency_rate": lat["rate_published"],
        "target_p99_met": lat["p99_ms"] <= TARGET_P99_MS and lat["exact"],
        "restart_exact": rs["exact"],
        "throughput_ratio_on_to_off": tp["ratio_on_to_off"],
        "target_throughput_met": tp["ratio_on_to_off"] >= TARGET_THROUGHPUT_RATIO,
        "drop_ms": dr["drop_ms"],
        "target_drop_met": dr["maintain_ms"] < TARGET_DROP_MS and dr["with_drop"]["write_during_ms"] < TARGET_DROP_MS,
    }
    s = doc["summary"]
    print()
    print(
        f"1. latency at {lat['rate_published']:,} events/s (made on Tarantool): p50 {lat['p50_ms']} ms, "
        f"p99 {lat['p99_ms']} ms, "
        f"max {lat['max_ms']} ms; {lat['delivered']:,} of {lat['published']:,} delivered, exactly: {lat['exact']}"
        f" (target p99 <= {TARGET_P99_MS} ms: {'met' if s['target_p99_met'] else 'NOT met'})"
    )
    lv = doc["latency_via_service"]
    print(
        f"   events made through the service (EVENT_PUBLISH, the service's CPU too): {lv['rate_published']:,}/s, "
        f"p50 {lv['p50_ms']} ms, p99 {lv['p99_ms']} ms, errors {lv['publish_errors']}"
    )
    print(
        f"2. subscriber killed after {rs['killed_after']:,} events, restarted from {rs['restarted_from']}: "
        f"{rs['delivered']:,} of {rs['published']:,} delivered, {rs['duplicates']} duplicates, {rs['missing']} "
        f"missing, in order: {rs['in_order']} ({'met' if rs['exact'] else 'NOT met'})"
    )
    print(
        f"3. session scenario W={tp['inflight']}: events on {tp['on_rps']} vs off {tp['off_rps']} requests/s, "
        f"ratio {tp['ratio_on_to_off']} (target >= {TARGET_THROUGHPUT_RATIO}: "
        f"{'met' if s['target_throughput_met'] else 'NOT met'}); without the subscriber on these cores "
        f"{tp['on_no_subscriber_rps']}, ratio {tp['ratio_on_no_subscriber_to_off']}"
    )
    print(
        f"4. drop of a day of {dr['events']:,} events: {dr['drop_ms']:.2f} ms (maintenance round "
        f"{dr['maintain_ms']:.2f} ms); slowest write overlapping it {dr['with_drop']['write_during_ms']:.2f} ms; "
        f"longest loop stall in 2.5 s {dr['with_drop']['loop_stall_max_ms']:.1f} ms with the drop, "
        f"{dr['without_drop']['loop_stall_max_ms']:.1f} ms without (target < {TARGET_DROP_MS:.0f} ms: "
        f"{'met' if s['target_drop_met'] else 'NOT met'})"
    )
    wr = doc["waiting_readers"]
    print(
        f"5. {wr['readers']} waiting EVENTS_READ: {wr['outcomes']}; woken p50 {wr['woken_p50_ms']} ms, last "
        f"{wr['woken_max_ms']} ms after the event; SESSION_CREATE meanwhile p50 {wr['session_create_p50_ms']} ms, "
        f"p99 {wr['session_create_p99_ms']} ms (alone just before: p50 {wr['session_create_alone_p50_ms']} ms, "
        f"p99 {wr['session_create_alone_p99_ms']} ms)"
    )
    with contextlib.suppress(OSError):
        for f in base.iterdir():
            f.unlink()
        base.rmdir()
    return doc
