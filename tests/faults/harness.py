"""One scenario's run: the cluster, the load, the sampler, the fault's timeline, the final state, the verdict.

``execute`` starts a fresh cluster (namespaces are shared by the whole run),
loads it through both services, runs the scenario's timeline (which calls
``fault`` and ``healed`` around what it breaks and mends), waits until writes
flow again, stops the load, reads the final state on the leader (and on every
other instance, once caught up) and checks the history against it. Whatever
happens, every process is stopped by its PID and every mount undone.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smartcache.wire import sessionkeys
from tests.faults import checkers, disks, linear, load
from tests.faults.checkers import SYNC_WORKLOADS, Verdict
from tests.faults.cluster import NODES, SESSION_KEY_HEX, TTL_S, Cluster, until
from tests.faults.disks import Ext4Loop, Tmpfs
from tests.faults.history import FAIL, OK, History, Op
from tests.faults.sampler import Sampler
from tests.faults.workloads import (
    CacheWorker,
    CounterWorker,
    RegisterWorker,
    SetWorker,
    Worker,
    create_hot_sessions,
)
from tests.netns import Network

#: workers per workload; each worker uses one service, alternating s1, s2
LOAD = {"set": 2, "register": 4, "counter": 2, "cache": 1}
HOT_SESSIONS = 2
WARMUP_S = 5.0
AFTER_S = 5.0  # load after writes flow again, before the final read
RESUME_TIMEOUT_S = 45.0
RESUME_WRITES = 20  # acknowledged writes after the last repair that count as "writes flow again"
TMPFS_MB, WAL_MIN_FREE_MB = 32, 8
EXT4_MB = 64
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
OPERATOR = ("operator", "operator")
REJOIN_EXIT = 75
#: how long a DIVERGED instance may take to decide it can rebuild itself (its proof reads the leader key)
AUTO_REJOIN_S = 15.0
SUPERVISOR_STARTS = 3
REBUILD_START_S = 30.0


@dataclass
class Setup:
    """What a scenario needs besides the default cluster."""

    disks: str | None = None  # "tmpfs" or "ext4": each instance's data dir on a small filesystem of its own
    node_env: dict[str, str] = field(default_factory=dict)
    faketime: bool = False  # every instance under libfaketime, its offset in a file the scenario writes
    #: the services find the instances in etcd (SMARTCACHE_ETCD + SMARTCACHE_CLUSTER), not in SMARTCACHE_TARANTOOL:
    #: a row that changes the members shows the services following the change
    discovery: bool = False
    #: what both services are started with besides the suite's own (the fuzz mix: no bad-input throttle)
    service_env: dict[str, str] = field(default_factory=dict)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class Scenario:
    name: str
    summary: str
    timeline: Callable[[Run], None]
    setup: Setup = field(default_factory=Setup)
    #: a row that runs a stack of its own, not the namespaced cluster (make run, two shards): (base dir, the
    #: suite's network, whose hosts it may use and add to) -> its result
    standalone: Callable[[Path, Network], dict[str, Any]] | None = None


class Run:
    """A scenario's context: what its timeline uses, and what the report reads."""

    def __init__(self, scenario: Scenario, base: Path, net: Network) -> None:
        self.scenario = scenario
        self.base = base
        self.net = net
        self.history = History()
        self.checks: list[Check] = []
        self.notes: list[str] = []
        self.disks: dict[str, Tmpfs | Ext4Loop] = {}
        self.fault_at: float | None = None
        self.recover_from: float | None = None
        self.stop_load = threading.Event()
        self.workers: list[Worker] = []
        self.verdicts: list[Verdict] = []
        self.extra: dict[str, Any] = {}
        self.cluster: Cluster | None = None
        self.sampler: Sampler | None = None
        self.hot: list[str] = []
        self.counter = f"faults-{uuid.uuid4().hex[:8]}"
        self.set_clients = [f"set-{i}-{uuid.uuid4().hex[:6]}" for i in range(LOAD["set"])]
        #: reads the event log through s2 for the whole row (load.event_seq_twice)
        self.watcher: load.EventWatcher | None = None

    # -- for timelines ----------------------------------------------------------------

    @property
    def c(self) -> Cluster:
        assert self.cluster is not None
        return self.cluster

    @property
    def s(self) -> Sampler:
        assert self.sampler is not None
        return self.sampler

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(name, bool(ok), detail))
        return bool(ok)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def mark(self, event: str, **details: Any) -> float:
        return self.history.mark(event, **details)

    def fault(self, event: str, **details: Any) -> float:
        """Mark the fault's injection (the first one is what recovery is measured from, by default)."""
        t = self.mark(event, **details)
        if self.fault_at is None:
            self.fault_at = t
        return t

    def healed(self, event: str, **details: Any) -> float:
        """Mark a repair the cluster could not do alone: recovery is measured from here."""
        t = self.mark(event, **details)
        self.recover_from = t
        return t

    def now(self) -> float:
        return self.history.now()

    def sleep_until(self, t: float) -> None:
        time.sleep(max(0.0, t - self.now()))

    def leader(self, exclude: tuple[str, ...] = (), timeout_s: float = 30.0) -> str:
        return self.c.leader(timeout_s=timeout_s, exclude=exclude)

    def followers(self, leader: str) -> list[str]:
        """Every other instance: t1..t3's, and one a row added while it is there."""
        return [n for n in self.c.nodes if n != leader]

    def ops(self) -> list[Op]:
        return self.history.snapshot()

    def ok_writes_after(self, t: float, service: str | None = None) -> int:
        return sum(
            1
            for op in self.ops()
            if op.workload in SYNC_WORKLOADS
            and op.outcome == OK
            and op.invoked >= t
            and (service is None or op.service == service)
        )

    def kill(self, name: str) -> None:
        node = self.c.nodes[name].child
        node.send_signal(signal.SIGKILL)
        assert node.proc is not None
        node.proc.wait(10)

    def restart_node(self, name: str, timeout_s: float = 60.0) -> str:
        """Start a stopped instance and wait until it follows, repairing it as the runbook says when it cannot:
        DIVERGED -> `cluster rejoin` (sc.rejoin, exit 75, started again empty); files it cannot recover from
        (it exits at start) -> the `sc_rejoin` marker by hand, started again. Returns how it came back."""
        self.c.start_node(name)
        came = self._back(name, timeout_s)
        if came["role"] == "exited" and self._exit_code(name) == REJOIN_EXIT:
            self._rebuilt_itself(name, timeout_s)
            return "rebuilt itself"
        if came["role"] == "exited":
            self.note(f"{name} could not start ({self._fatal(name)}); rebuilt by the sc_rejoin marker")
            self.mark("rebuild: sc_rejoin marker", node=name)
            self._supervise(name, timeout_s)
            return "rebuilt"
        if came["role"] == "diverged":
            self.rejoin(name, came, timeout_s)
            return "rejoined"
        return str(came["role"])

    def rejoin(self, name: str, role: dict[str, Any], timeout_s: float = 60.0) -> None:
        """A DIVERGED instance rebuilt as the runbook says: `cluster rejoin` (sc.rejoin as the operator; it
        exits 75), then its supervisor starts it again and it joins the leader empty."""
        node = self.c.nodes[name]
        self.note(f"{name} DIVERGED ({role.get('diverged')}); rebuilt with rejoin")
        self.mark("rejoin", node=name)
        conn = self.c.open_conn(name, 5.0, *OPERATOR)
        try:
            answer = conn.call("sc.rejoin", [None, role["instance_uuid"]]).data[0]
        finally:
            conn.close()
        assert node.child.proc is not None
        code = node.child.proc.wait(30)
        self.check(f"{name} rejoin accepted", answer.get("status") == "OK" and code == REJOIN_EXIT, f"{answer}")
        self._supervise(name, timeout_s, marker=False)

    def rejoin_if_diverged(self, name: str, timeout_s: float = 30.0) -> None:
        """After a heal: until the instance follows. One that comes back DIVERGED rebuilds itself when it can
        prove its extra rows were never acknowledged (SC_AUTO_REJOIN: it exits 75 and its supervisor, here
        the harness, starts it again); only if it stays DIVERGED is it rebuilt by hand, and the check that
        no person was needed fails. It may lead by then: it won an election after the heal (a former leader
        that has caught up is as good a candidate as any)."""
        came = self._back(name, timeout_s, may_lead=True)
        if came["role"] == "diverged":
            came = self._exits_to_rebuild(name, AUTO_REJOIN_S) or came
        if came["role"] == "exited" and self._exit_code(name) == REJOIN_EXIT:
            self._rebuilt_itself(name, timeout_s)
        elif came["role"] == "diverged":
            self.check(f"{name} rebuilt itself (no command run)", False, f"stayed DIVERGED: {came.get('diverged')}")
            self.rejoin(name, came)

    def _exits_to_rebuild(self, name: str, timeout_s: float) -> dict[str, Any] | None:
        """Until a DIVERGED instance exits to rebuild itself ({"role": "exited"}), or None after timeout_s."""
        child = self.c.nodes[name].child
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not child.alive():
                return {"role": "exited"}
            time.sleep(0.1)
        return None

    def _rebuilt_itself(self, name: str, timeout_s: float) -> None:
        """It proved its extra rows were never acknowledged, set its files aside and exited 75: start it again
        (what `restart: on-failure` does) until it follows; no operator command was run."""
        self.note(f"{name} came back DIVERGED and rebuilt itself (exit 75, files set aside)")
        self.mark("rebuilt itself", node=name)
        self.check(f"{name} rebuilt itself (no command run)", True)
        self._supervise(name, timeout_s, marker=False)

    def _exit_code(self, name: str) -> int | None:
        proc = self.c.nodes[name].child.proc
        return None if proc is None else proc.poll()

    def _supervise(self, name: str, timeout_s: float, *, marker: bool = True) -> None:
        """What a supervisor does for an instance being rebuilt: start it (with the rebuild marker) until it
        follows, at most SUPERVISOR_STARTS times; a start that exits or hangs is noted (and a hung one stopped)."""
        node = self.c.nodes[name]
        for start in range(1, SUPERVISOR_STARTS + 1):
            if marker:
                (node.data_dir / "sc_rejoin").touch()
            self.c.start_node(name)
            try:
                role = self._back(name, min(timeout_s, REBUILD_START_S))["role"]
            except AssertionError:
                role = "hung"
                node.child.stop(timeout_s=5)
            if role == "follower":
                self.check(f"{name} rebuilt and follows", True, f"start {start}")
                return
            self.note(f"{name}: rebuild start {start} {role}: {self._fatal(name)}")
        self.check(f"{name} rebuilt and follows", False, f"{SUPERVISOR_STARTS} starts failed: {self._fatal(name)}")
        raise AssertionError(f"{name} could not be rebuilt")

    def _fatal(self, name: str) -> str:
        """The last error line of an instance's log (why it exited)."""
        lines = [ln for ln in self.c.nodes[name].child.log_tail(30).splitlines() if " F> " in ln or " E> " in ln]
        return lines[-1][-200:] if lines else "no error logged"

    def _back(self, name: str, timeout_s: float, *, may_lead: bool = False) -> dict[str, Any]:
        """Until the instance follows or is diverged (its role), or its process exited ({"role": "exited"}).
        may_lead: leading counts as back too (after a heal the instance may win an election fairly; two
        writable at once is the sampler's check, not this one's)."""
        child = self.c.nodes[name].child
        back_roles = ("follower", "diverged", "leader") if may_lead else ("follower", "diverged")

        def back() -> dict[str, Any] | None:
            if not child.alive():
                return {"role": "exited"}
            r = self.c.role(name)
            return r if r is not None and r["role"] in back_roles else None

        return until(back, timeout_s, lambda: f"{name} {'is back' if may_lead else 'follows'}: {self.c.roles()}")

    def workers_of(self, service: str) -> list[Worker]:
        return [w for w in self.workers if w.service == service]

    # -- the run ----------------------------------------------------------------------

    def prepare(self) -> None:
        setup = self.scenario.setup
        data_dirs, node_env = {}, {n: dict(setup.node_env) for n in NODES}
        for n in NODES:
            if setup.disks == "tmpfs":
                self.disks[n] = Tmpfs(self.base / f"{n}-disk", TMPFS_MB).mount()
                node_env[n]["SC_WAL_MIN_FREE_MB"] = str(WAL_MIN_FREE_MB)
            elif setup.disks == "ext4":
                self.disks[n] = Ext4Loop(self.base / f"{n}-disk", self.base / f"{n}-disk.img", EXT4_MB).mount()
            if n in self.disks:
                data_dirs[n] = self.disks[n].mountpoint / "data"
            if setup.faketime:
                if not Path(FAKETIME_LIB).exists():
                    raise RuntimeError(f"{FAKETIME_LIB} missing: apt-get install faketime (make test-faults does)")
                clock = self.base / f"{n}.faketime"
                clock.write_text("+0\n")
                node_env[n] |= {
                    "LD_PRELOAD": FAKETIME_LIB,
                    "FAKETIME_TIMESTAMP_FILE": str(clock),
                    "FAKETIME_CACHE_DURATION": "1",
                    "DONT_FAKE_MONOTONIC": "1",  # the jump is the wall clock's; monotonic time goes on
                }
        self.cluster = Cluster(
            self.base,
            self.net,
            node_env=node_env,
            service_env=dict(setup.service_env),
            data_dirs=data_dirs,
            discovery=setup.discovery,
        )
        self.cluster.start()
        self.hot = create_hot_sessions(self.c.services["s1"].endpoint, HOT_SESSIONS, "register-hot")

    def start_load(self) -> None:
        self.sampler = Sampler(self.c, self.history).start()
        services = list(self.c.services.values())
        i = 0
        for workload, n in LOAD.items():
            for k in range(n):
                svc = services[k % len(services)]
                kw: dict[str, Any] = {
                    "index": i,
                    "endpoint": svc.endpoint,
                    "service": svc.name,
                    "history": self.history,
                    "stop": self.stop_load,
                }
                worker: Worker
                if workload == "set":
                    worker = SetWorker(client_id=self.set_clients[k], **kw)
                elif workload == "register":
                    worker = RegisterWorker(sessions=self.hot, **kw)
                elif workload == "counter":
                    worker = CounterWorker(counter=self.counter, **kw)
                else:
                    worker = CacheWorker(**kw)
                self.workers.append(worker)
                i += 1
        for w in self.workers:
            w.start()
        self.watcher = load.EventWatcher(self.c.services[services[-1].name].endpoint)
        self.watcher.start()
        self.mark("load_started")

    def warm_up(self) -> None:
        def flowing() -> bool | None:
            ok = Counter(op.workload for op in self.ops() if op.outcome == OK)
            return True if all(ok[w] >= 10 for w in SYNC_WORKLOADS) else None

        until(flowing, 30, "every workload acknowledged 10 writes")
        time.sleep(WARMUP_S)

    def finish(self) -> None:
        """Heal what is left, wait for writes, stop the load, read the final state, check."""
        self.net.heal()
        over = self.mark("faults_over")
        resumed = True
        try:
            until(
                lambda: True if self.ok_writes_after(over) >= RESUME_WRITES else None,
                RESUME_TIMEOUT_S,
                f"{RESUME_WRITES} acknowledged writes after the faults",
                interval_s=0.1,
            )
        except AssertionError as e:
            resumed = False
            self.check("writes resume after the faults", False, str(e))
        if resumed:
            self.check("writes resume after the faults", True)
            time.sleep(AFTER_S)
        self.stop_workers()
        self.mark("load_stopped")
        self.final_state()

    def stop_workers(self) -> None:
        self.stop_load.set()
        for w in self.workers:
            w.join(15)
        if self.watcher is not None:
            self.watcher.stop()
        if self.sampler is not None:
            self.sampler.stop()

    def final_state(self) -> None:
        leader = self.c.leader(timeout_s=60)
        # Every instance there is, one a row added included: it is checked like the others while it follows
        # (a removed one is unregistered, replicates nothing more, and is left out as a stopped one is).
        alive = [n for n, node in self.c.nodes.items() if node.child.alive()]
        others = [n for n in alive if n != leader and (self.c.role(n) or {}).get("role") == "follower"]
        try:
            until(lambda: True if self.c.caught_up(leader, others) else None, 30, "followers caught up")
            converged = True
        except AssertionError:
            converged = False
        self.check("followers catch up with the leader", converged, f"leader {leader}, followers {others}")
        ops = self.ops()
        present = {n: self.sessions_on(n) for n in [leader, *others]}
        conn = self.c.open_conn(leader, 10.0)
        try:
            finals: dict[str, tuple[int, list[int]] | None] = {}
            for sid in self.hot:
                r = conn.call("sc.session_get", [None, stored_id(sid)]).data[0]
                finals[sid] = (int(r["rev"]), list(r["data"]["log"])) if r["status"] == "OK" else None
            r = conn.call("sc.counter_get", [None, self.counter]).data[0]
            counter = int(r["value"]) if r["status"] == "OK" else 0
            if r["status"] != "OK":
                # Not a value: say what the read answered, and what the leader's quorum layer holds pending
                # (a WRITE_PENDING that outlives every synchronous timeout is a leak, not a slow write).
                sync = conn.call("sc.stats", [None]).data[0].get("synchronous")
                self.note(f"the final counter read on {leader} answered {r}; its synchronous state: {sync}")
                self.extra["counter_read"] = {"answer": r, "synchronous": sync}
            cache_keys = {op.value for op in ops if op.workload == "cache"}
            cached = {k for k in cache_keys if conn.call("sc.cache_get", [None, "", k]).data[0]["status"] == "OK"}
        finally:
            conn.close()
        self.verdicts = [
            checkers.check_set(ops, present[leader]),
            checkers.check_register(ops, finals),
            checkers.check_counter(ops, counter),
            checkers.check_set(ops, cached, workload="cache"),
        ]
        self.linearizable(ops)
        final = {
            "leader": leader,
            "register": finals,
            "counter": counter,
            "sessions": {n: len(x) for n, x in present.items()},
        }
        (self.base / "final.json").write_text(json.dumps(final, default=str) + "\n")
        acked = {op.value for op in ops if op.workload == "set" and op.outcome == OK}
        for n in others:
            missing = len(acked - present[n])
            self.check(f"{n} (follower) has every acknowledged session", missing == 0, f"{missing} missing")
        self.extra["final_leader"] = leader
        self.replicas_agree(leader, others if converged else [])

    def linearizable(self, ops: list[Op]) -> None:
        """Every hot session and the counter, answer by answer, unknown outcomes indeterminate
        (tests/faults/linear.py); a key too large to search fails the check rather than pass unseen."""
        v = linear.check_linearizable(ops, self.counter)
        self.verdicts.append(v)
        not_checked = v.info.get("not_checked") or []
        bad = v.anomalies.get("not_linearizable") or []
        self.extra["linearizable"] = {"checked": v.info.get("checked"), "seconds": v.info.get("check_s")}
        for text in bad:
            self.note(text)
        self.check(
            "every hot session and the counter linearizable",
            not bad and not not_checked,
            f"{len(bad)} keys with no order; not checked: {not_checked}" if bad or not_checked else "",
        )

    def replicas_agree(self, leader: str, followers: list[str]) -> None:
        """No follower keeps a row the leader does not have (issue 35: rows the leader rolled back in its
        memory only), and no event sequence number stands for two events."""
        rows = load.follower_only_rows(self.c, leader, followers)
        only = sum(r["rows"] for r in rows.values())
        self.extra["follower_only_rows"] = only
        self.extra["follower_digests"] = rows
        detail = json.dumps(rows) if followers else "no follower caught up to compare (see its own check)"
        self.check("no row on a follower that the leader does not have", only == 0, detail)
        uncompared = [f for f, r in rows.items() if not r["compared"]]
        self.check("every caught-up follower compared with the leader at one vclock", not uncompared, str(uncompared))
        conn = self.c.open_conn(leader, 10.0)
        try:
            final = load.final_events(conn)
        finally:
            conn.close()
        twice = load.event_seq_twice(self.watcher, final)
        self.extra["event_seq_twice"] = len(twice)
        self.extra["events_watched"] = len(self.watcher.seen) if self.watcher is not None else 0
        self.check("no event sequence number seen twice", not twice, json.dumps(twice[:5]))

    def sessions_on(self, node: str) -> set[str]:
        """The ids of the set workload's sessions that one instance holds (it lists handles: each is matched to
        the raw id the workload sent, derived with the services' key)."""
        raw_of = {handle_of(op.value): op.value for op in self.ops() if op.workload == "set"}
        conn = self.c.open_conn(node, 10.0)
        try:
            out: set[str] = set()
            for client_id in self.set_clients:
                r = conn.call("sc.session_list", [None, client_id]).data[0]
                out |= {raw_of[s["handle"]] for s in r["sessions"] if s["handle"] in raw_of}
            return out
        finally:
            conn.close()

    def teardown(self) -> None:
        self.stop_load.set()
        with contextlib.suppress(Exception):
            self.stop_workers()
        with contextlib.suppress(Exception):
            self.net.heal()
        if self.cluster is not None:
            self.cluster.close()
        for d in self.disks.values():
            d.close()
        with contextlib.suppress(OSError):
            self.history.write_jsonl(self.base / "history.jsonl")

    # -- the report -----------------------------------------------------------------

    def result(self, duration_s: float) -> dict[str, Any]:
        ops = self.ops()
        end = self.history.event_time("load_stopped") or self.now()
        fault = self.fault_at if self.fault_at is not None else end
        since = self.recover_from if self.recover_from is not None else fault
        sync = [v for v in self.verdicts if v.workload in SYNC_WORKLOADS]
        lost = sum(len(v.lost) for v in sync)
        anomalies = {f"{v.workload}.{k}": len(x) for v in self.verdicts for k, x in v.anomalies.items()}
        sampler = self.sampler
        max_writable = sampler.max_writable if sampler is not None else None
        checks = [
            *self.checks,
            Check(
                "no acknowledged write lost (synchronous spaces)",
                lost == 0 and bool(sync),
                f"{lost} lost" if sync else "not checked: no final read",
            ),
            Check("no impossible history (anomalies)", not anomalies, str(anomalies)),
            Check(
                "never two instances writable",
                max_writable is not None and max_writable <= 1,
                f"max {max_writable}, {sampler.violations[:3] if sampler else ''}",
            ),
        ]
        gap, _ = checkers.longest_write_gap(ops, fault, end) if ops else (None, None)
        recovered = checkers.recovery_s(ops, fault, since, end) if ops else None
        answers = Counter(a.answer for op in ops if op.write and op.outcome != OK for a in op.attempts)
        return {
            "scenario": self.scenario.name,
            "summary": self.scenario.summary,
            "passed": all(c.ok for c in checks),
            "ops": checkers.counts(ops),
            "ops_by_workload": {w: checkers.counts(ops, (w,)) for w in ("set", "register", "counter", "cache")},
            "reads": checkers.counts(ops, ("read",)),
            "acknowledged_lost": lost,
            "async_lost": sum(len(v.lost) for v in self.verdicts if v.workload == "cache"),
            "max_writable": max_writable,
            "two_writable": sampler.violations if sampler else [],
            "unconfirmed_two_writable": sampler.suspects if sampler else 0,
            "sampler_rounds": len(sampler.rounds) if sampler else 0,
            "write_gap_s": None if gap is None else round(gap, 2),
            "recovery_s": None if recovered is None else round(recovered, 2),
            "recovery_from": "repair" if self.recover_from is not None else "fault",
            "failed_attempt_answers": dict(answers.most_common()),
            "checks": [c.__dict__ for c in checks],
            "notes": self.notes,
            "events": [{"t": round(t, 3), "event": e, **d} for t, e, d in self.history.events],
            "verdicts": [v.as_dict() for v in self.verdicts],
            "duration_s": round(duration_s, 1),
            "ttl_s": TTL_S,
            **self.extra,
        }


