"""The rows move-*: a fault in the middle of moving buckets between two shards (docs/design/resharding.md).

Each row starts the two-shard stack of two-shards-partition-etcd (every process on a network namespace of its
own: two shards of three Tarantool instances, three etcd members, one service, writers of both shards' clients),
then `smartcache-cli cluster drain s1` in the service's namespace: it moves s1's 512 buckets to s2, two at a
time, while the writers write. Three seconds into the drain comes the row's fault (a kill or a stop waits, up to
10 s, until a bucket is in flight on its shard's leader, so that it lands mid-copy: the buckets are small and a
move takes tens of milliseconds):

* move-kill-source / move-kill-destination: kill -9 s1's (s2's) leader, started again a TTL later;
* move-stop-source / move-stop-destination: SIGSTOP s1's (s2's) leader for 2 x TTL, then SIGCONT;
* move-cut-destination: the service's host (the driver's and the service's) cut from s2's hosts for 2 x TTL;
  the shards never talk to each other (the driver talks to both), so this is the partition a move meets;
* move-etcd-majority-down: two of the three etcd members stopped for 2 x TTL (both shards fence), started again;
* move-kill-driver: kill -9 the drain itself.

Then nobody runs anything: the service's settler finishes or gives up what was left between states. The row
waits until no bucket of either shard is between states and checks, from storage: every bucket active on
exactly one shard, the one the map names, with no row left on the other; every acknowledged session read back
through the service; never two writable instances of one shard; and, sampled every 100 ms throughout from every
writable instance, never one bucket active on two shards at one generation. The same sampler times each bucket's
pause (from its send_start to active somewhere): the result's `bucket_pause` has its p50 and max, the moves the
fault interrupted, and the drain's own pause per bucket (docs/sharding.md quotes them).
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tarantool

from smartcache.devstack.stack import Child
from smartcache.ops import cluster, moves
from tests.faults.sharded import SERVICE_HOST, SHARD_HOSTS, SHARDS, _NsRow

#: how long the drain runs before the fault
BEFORE_FAULT_S = 3.0
#: the longest a drain may take (it moves 512 buckets; a fault costs it a stalled move or two)
DRAIN_TIMEOUT_S = 240.0
#: the longest the settler may take to leave no bucket between states, once the drain has ended
SETTLE_TIMEOUT_S = 90.0


#: how long the verdict waits for a shard's leader to answer (a rebuilt instance joining holds its writes)
LEADER_TIMEOUT_S = 30.0


def _first(probe: Callable[[], Any], timeout_s: float, interval_s: float) -> Any:
    """The first truthy answer of probe within timeout_s (None if none): asked once more only while it is not."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval_s)


def ok(answer: dict[str, Any] | None) -> dict[str, Any] | None:
    """An answer with status OK, else None."""
    return answer if answer is not None and answer.get("status") == "OK" else None


#: the states of a bucket between its send_start and its activation somewhere (its calls paused meanwhile)
_PAUSED = ("sending", "sent", "receiving")


@dataclass(frozen=True)
class _Pause:
    """One bucket's pause as storage showed it: from its send_start to the round that saw it active again."""

    seconds: float
    bucket: int
    start: float  # monotonic
    served_by: str  # the shard it was active on at the end: the destination, or the source (given up)


