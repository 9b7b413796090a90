"""The row make-run-kill-leader: the newcomer's stack, not the fault suite's namespaced cluster.

`make run` (``python -m smartcache.devstack`` on a moved port offset, as tests/integration/test_devstack_restarts.py
starts it) with a writer creating sessions through its service and a sampler asking each Tarantool instance its
role every 50 ms; `kill -9` of the leader found with `smartcache-cli cluster status`. make run must report the
death, keep the rest running, restart the instance so that it follows, and the writes must resume by themselves.
Its result has the same fields as every other row (tests/faults/report.py).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tarantool

from smartcache.client import Client, RequestError
from tests.faults import checkers
from tests.faults.history import FAIL, OK, UNKNOWN, Attempt, Op
from tests.integration.test_devstack_restarts import MakeRun, _descendants, _listener

#: make run's lease (its SC_LEADER_TTL_S): the failover takes about TTL + 2 s
TTL_S = 5.0
SAMPLE_S = 0.05
OPERATOR = ("operator", "operator")  # make run's development credentials


class _Writer(threading.Thread):
    """Sessions created through the service, one at a time, each with its attempts' outcomes."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(daemon=True)
        self.endpoint = endpoint
        self.ops: list[Op] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with Client(self.endpoint, timeout_s=2, retries=3) as c:
            while not self.stop.is_set():
                sid = str(uuid.uuid4())
                op = Op(
                    process="writer", service="make-run", workload="set", key=sid, value=sid, invoked=time.monotonic()
                )
                try:
                    r = c.session_create("make-run", session_id=sid)
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


class _Sampler(threading.Thread):
    """How many instances say they are writable at once, every SAMPLE_S."""

    def __init__(self, addresses: list[str]) -> None:
        super().__init__(daemon=True)
        self.addresses = addresses
        self.max_writable = 0
        self.rounds = 0
        self.stop = threading.Event()

    def _writable(self, address: str) -> bool:
        host, _, port = address.rpartition(":")
        try:
            conn = tarantool.Connection(
                host, int(port), user=OPERATOR[0], password=OPERATOR[1], connection_timeout=0.3, socket_timeout=0.3
            )
        except tarantool.error.Error:
            return False
        try:
            role = conn.call("sc.role", [None]).data[0]
            return bool(role.get("writable"))
        except tarantool.error.Error:
            return False
        finally:
            conn.close()

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            self.max_writable = max(self.max_writable, sum(self._writable(a) for a in self.addresses))
            self.rounds += 1


class _Row:
    """One run of the row: its checks, its stack, its writer and sampler."""

    def __init__(self, base: Path) -> None:
        self.started = time.monotonic()
        self.checks: list[dict[str, Any]] = []
        self.stack = MakeRun(base)
        self.writer: _Writer | None = None
        self.sampler: _Sampler | None = None
        self.fault = self.end = time.monotonic()
        self.lost = 0

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.checks.append({"name": name, "ok": bool(ok), "detail": detail})

    def _until(self, what: Callable[[], bool], timeout_s: float, interval_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not what() and time.monotonic() < deadline:
            time.sleep(interval_s)
        return what()

    def load(self) -> str:
        """make run ready, the writer and the sampler running; the service's endpoint."""
        self.stack.wait_ready()
        endpoint = f"tcp://127.0.0.1:{5555 + self.stack.offset}"
        addresses = [i["address"] for i in self.stack.status()["instances"]]
        self.writer, self.sampler = _Writer(endpoint), _Sampler(addresses)
        self.writer.start()
        self.sampler.start()
        time.sleep(3)
        return endpoint

    def kill_leader(self) -> None:
        stack, writer = self.stack, self.writer
        assert writer is not None
        old = stack.status()["leader"]
        pid = _listener(_descendants(stack.proc.pid), int(old.rsplit(":", 1)[1]))
        self.check("the leader's process is found by its port", pid is not None, old)
        self.fault = time.monotonic()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        fault = self.fault
        self.check(
            "writes resume through the service by themselves",
            self._until(lambda: any(op.outcome == OK and op.invoked > fault + 0.2 for op in writer.ops), 60, 0.1),
        )

        def old_follows() -> bool:
            s = stack.status()
            roles = {i["address"]: i.get("role") for i in s["instances"]}
            return s["leader"] != old and roles.get(old) == "follower"

        self.check("the old leader is restarted and follows", self._until(old_follows, 90, 0.5), old)
        self.check("make run kept everything else running", stack.proc.poll() is None)
        self.check("make run reported the death", "killed by SIGKILL; the others keep running" in stack.err)

    def verify(self, endpoint: str) -> None:
        assert self.writer is not None
        assert self.sampler is not None
        time.sleep(2)
        self.end = time.monotonic()
        self.writer.stop.set()
        self.writer.join(10)
        acked = [op.key for op in self.writer.ops if op.outcome == OK]
        with Client(endpoint, timeout_s=5, retries=3) as c:
            self.lost = sum(1 for sid in acked if not c.session_get(sid).ok)
        self.check("no acknowledged write lost", self.lost == 0, f"{self.lost} of {len(acked)} missing")
        rounds = f"max {self.sampler.max_writable} over {self.sampler.rounds} rounds"
        self.check("never two instances writable", self.sampler.max_writable <= 1, rounds)
        code = self.stack.ctrl_c()
        self.check("Ctrl-C stops it all (exit 0)", code == 0, str(code))

    def close(self) -> None:
        for t in (self.writer, self.sampler):
            if t is not None:
                t.stop.set()
        self.stack.close()

    def result(self) -> dict[str, Any]:
        ops = self.writer.ops if self.writer is not None else []
        gap, _ = checkers.longest_write_gap(ops, self.fault, self.end) if ops else (None, None)
        recovered = checkers.recovery_s(ops, self.fault, self.fault, self.end) if ops else None
        return {
            "scenario": "make-run-kill-leader",
            "summary": "kill -9 the leader of `make run`'s own stack",
            "passed": all(c["ok"] for c in self.checks),
            "ops": checkers.counts(ops),
            "acknowledged_lost": self.lost,
            "async_lost": 0,
            "max_writable": self.sampler.max_writable if self.sampler is not None else None,
            "write_gap_s": None if gap is None else round(gap, 2),
            "recovery_s": None if recovered is None else round(recovered, 2),
            "recovery_from": "fault",
            "checks": self.checks,
            "notes": ["make run's own stack: one service, three Tarantool instances, three etcd members, TTL 5 s"],
            "duration_s": round(time.monotonic() - self.started, 1),
            "ttl_s": TTL_S,
        }


def run_row(base: Path, _net: Any = None) -> dict[str, Any]:
    """The make-run-kill-leader row, from a fresh make run to its verdict; never raises."""
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
