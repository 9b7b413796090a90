"""Children restarted after a death by a policy, and stopped in an order: make run's and ``--processes``'.

A child that dies is reported (an `Event`), the others keep running, and after the policy's delay
it is started again; once a cheap probe says it answers again, that is reported too. The delay is
fixed (make run: a Tarantool instance rejoins, an etcd member rejoins its cluster) or doubles while
the child keeps dying young, back to the first once it stayed up ``stable_after_s`` (the service's
processes: one bad process must not take the host's endpoint down, nor spin). Repeated quick
deaths (``max_deaths`` within ``window_s``) make the supervisor give up when the policy says so,
since a child that cannot stay up needs a person. Exit code 75 (``smartcache-cli cluster
rejoin``: "restart me empty") is a restart asked for, not a death.

The supervisor reports and decides; what a report looks like is the caller's (make run writes a
sentence, the service a JSON log line): each `Event` says what happened and what comes next.
"""

from __future__ import annotations

import collections
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from smartcache.supervision.child import STOP_TIMEOUT_S, Child
from smartcache.supervision.signals import POLL_S, Signals

#: a restarted child's "is it back?" probe runs at most this often
PROBE_EVERY_S = 0.5
#: `smartcache-cli cluster rejoin` makes an instance exit with this to be started again empty
REJOIN_EXIT_CODE = 75


@dataclass(frozen=True)
class RestartPolicy:
    """Restart a dead child after delay_s (doubling up to max_delay_s while it dies young: up less than
    stable_after_s); give up when max_deaths come within window_s (None: never)."""

    delay_s: float = 1.0
    max_deaths: int | None = 5
    window_s: float = 60.0
    #: None: the delay stays delay_s
    max_delay_s: float | None = None
    stable_after_s: float = 30.0


#: died: a death, restart planned; rejoin: exit 75, restart planned; gave_up: one death too many;
#: restarted: started again; back: its probe answers again
Kind = Literal["died", "rejoin", "gave_up", "restarted", "back"]


@dataclass(frozen=True)
class Event:
    """What the supervisor saw or did, for its caller to report."""

    kind: Kind
    child: Child
    #: the PID it had (died, rejoin, gave_up) or has (restarted, back)
    pid: int
    returncode: int | None = None
    #: how long it had been up when it died
    up_s: float = 0.0
    restart_in_s: float = 0.0
    #: deaths within the policy's window, this one included
    deaths: int = 0
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    #: back: seconds since the restart; what the probe found, in a word
    back_after_s: float = 0.0
    what: str = ""


@dataclass
class Supervised:
    """One child under supervision: its deaths, a restart due, whether it is back."""

    child: Child
    #: a cheap "answering again?" probe for after a restart (None: alive is enough)
    ready: Callable[[], bool] | None = None
    #: what the probe found, in a word, for the report (say the instance's role)
    describe: Callable[[], str] | None = None
    #: this child's restart policy (None: the supervisor's)
    policy: RestartPolicy | None = None
    deaths: collections.deque[float] = field(default_factory=collections.deque)
    restart_at: float | None = None
    #: the delay of the next restart (doubles under a policy with max_delay_s)
    delay_s: float | None = None
    waiting_back_since: float | None = None
    next_probe: float = 0.0