class _Buckets(threading.Thread):
    """Every 100 ms, every writable instance of both shards: the buckets it serves, with their generations. A
    bucket served at one generation by two shards in one round would be two live copies.

    It also times each bucket's pause as storage shows it, from its send_start (the `since` of the source's
    sending row, else the first round that saw it moving) to the first round that sees it active somewhere (the
    destination, or the source again). Rounds where a shard has no writable instance count: the pause of a move
    interrupted by a failover. A move shorter than a round may be missed: the drain's own p50 is the finer one."""

    def __init__(self, row: _MoveRow) -> None:
        super().__init__(daemon=True)
        self.row, self.stop, self.rounds, self.doubled = row, threading.Event(), 0, []  # type: ignore[var-annotated]
        self.open: dict[int, float] = {}  # bucket -> when its pause began (monotonic)
        self.pauses: list[_Pause] = []

    def run(self) -> None:
        while not self.stop.is_set():
            now = time.monotonic()
            seen: dict[tuple[int, int], set[str]] = {}
            moving: dict[int, float] = {}  # bucket -> when its pause began, as far as this round tells
            for shard, hosts in SHARD_HOSTS.items():
                for h in hosts:
                    held = self.row.call(h, "buckets_held", timeout_s=0.3)
                    if held is None or held.get("status") != "OK" or not held.get("writable"):
                        continue
                    for b, gen in held["active"]:
                        seen.setdefault((b, gen), set()).add(shard)
                    for m in held["moving"]:
                        if m.get("state") not in _PAUSED:
                            continue
                        began = now
                        if m["state"] == "sending" and m.get("since"):  # the source's send_start, on its clock
                            began = min(now, now - (held["now_ms"] - m["since"]) / 1000)
                        moving[m["bucket"]] = min(began, moving.get(m["bucket"], now))
            self.doubled += [(b, gen, sorted(s)) for (b, gen), s in seen.items() if len(s) > 1]
            active = {b: sorted(s)[0] for (b, _), s in seen.items()}
            for b, began in moving.items():
                if b not in active:
                    self.open[b] = min(began, self.open.get(b, began))
            for b in [b for b in self.open if b in active]:
                start = self.open.pop(b)
                self.pauses.append(_Pause(now - start, b, start, active[b]))
            self.rounds += 1
            self.stop.wait(0.1)

    def summary(self, fault: float) -> dict[str, Any]:
        """The pauses seen: how many, p50 and max (s), the moves the fault interrupted (paused across it), the
        five longest (with their start after the fault, s), and the buckets still paused."""
        s = sorted(p.seconds for p in self.pauses)

        def one(p: _Pause) -> dict[str, Any]:
            return {"bucket": p.bucket, "s": round(p.seconds, 2), "from_fault_s": round(p.start - fault, 2),
                    "served_by": p.served_by}  # fmt: skip

        return {
            "seen": len(s),
            "p50_s": round(s[len(s) // 2], 2) if s else None,
            "max_s": round(s[-1], 2) if s else None,
            "interrupted": [one(p) for p in self.pauses if p.start <= fault <= p.start + p.seconds],
            "longest": [one(p) for p in sorted(self.pauses, key=lambda p: -p.seconds)[:5]],
            "unresolved": sorted(self.open),
        }


class _MoveRow(_NsRow):
    def __init__(self, base: Path, net: Any, scenario: str, fault: Callable[[_MoveRow], None], summary: str):
        super().__init__(base, net)
        self.scenario, self.do_fault, self.summary = scenario, fault, summary
        self.buckets = _Buckets(self)
        cli_env = {
            "SMARTCACHE_ETCD": self.etcd.url,
            "SMARTCACHE_CLUSTER": self.name,
            "SMARTCACHE_TARANTOOL": "",
        }
        argv = [sys.executable, "-m", "smartcache.cli", "cluster", "drain", "s1", "--parallel", "2",
                "--reason", f"fault suite: {self.name}"]  # fmt: skip
        self.driver = Child(name="drain", argv=net.argv_in(SERVICE_HOST, argv), env=cli_env,
                            log_path=base / "drain.log")  # fmt: skip
        self.drain_exit: int | None = None
        self.in_flight = ""  # what the fault interrupted (the kill and stop rows)

    def call(self, host: str, procedure: str, *args: Any, timeout_s: float = 2.0) -> dict[str, Any] | None:
        ip, port = self.net.hosts[host].ip, self.fc.IPROTO_PORT
        try:
            conn = tarantool.Connection(ip, port, user="operator", password="operator", connection_timeout=timeout_s,
                                        socket_timeout=timeout_s)  # fmt: skip
        except (tarantool.error.Error, OSError):
            return None
        try:
            return conn.call(f"sc.{procedure}", [None, *args]).data[0]  # type: ignore[no-any-return]
        except (tarantool.error.Error, OSError):
            return None
        finally:
            conn.close()

    def node(self, host: str) -> Child:
        child: Child = next(nodes[host] for nodes in self.nodes.values() if host in nodes)
        return child

    def move(self) -> None:
        self.buckets.start()
        self.driver.start()
        self.children.append(self.driver)
        time.sleep(BEFORE_FAULT_S)
        self.check("the drain is under way when the fault comes", self.driver.alive())
        self.fault = time.monotonic()
        self.do_fault(self)
        self.resumed = time.monotonic()
        drained = self._until(lambda: not self.driver.alive(), DRAIN_TIMEOUT_S, 0.5)
        self.drain_exit = self.driver.proc.poll() if self.driver.proc is not None else None
        self.check("the drain ended (or was killed)", drained, f"exit {self.drain_exit}")
        settled = _first(self._settled, SETTLE_TIMEOUT_S, 1.0)
        self.check("no bucket is left between states, with no command run (the service's settler)",
                   settled is not None, str(settled or self._moving()))  # fmt: skip
        self._supervise()

    def _leader_held(self, shard: str, timeout_s: float = 0.0) -> dict[str, Any] | None:
        """sc.buckets_held of the shard's leader, answered OK; for up to timeout_s while there is none (a
        failover, or a leader holding its writes while an instance rebuilt from it joins: NOT_LEADER)."""

        def ask() -> dict[str, Any] | None:
            self._supervise()
            leader = self.leader(shard)
            held = None if leader is None else self.call(leader, "buckets_held")
            return held if held is not None and held.get("status") == "OK" else None

        return ask() if timeout_s <= 0 else _first(ask, timeout_s, 0.5)

    def _moving(self) -> dict[str, Any]:
        return {s: (h or {}).get("moving") for s in SHARDS if (h := self._leader_held(s)) is not None}

    def _settled(self) -> dict[str, Any] | None:
        """Both shards' leaders answer and neither has a bucket between states: what they hold (else None)."""
        held = {s: self._leader_held(s) for s in SHARDS}
        if all(h is not None and not h["moving"] for h in held.values()):
            return {s: len(h["active"]) for s, h in held.items() if h is not None}
        return None

    def verify(self, endpoint: str) -> None:
        self.buckets.stop.set()
        self.buckets.join(10)
        self.check("no bucket active on two shards at one generation, sampled throughout", not self.buckets.doubled,
                   f"{len(self.buckets.doubled)} doubled over {self.buckets.rounds} rounds: "
                   f"{self.buckets.doubled[:3]}")  # fmt: skip
        self._placement()
        self.verify_shards(endpoint)

    def _placement(self) -> None:
        access = cluster.Access(addresses=(), user="operator", password="operator",
                                etcd=[m.url for m in self.etcd.members], cluster=self.name)  # fmt: skip
        doc, _ = moves.read_map(access)
        owner = moves.owners(doc)
        held = {s: self._leader_held(s, timeout_s=LEADER_TIMEOUT_S) or {} for s in SHARDS}
        self.check("each shard's leader answers which buckets it holds", all(held.values()),
                   str({s: bool(h) for s, h in held.items()}))  # fmt: skip
        active = {s: {b for b, _ in h.get("active") or []} for s, h in held.items()}
        wrong = [b for b in range(len(owner)) if [s for s in SHARDS if b in active[s]] != [owner[b]]]
        self.check("every bucket active on exactly one shard, the one the map names", not wrong,
                   f"{len(wrong)} not: {wrong[:5]}; {len(active['s1'])} on s1, {len(active['s2'])} on s2")  # fmt: skip
        leftovers = []
        for shard in SHARDS:
            leader = _first(lambda s=shard: self.leader(s), LEADER_TIMEOUT_S, 0.5)
            if leader is None:
                continue
            for b in range(len(owner)):
                if owner[b] != shard:
                    st = _first(lambda lb=(leader, b): ok(self.call(lb[0], "bucket_state", lb[1])), 10, 0.5) or {}
                    if st.get("rows"):
                        leftovers.append((b, shard, st["rows"]))
        self.check("no row of a bucket left on the shard that does not own it", not leftovers, str(leftovers[:5]))
        self.moved = len(active["s2"]) - 512

    def close(self) -> None:
        self.buckets.stop.set()
        super().close()

    def result(self) -> dict[str, Any]:
        out = super().result()
        out["scenario"] = self.scenario
        out["summary"] = self.summary
        out["notes"][0] = (
            "namespaced hosts: one service, two shards of three Tarantool instances, three etcd members, "
            f"TTL {self.fc.TTL_S} s; `cluster drain s1 --parallel 2` under load, exit {self.drain_exit}, "
            f"{getattr(self, 'moved', '?')} of 512 buckets on s2 at the end"
        )
        out["recovery_from"] = "fault"
        out["bucket_pause"] = {"storage": self.buckets.summary(self.fault), "drain": self._drain_result()}
        storage, drain = out["bucket_pause"]["storage"], out["bucket_pause"]["drain"]
        out["notes"].append(
            f"bucket pause seen in storage: p50 {storage['p50_s']} s, max {storage['max_s']} s over {storage['seen']}, "
            f"the moves the fault interrupted {storage['interrupted']}; the drain's own: {drain.get('paused_ms')} ms, "
            f"{drain.get('moved')} moved, {drain.get('given_up')} given up"
        )
        if self.in_flight:
            out["notes"].append(self.in_flight)
        return out

    def _drain_result(self) -> dict[str, Any]:
        """The drain's last word (its JSON: moved, given up, the pause per bucket p50/p99/max), {} if none."""
        try:
            lines = (self.base / "drain.log").read_text(errors="replace").splitlines()
        except OSError:
            return {}
        for text in reversed(lines):
            with contextlib.suppress(ValueError):
                doc = json.loads(text.strip())
                if isinstance(doc, dict) and "status" in doc:
                    return {k: doc.get(k) for k in ("status", "moved", "given_up", "seconds", "paused_ms", "errors")}
        return {}


#: the state of a move in flight on each shard's leader (s1 the source, s2 the destination)
_IN_FLIGHT = {"s1": "sending", "s2": "receiving"}
#: how long a fault waits for a move in flight on its shard's leader
IN_FLIGHT_WAIT_S = 10.0


def _in_flight(row: _MoveRow, shard: str, host: str) -> None:
    """Wait (IN_FLIGHT_WAIT_S at most) until the shard's leader has a bucket in flight (its copy under way), so
    that the fault interrupts a move mid-copy, not the step between two moves; noted in the row's result."""
    ip, port = row.net.hosts[host].ip, row.fc.IPROTO_PORT
    deadline, found = time.monotonic() + IN_FLIGHT_WAIT_S, None
    try:
        conn = tarantool.Connection(ip, port, user="operator", password="operator", connection_timeout=1,
                                    socket_timeout=1)  # fmt: skip
    except (tarantool.error.Error, OSError):
        return
    try:
        while found is None and time.monotonic() < deadline:
            held = conn.call("sc.buckets_held", [None]).data[0]
            found = next((m["bucket"] for m in held.get("moving") or [] if m.get("state") == _IN_FLIGHT[shard]), None)
    except (tarantool.error.Error, OSError):
        pass
    finally:
        conn.close()
    state = _IN_FLIGHT[shard]
    row.in_flight = (f"the fault came with bucket {found} {state} on {shard}'s leader" if found is not None
                     else f"no bucket seen {state} on {shard}'s leader in {IN_FLIGHT_WAIT_S:g} s")  # fmt: skip


def _kill(shard: str) -> Callable[[_MoveRow], None]:
    def fault(row: _MoveRow) -> None:
        leader = row.leader(shard)
        row.check(f"{shard} has a leader to kill", leader is not None)
        if leader is None:
            return
        _in_flight(row, shard, leader)
        row.fault = time.monotonic()
        row.node(leader).send_signal(signal.SIGKILL)
        time.sleep(row.fc.TTL_S)
        row.node(leader).start()

    return fault


def _freeze(shard: str) -> Callable[[_MoveRow], None]:
    def fault(row: _MoveRow) -> None:
        leader = row.leader(shard)
        row.check(f"{shard} has a leader to stop", leader is not None)
        if leader is None:
            return
        _in_flight(row, shard, leader)
        row.fault = time.monotonic()
        row.node(leader).send_signal(signal.SIGSTOP)
        try:
            time.sleep(2 * row.fc.TTL_S)
        finally:
            row.node(leader).send_signal(signal.SIGCONT)

    return fault


def _cut_destination(row: _MoveRow) -> None:
    if "shard-s2" not in row.net.groups:
        row.net.add_group("shard-s2", list(SHARD_HOSTS["s2"]))
    row.net.cut(SERVICE_HOST, "shard-s2")
    try:
        time.sleep(2 * row.fc.TTL_S)
    finally:
        row.net.heal()


def _etcd_majority(row: _MoveRow) -> None:
    down = row.etcd.members[:2]
    for m in down:
        m.stop(timeout_s=10)
    try:
        time.sleep(2 * row.fc.TTL_S)
    finally:
        for m in down:
            m.start()


def _kill_driver(row: _MoveRow) -> None:
    row.driver.send_signal(signal.SIGKILL)


ROWS: dict[str, tuple[Callable[[_MoveRow], None], str]] = {
    "move-kill-source": (_kill("s1"), "kill -9 the source shard's leader while buckets move"),
    "move-kill-destination": (_kill("s2"), "kill -9 the destination shard's leader while buckets move"),
    "move-stop-source": (_freeze("s1"), "SIGSTOP the source shard's leader for 2 x TTL while buckets move"),
    "move-stop-destination": (_freeze("s2"), "SIGSTOP the destination shard's leader for 2 x TTL while buckets move"),
    "move-cut-destination": (_cut_destination, "cut the driver and service from the destination shard for 2 x TTL"),
    "move-etcd-majority-down": (_etcd_majority, "two of three etcd members down for 2 x TTL while buckets move"),
    "move-kill-driver": (_kill_driver, "kill -9 the drain that moves the buckets; nobody runs it again"),
}


def row(name: str) -> Callable[[Path, Any], dict[str, Any]]:
    """The standalone row `name`: a fresh two-shard stack, a drain, the fault, the verdict; never raises."""
    fault, summary = ROWS[name]

    def run(base: Path, net: Any) -> dict[str, Any]:
        r = _MoveRow(base, net, name, fault, summary)
        try:
            endpoint = r.load()
            r.move()
            r.verify(endpoint)
        except Exception as e:  # a crash is a failed check, as execute() makes it
            r.check("the row's timeline runs to its end", False, f"{type(e).__name__}: {e}")
        finally:
            r.close()
        return r.result()

    return run
