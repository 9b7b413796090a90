"""The row two-shards-kill-leader: `SMARTCACHE_SHARDS=2 make run` (two HA trios sharded by client on three etcd
members, one service), not the fault suite's namespaced cluster.

A writer per shard creates sessions of clients whose bucket is on that shard (the bucket map read from
`smartcache-cli cluster status`), a sampler asks each shard's instances their role every 50 ms, and `kill -9`
takes s1's leader. Per shard: nothing acknowledged lost (each session read back through the service), never
two writable instances of one shard; s2's writes must not fail at all while s1 fails over (their longest gap is
reported), s1's resume by themselves. Its result has the fields of every other row (tests/faults/report.py),
and per shard under ``shards``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import tarantool

from smartcache.client import Client, RequestError
from smartcache.devstack.etcd import EtcdCluster
from smartcache.devstack.stack import LUA_INIT, Child, http_get_json
from smartcache.ops import cluster
from smartcache.wire import buckets
from tests.faults import checkers
from tests.faults import cluster as fc
from tests.faults.history import FAIL, OK, UNKNOWN, Attempt, Op
from tests.faults.make_run import TTL_S, _Sampler
from tests.integration.conftest_ha import ha_env
from tests.integration.test_devstack_restarts import MakeRun, _descendants, _listener

SHARDS = ("s1", "s2")
VICTIM = "s1"
#: how long the writers run before the fault, and after s1's writes resume
STEADY_S = 3.0


class _ShardWriter(threading.Thread):
    """Sessions of clients of one shard, created one at a time through the service; each op's outcome."""

    def __init__(self, endpoint: str, shard: str, clients: list[str], count: int) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.shard, self.clients, self.count = endpoint, shard, clients, count
        self.ops: list[Op] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with Client(self.endpoint, timeout_s=2, retries=3) as c:
            n = 0
            while not self.stop.is_set():
                client = self.clients[n % len(self.clients)]
                n += 1
                # a version 8 id chosen here, carrying the client's bucket: known before the answer (UNKNOWN ops)
                sid = uuid.UUID(
                    bytes=buckets.session_id_with_bucket(os.urandom(16), buckets.bucket_of(client, self.count))
                )
                op = Op(process=f"writer-{self.shard}", service="make-run", workload="set", key=str(sid),
                        value=str(sid), invoked=time.monotonic())  # fmt: skip
                try:
                    r = c.session_create(client, session_id=sid)
                    op.outcome = OK if r.ok else FAIL
                    answer = str(r.status)
                except RequestError as e:
                    maybe = e.transport_error in ("OUTCOME_UNKNOWN", "TIMEOUT", "INTERNAL")
                    op.outcome = UNKNOWN if maybe else FAIL
                    answer = e.transport_error
                op.attempts.append(Attempt(sent=op.invoked, answered=time.monotonic(), answer=answer, message=""))
                op.completed = time.monotonic()
                self.ops.append(op)
                if op.outcome != OK:
                    time.sleep(0.05)