class Supervisor:
    """Watches children started already; restarts them by the policy; ``run`` returns when stopped or given up."""

    def __init__(
        self,
        *,
        report: Callable[[Event], None],
        policy: RestartPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.report = report
        self.policy = policy or RestartPolicy()
        self.clock = clock
        self.supervised: list[Supervised] = []
        self.restarts = 0

    def add(
        self,
        child: Child,
        ready: Callable[[], bool] | None = None,
        describe: Callable[[], str] | None = None,
        policy: RestartPolicy | None = None,
    ) -> None:
        self.supervised.append(Supervised(child, ready, describe, policy))

    def run(self, stop: Signals) -> int:
        """Until SIGINT/SIGTERM (0) or a child died too often (1)."""
        while not stop.wait(POLL_S):
            if self.step():
                return 1
        return 0

    def step(self) -> bool:
        """Look at every child once: report deaths, restart those due, report those back. True: give up."""
        now = self.clock()
        for s in self.supervised:
            if s.restart_at is not None:
                if now >= s.restart_at:
                    self._restart(s, now)
            elif not s.child.alive():
                if self._died(s, now):
                    return True
            elif s.waiting_back_since is not None and now >= s.next_probe:
                self._probe(s, now)
        return False

    def _died(self, s: Supervised, now: float) -> bool:
        """Report a death and plan the restart; True when this one is one too many."""
        child, p = s.child, s.policy or self.policy
        code, up_s = child.returncode, now - child.started_at
        if p.max_delay_s is not None and (s.delay_s is None or up_s >= p.stable_after_s):
            s.delay_s = p.delay_s  # the first death, or one after a stable run: the first delay again
        delay_s = p.delay_s if s.delay_s is None else s.delay_s
        if code != REJOIN_EXIT_CODE:
            while s.deaths and s.deaths[0] < now - p.window_s:
                s.deaths.popleft()
            s.deaths.append(now)
        kind: Kind = "rejoin" if code == REJOIN_EXIT_CODE else "died"
        if kind == "died" and p.max_deaths is not None and len(s.deaths) >= p.max_deaths:
            kind = "gave_up"
        self.report(Event(kind, child, child.pid, code, up_s, delay_s, len(s.deaths), p))
        if kind == "gave_up":
            return True
        s.restart_at = now + delay_s
        if kind == "died" and p.max_delay_s is not None:
            s.delay_s = min(delay_s * 2, p.max_delay_s)
        return False

    def _restart(self, s: Supervised, now: float) -> None:
        s.restart_at = None
        s.child.start()
        self.restarts += 1
        s.waiting_back_since = now
        s.next_probe = now
        self.report(Event("restarted", s.child, s.child.pid, policy=s.policy or self.policy))

    def _probe(self, s: Supervised, now: float) -> None:
        s.next_probe = now + PROBE_EVERY_S
        if s.ready is not None and not s.ready():
            return
        since = s.waiting_back_since or now
        s.waiting_back_since = None
        what = s.describe() if s.describe is not None else ""
        self.report(Event("back", s.child, s.child.pid, back_after_s=now - since, what=what))


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def describe_exit(code: int | None) -> str:
    """An exit status in words: killed by a signal, or a wrapper's 128 + N for its command's signal."""
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {_signal_name(-code)}"
    if 128 < code < 128 + 65:  # a wrapper (etcd's `timeout`) whose command was killed
        return f"exited {code} (its command killed by {_signal_name(code - 128)})"
    return f"exited {code}"


def stop_in_order(children: Iterable[Child], signals: Signals, say: Callable[[str], None]) -> None:
    """Stop each child in this order (SIGTERM, then SIGKILL after STOP_TIMEOUT_S); a second SIGINT or SIGTERM
    kills every one left at once. Returns when every one has exited."""
    children = list(children)
    seen = signals.count
    hurry = False
    for i, child in enumerate(children):
        if not child.alive():
            child.stop()  # reaps it
            continue
        child.send_signal(signal.SIGKILL if hurry else signal.SIGTERM)
        deadline, killed = time.monotonic() + STOP_TIMEOUT_S, hurry
        while child.alive():
            signals.pause(0.05)
            if signals.count > seen and not hurry:
                hurry = killed = True
                say("stopping at once (a second Ctrl-C): SIGKILL to what is left")
                for c in children[i:]:
                    c.send_signal(signal.SIGKILL)
            if time.monotonic() > deadline:
                if killed:  # unkillable (uninterruptible sleep): nothing more we can do
                    say(f"{child.name} (pid {child.pid}) still there {STOP_TIMEOUT_S:g} s after SIGKILL; leaving it")
                    break
                say(f"{child.name} (pid {child.pid}) ignored SIGTERM for {STOP_TIMEOUT_S:g} s: SIGKILL")
                child.send_signal(signal.SIGKILL)
                deadline, killed = time.monotonic() + STOP_TIMEOUT_S, True
        if not child.alive():
            child.stop()  # reaps it


def stop_together(children: Iterable[Child], timeout_s: float, killed: Callable[[Child], None]) -> None:
    """SIGTERM to every child at once (peers that each drain), then wait for all of them up to timeout_s
    in all; one still running then gets SIGKILL (killed(child) first, to say so)."""
    children = [c for c in children if c.proc is not None]
    for c in children:
        c.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for c in children:
        try:
            c.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            killed(c)
            c.send_signal(signal.SIGKILL)
            c.wait()
