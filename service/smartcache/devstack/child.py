"""The floor of make run's stack: a child process of the stack, waits for it, and what they give up on.

`Child` is the shared supervisor's child (smartcache.supervision: stopped by its PID, gone when
we are, a ``run_started`` line in its log at each start), run from the checkout, with the waits
the stack and the tests need: until a condition holds, until this very process listens on its
ports. Every other module of the stack imports this one; it imports none of them.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from smartcache.devstack.sockets import listens
from smartcache.supervision import Child as SupervisedChild

#: the checkout: service/smartcache/devstack/child.py -> the top level
ROOT = Path(__file__).resolve().parents[3]
LUA_INIT = ROOT / "lua" / "init.lua"
READY_TIMEOUT_S = 30.0
POLL_S = 0.05


class Stop(Protocol):
    """What a wait polls to give up early: a threading.Event, or make run's Signals (smartcache.supervision)."""

    def wait(self, timeout: float | None = None) -> bool: ...


class NotReady(Exception):
    """A child exited, or did not become ready in time, or we were asked to stop while waiting."""


@dataclass
class Child(SupervisedChild):
    """A child process of the stack, started from the checkout, stopped by its PID."""

    cwd: Path | None = ROOT

    def wait_until(
        self,
        what: str,
        ready: Callable[[], bool],
        timeout_s: float = READY_TIMEOUT_S,
        stop: Stop | None = None,
    ) -> None:
        """Poll ready() until true; NotReady if this child exits, time runs out or stop is set."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            if not self.alive():
                raise NotReady(f"{self.name} exited before {what}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise NotReady(f"{self.name}: no {what} in {timeout_s:g} s:\n{self.log_tail()}")
            if stop is not None and stop.wait(POLL_S):
                raise NotReady(f"stopped while waiting for {self.name}")
            if stop is None:
                time.sleep(POLL_S)

    def wait_listening(self, *ports: int, stop: Stop | None = None) -> None:
        """Until this very process listens on every port (another program on one of them never counts)."""
        self.wait_until(
            f"listening on {', '.join(map(str, ports))}", lambda: all(listens(self.pid, p) for p in ports), stop=stop
        )

    def listens_on(self, port: int) -> bool:
        """Alive, and listening on port itself."""
        return self.alive() and listens(self.pid, port)


def http_get_json(url: str, timeout_s: float = 2.0) -> tuple[int, Any]:
    """GET a JSON document; returns (status, parsed body)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 - our own local endpoint
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def http_status(url: str) -> int:
    """The status a GET of url answers (0: no answer)."""
    try:
        with urllib.request.urlopen(url, timeout=1.0) as r:  # noqa: S310 - our own local endpoint
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0
