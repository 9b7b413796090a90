"""`smartcache-cli cluster` through a real subprocess against real Tarantool instances."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from smartcache.devstack.stack import Tarantool


def _cli(*args: str, timeout_s: float | None = None) -> tuple[int, dict]:
    before = ["--timeout", str(timeout_s)] if timeout_s else []
    out = subprocess.run(
        [sys.executable, "-m", "smartcache.cli", *before, "cluster", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.returncode, json.loads(out.stdout)


def test_status_names_the_writable_instance_and_exits_1_when_none_may_write(
    storage_pair_fresh: tuple[Tarantool, Tarantool],
) -> None:
    master, replica = storage_pair_fresh
    rc, doc = _cli("--tarantool", f"{replica.address},{master.address}", "status")
    assert rc == 0
    assert doc["leader"] == master.address
    assert doc["writable"] == [master.address]
    roles = {i["address"]: (i["role"], i["writable"], i["reachable"]) for i in doc["instances"]}
    assert roles == {master.address: ("standalone", True, True), replica.address: ("standalone", False, True)}
    master.stop()
    rc, doc = _cli("--tarantool", f"{replica.address},{master.address}", "status")
    assert rc == 1
    assert doc["leader"] is None
    assert [i["reachable"] for i in doc["instances"]] == [True, False]


def test_switchover_and_rejoin_say_plainly_that_failover_is_not_configured(
    storage_pair_fresh: tuple[Tarantool, Tarantool],
) -> None:
    master, replica = storage_pair_fresh
    reason = ["--reason", "test: failover is not configured"]
    rc, doc = _cli("--tarantool", f"{master.address},{replica.address}", "switchover", replica.address, *reason)
    assert rc == 1
    assert doc["status"] == "BAD_REQUEST"
    assert "not configured" in doc["message"]
    rc, doc = _cli("--tarantool", f"{master.address},{replica.address}", "rejoin", "no-such-instance", *reason)
    assert rc == 2
    assert doc["error"] == "NOT_FOUND"


def test_status_reports_a_frozen_instance_as_unreachable_instead_of_waiting_for_it(
    storage_pair_fresh: tuple[Tarantool, Tarantool],
) -> None:
    master, replica = storage_pair_fresh
    os.kill(replica.pid, signal.SIGSTOP)  # the kernel still accepts connections; nothing answers
    try:
        rc, doc = _cli("--tarantool", f"{master.address},{replica.address}", "status", timeout_s=1)
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    assert rc == 1  # not healthy: one instance cannot be asked
    assert doc["leader"] == master.address
    frozen = doc["instances"][1]
    assert frozen["reachable"] is False
    assert frozen["error"]  # a timeout or a reset, whichever the connector meets first