class _Row:
    def __init__(self, base: Path) -> None:
        self.started = time.monotonic()
        self.checks: list[dict[str, Any]] = []
        # SMARTCACHE_PROTOCOL (a registry under test) is passed on: make run's children must load the same one
        registry = {k: v for k, v in os.environ.items() if k == "SMARTCACHE_PROTOCOL"}
        self.stack = MakeRun(base, extra_env={"SMARTCACHE_SHARDS": "2", **registry})
        self.writers: dict[str, _ShardWriter] = {}
        self.samplers: dict[str, _Sampler] = {}
        self.fault = self.resumed = self.end = time.monotonic()
        self.lost: dict[str, int] = dict.fromkeys(SHARDS, 0)

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.checks.append({"name": name, "ok": bool(ok), "detail": detail})

    def _until(self, what: Any, timeout_s: float, interval_s: float = 0.1) -> bool:
        deadline = time.monotonic() + timeout_s
        while not what() and time.monotonic() < deadline:
            time.sleep(interval_s)
        return bool(what())

    def load(self) -> str:
        self.stack.wait_ready()
        endpoint = f"tcp://127.0.0.1:{5555 + self.stack.offset}"
        status = self.stack.status()
        self.check("make run started two shards, healthy", set(status.get("shards") or ()) == set(SHARDS)
                   and bool(status.get("healthy")), str(status.get("buckets")))  # fmt: skip
        count = int(status["buckets"]["count"])
        owner = {b: s for first, last, s in status["buckets"]["ranges"] for b in range(first, last + 1)}
        for shard in SHARDS:
            clients = [c for i in range(2000) if owner[buckets.bucket_of(c := f"shard-row-{i}", count)] == shard][:16]
            addresses = [i["address"] for i in status["shards"][shard]["instances"]]
            self.writers[shard] = _ShardWriter(endpoint, shard, clients, count)
            self.samplers[shard] = _Sampler(addresses)
        for t in (*self.writers.values(), *self.samplers.values()):
            t.start()
        time.sleep(STEADY_S)
        return endpoint

    def kill_leader(self) -> None:
        stack = self.stack
        old = stack.status()["shards"][VICTIM]["leader"]
        pid = _listener(_descendants(stack.proc.pid), int(old.rsplit(":", 1)[1]))
        self.check(f"{VICTIM}'s leader's process is found by its port", pid is not None, old)
        self.fault = time.monotonic()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        fault, victim = self.fault, self.writers[VICTIM]
        resumed = self._until(lambda: any(op.outcome == OK and op.invoked > fault + 0.2 for op in victim.ops), 60)
        self.resumed = time.monotonic()
        self.check(f"{VICTIM}'s writes resume through the service by themselves", resumed)
        failed = [op for op in self.writers["s2"].ops if op.invoked >= fault and op.outcome != OK]
        self.check("s2's writes never fail while s1 fails over", not failed,
                   f"{len(failed)} failed: {[op.attempts[-1].answer for op in failed[:3]]}")  # fmt: skip

        def old_follows() -> bool:
            s = stack.status()["shards"][VICTIM]
            roles = {i["address"]: i.get("role") for i in s["instances"]}
            return s["leader"] != old and roles.get(old) == "follower"

        self.check(f"{VICTIM}'s old leader is restarted and follows", self._until(old_follows, 90, 0.5), old)
        self.check("make run kept everything else running", stack.proc.poll() is None)

    def verify_shards(self, endpoint: str) -> None:
        """Per shard: every acknowledged session read back through the service; never two writable."""
        time.sleep(STEADY_S)
        self.end = time.monotonic()
        for t in self.writers.values():
            t.stop.set()
            t.join(10)
        with Client(endpoint, timeout_s=5, retries=3) as c:
            for shard, w in self.writers.items():
                acked = [op.key for op in w.ops if op.outcome == OK]
                self.lost[shard] = sum(1 for sid in acked if not c.session_get(uuid.UUID(sid)).ok)
                self.check(f"{shard}: no acknowledged write lost", self.lost[shard] == 0,
                           f"{self.lost[shard]} of {len(acked)} missing")  # fmt: skip
        for shard, s in self.samplers.items():
            s.stop.set()
            self.check(f"{shard}: never two instances writable", s.max_writable <= 1,
                       f"max {s.max_writable} over {s.rounds} rounds")  # fmt: skip

    def verify(self, endpoint: str) -> None:
        self.verify_shards(endpoint)
        code = self.stack.ctrl_c()
        self.check("Ctrl-C stops it all (exit 0)", code == 0, str(code))

    def close(self) -> None:
        for t in (*self.writers.values(), *self.samplers.values()):
            t.stop.set()
        self.stack.close()

    def result(self) -> dict[str, Any]:
        ops = [op for w in self.writers.values() for op in w.ops]
        per: dict[str, Any] = {}
        for shard, w in self.writers.items():
            gap, _ = checkers.longest_write_gap(w.ops, self.fault, self.end) if w.ops else (None, None)
            per[shard] = {
                "ops": checkers.counts(w.ops),
                "acknowledged_lost": self.lost[shard],
                "max_writable": self.samplers[shard].max_writable if shard in self.samplers else None,
                "write_gap_s": None if gap is None else round(gap, 2),
            }
        victim = self.writers.get(VICTIM)
        recovered = checkers.recovery_s(victim.ops, self.fault, self.fault, self.end) if victim and victim.ops else None
        gap_s = per.get(VICTIM, {}).get("write_gap_s")
        notes = [
            "SMARTCACHE_SHARDS=2 make run: one service, two shards of three Tarantool instances, three etcd members, "
            f"TTL {TTL_S:g} s",
            "per shard: " + "; ".join(
                f"{s} ops {p['ops']}, acknowledged lost {p['acknowledged_lost']}, max writable {p['max_writable']}, "
                f"longest write gap {p['write_gap_s']} s" for s, p in per.items()
            ),
        ]  # fmt: skip
        return {
            "scenario": "two-shards-kill-leader",
            "summary": "kill -9 one shard's leader of `SMARTCACHE_SHARDS=2 make run`; the other shard writes on",
            "passed": all(c["ok"] for c in self.checks),
            "ops": checkers.counts(ops),
            "acknowledged_lost": sum(self.lost.values()),
            "async_lost": 0,
            "max_writable": max((p["max_writable"] or 0) for p in per.values()) if per else None,
            "max_writable_per": "shard",
            "write_gap_s": gap_s,
            "recovery_s": None if recovered is None else round(recovered, 2),
            "recovery_from": "fault",
            "shards": per,
            "checks": self.checks,
            "notes": notes,
            "duration_s": round(time.monotonic() - self.started, 1),
            "ttl_s": TTL_S,
        }