def execute(scenario: Scenario, base: Path, net: Network) -> dict[str, Any]:
    """Run one scenario from a fresh cluster to its verdict; never raises (a crash is a failed check)."""
    disks.cleanup_stale(base)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True, exist_ok=True)
    if scenario.standalone is not None:
        return scenario.standalone(base, net)
    started = time.monotonic()
    run = Run(scenario, base, net)
    try:
        run.prepare()
        run.start_load()
        run.warm_up()
        try:
            scenario.timeline(run)
        except Exception as e:
            run.check("the scenario's timeline runs to its end", False, f"{type(e).__name__}: {e}")
            (base / "error.txt").write_text(traceback.format_exc())
        run.finish()
    except Exception as e:
        run.check("the run gets to its final read", False, f"{type(e).__name__}: {e}")
        with (base / "error.txt").open("a") as f:
            f.write(traceback.format_exc())
    finally:
        run.teardown()
    return run.result(time.monotonic() - started)


__all__ = ["FAIL", "Run", "Scenario", "Setup", "execute"]


_KEY = sessionkeys.SessionKey(bytes.fromhex(SESSION_KEY_HEX))


def stored_id(raw: str) -> str:
    """The id storage keys a session by: derived from the raw id with the services' key (issue 37)."""
    return str(uuid.UUID(bytes=_KEY.derive(uuid.UUID(raw).bytes)))


def handle_of(raw: str) -> str:
    """The handle storage names a session by in lists and events."""
    return sessionkeys.handle(_KEY.derive(uuid.UUID(raw).bytes))