def run_row(base: Path, _net: Any = None) -> dict[str, Any]:
    """The two-shards-kill-leader row, from a fresh sharded make run to its verdict; never raises."""
    row = _Row(base)
    try:
        endpoint = row.load()
        row.kill_leader()
        row.verify(endpoint)
    except Exception as e:  # a crash is a failed check, as execute() makes it
        row.check("the row's timeline runs to its end", False, f"{type(e).__name__}: {e}")
    finally:
        row.close()
    return row.result()


# -- two-shards-partition-etcd: the namespaced hosts, one shard's leader cut from etcd -------------------------

#: the hosts of the two shards' instances (added to the suite's network the first time; namespaces outlive a row)
SHARD_HOSTS = {"s1": ("a1", "a2", "a3"), "s2": ("b1", "b2", "b3")}
#: the host the row's one service runs on (the suite's service host s1: no other row runs while this one does)
SERVICE_HOST = "s1"
#: how long s1's leader stays cut from every etcd member
CUT_TTLS = 3
#: a rebuilt instance exits with this to be started again (as the suite's supervisor does)
REJOIN_EXIT = 75


class _NsRow(_Row):
    """Two shards of three instances, three etcd members and one service, each on a host of its own (the suite's
    network namespaces: tests/netns.py); s1's leader cut from etcd for CUT_TTLS x TTL."""

    def __init__(self, base: Path, net: Any) -> None:
        self.started = time.monotonic()
        self.checks = []
        self.writers = {}
        self.samplers = {}
        self.fault = self.resumed = self.end = time.monotonic()
        self.lost = dict.fromkeys(SHARDS, 0)
        self.base, self.net, self.fc = base, net, fc
        self.children: list[Any] = []
        for hosts in SHARD_HOSTS.values():
            for h in hosts:
                if h not in net.hosts:
                    net.add_host(h)
        if fc.ETCD_GROUP not in net.groups:  # made by the suite's cluster; this row may run first, or alone
            net.add_group(fc.ETCD_GROUP, list(fc.ETCD_HOSTS))
        self.etcd = EtcdCluster.create(
            base,
            client_ports=[fc.ETCD_PORT] * 3,
            peer_ports=[fc.ETCD_PEER_PORT] * 3,
            hosts=[net.hosts[h].ip for h in fc.ETCD_HOSTS],
            lifetime_s=fc.ETCD_LIFETIME_S,
            wrap=lambda i, argv: net.argv_in(fc.ETCD_HOSTS[i], argv),
        )
        self.name = f"faults{uuid.uuid4().hex[:8]}"
        self.nodes: dict[str, dict[str, Any]] = {s: {} for s in SHARDS}
        for shard, hosts in SHARD_HOSTS.items():
            env = ha_env(self.etcd, f"{self.name}.{shard}", SC_LEADER_TTL_S=str(fc.TTL_S))
            for h in hosts:
                ip = net.hosts[h].ip
                node_env = {
                    **env,
                    "SC_INSTANCE_NAME": h,
                    "SC_LISTEN": f"{ip}:{fc.IPROTO_PORT}",
                    "SC_HTTP_LISTEN": f"{ip}:{fc.HTTP_PORT}",
                    "SC_DATA_DIR": str(base / h),
                    "SC_HTTP_TOKEN": fc.HTTP_TOKEN,
                }
                argv = net.argv_in(h, [shutil.which("tarantool") or "tarantool", str(LUA_INIT)])
                self.nodes[shard][h] = Child(name=h, argv=argv, env=node_env, log_path=base / f"{h}.log")
        ip = net.hosts[SERVICE_HOST].ip
        self.endpoint = f"tcp://{ip}:{fc.SERVICE_PORT}"
        self.ready_url = f"http://{ip}:{fc.METRICS_PORT}/health/ready"
        service_env = {
            "SMARTCACHE_LISTEN": self.endpoint,
            "SMARTCACHE_TARANTOOL": "",
            "SMARTCACHE_ETCD": self.etcd.url,
            "SMARTCACHE_CLUSTER": self.name,
            "SMARTCACHE_METRICS_ADDR": ip,
            "SMARTCACHE_METRICS_PORT": str(fc.METRICS_PORT),
            "SMARTCACHE_INSTANCE_ID": "sharded",
            "SMARTCACHE_WORKERS": "50",
        }
        self.service = Child(
            name="service",
            argv=net.argv_in(SERVICE_HOST, [sys.executable, "-m", "smartcache.server"]),
            env=service_env,
            log_path=base / "service.log",
        )

    def address(self, host: str) -> str:
        return f"{self.net.hosts[host].ip}:{self.fc.IPROTO_PORT}"

    def role(self, host: str) -> dict[str, Any] | None:
        ip, port = self.net.hosts[host].ip, self.fc.IPROTO_PORT
        try:
            conn = tarantool.Connection(ip, port, user="operator", password="operator", connection_timeout=0.5,
                                        socket_timeout=0.5)  # fmt: skip
        except (tarantool.error.Error, OSError):
            return None
        try:
            return conn.call("sc.role", [None]).data[0]  # type: ignore[no-any-return]
        except (tarantool.error.Error, OSError):
            return None
        finally:
            conn.close()

    def leader(self, shard: str, exclude: tuple[str, ...] = ()) -> str | None:
        writable = [h for h in SHARD_HOSTS[shard] if h not in exclude and (self.role(h) or {}).get("writable")]
        return writable[0] if len(writable) == 1 else None

    def _supervise(self) -> None:
        """What a supervisor does: an instance that exited to rebuild itself (75) is started again."""
        for nodes in self.nodes.values():
            for child in nodes.values():
                if child.proc is not None and child.proc.poll() == REJOIN_EXIT:
                    child.start()

    def load(self) -> str:
        self.etcd.start()
        self.children.extend(self.etcd.members)
        self.etcd.wait_ready(timeout_s=60)
        for nodes in self.nodes.values():
            for child in nodes.values():
                child.start()
                self.children.append(child)
        for shard in SHARDS:
            self._until(lambda s=shard: self.leader(s) is not None, 60, 0.2)
        access = cluster.Access(addresses=(), user="operator", password="operator",
                                etcd=[m.url for m in self.etcd.members], cluster=self.name)  # fmt: skip
        made: dict[str, Any] = {}

        def init() -> bool:
            made.update(cluster.shards_init(access, list(SHARDS), 1024))
            return made.get("status") == "OK"

        self.check("cluster init --shards s1,s2 (each shard takes its buckets)", self._until(init, 30, 0.5),
                   str(made.get("status")))  # fmt: skip
        self.service.start()
        self.children.append(self.service)
        self.check("the service is ready", self._until(self._ready, 30, 0.2))
        owner = {b: s for first, last, s in made["map"]["ranges"] for b in range(first, last + 1)}
        for shard in SHARDS:
            clients = [c for i in range(2000) if owner[buckets.bucket_of(c := f"shard-row-{i}", 1024)] == shard][:16]
            self.writers[shard] = _ShardWriter(self.endpoint, shard, clients, 1024)
            self.samplers[shard] = _Sampler([self.address(h) for h in SHARD_HOSTS[shard]])
        for t in (*self.writers.values(), *self.samplers.values()):
            t.start()
        time.sleep(STEADY_S)
        return self.endpoint

    def _ready(self) -> bool:
        try:
            status, _ = http_get_json(self.ready_url, timeout_s=1.0)
        except (OSError, ValueError):
            return False
        return status == 200

    def partition(self) -> None:
        old = self.leader(VICTIM)
        self.check(f"{VICTIM} has one leader", old is not None)
        assert old is not None
        self.fault = time.monotonic()
        self.net.cut(old, "etcd")
        fault = self.fault
        new = self._until(lambda: self.leader(VICTIM, exclude=(old,)) is not None, 10 * self.fc.TTL_S, 0.1)
        self.check(f"another {VICTIM} instance leads while {old} is cut from etcd", new)
        victim = self.writers[VICTIM]
        resumed = self._until(lambda: any(op.outcome == OK and op.invoked > fault + 0.2 for op in victim.ops), 60)
        self.check(f"{VICTIM}'s writes resume through the service by themselves", resumed)
        time.sleep(max(0.0, fault + CUT_TTLS * self.fc.TTL_S - time.monotonic()))
        self.net.heal()
        healed = time.monotonic()
        failed = [op for op in self.writers["s2"].ops if fault <= op.invoked <= healed and op.outcome != OK]
        self.check("s2's writes never fail while s1's leader is cut from etcd", not failed,
                   f"{len(failed)} failed: {[op.attempts[-1].answer for op in failed[:3]]}")  # fmt: skip

        def old_follows() -> bool:
            self._supervise()
            return (self.role(old) or {}).get("role") == "follower"

        self.check(f"{old} follows again after the heal (no person)", self._until(old_follows, 60, 0.2))

    def verify(self, endpoint: str) -> None:
        self.verify_shards(endpoint)  # no make run to stop with Ctrl-C

    def close(self) -> None:
        for t in (*self.writers.values(), *self.samplers.values()):
            t.stop.set()
        self.net.heal()
        for child in reversed(self.children):
            with contextlib.suppress(Exception):
                child.stop(timeout_s=10)
        with contextlib.suppress(Exception):
            self.etcd.cleanup()

    def result(self) -> dict[str, Any]:
        out = super().result()
        out["scenario"] = "two-shards-partition-etcd"
        out["summary"] = "cut one shard's leader from every etcd member for 3 x TTL; the other shard writes on"
        out["notes"][0] = (
            "namespaced hosts: one service, two shards of three Tarantool instances, three etcd members, "
            f"TTL {self.fc.TTL_S} s"
        )
        out["ttl_s"] = self.fc.TTL_S
        return out


def partition_row(base: Path, net: Any) -> dict[str, Any]:
    """The two-shards-partition-etcd row, from a fresh two-shard stack on the suite's hosts; never raises."""
    row = _NsRow(base, net)
    try:
        endpoint = row.load()
        row.partition()
        row.verify(endpoint)
    except Exception as e:  # a crash is a failed check, as execute() makes it
        row.check("the row's timeline runs to its end", False, f"{type(e).__name__}: {e}")
    finally:
        row.close()
    return row.result()
