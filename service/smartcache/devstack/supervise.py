"""make run's supervisor: children restarted after a death, everything stopped on Ctrl-C, never a hang.

What it promises, as the Docker stack does with ``restart: on-failure``: a child
that dies is reported (its exit code or signal, the end of its log), everything
else keeps running (a Tarantool leader's death is a failover, not the end of
the stack), and after ``RestartPolicy.delay_s`` the child is started again on
the same data (a Tarantool instance rejoins as a follower, an etcd member
rejoins its cluster); once it answers again that is reported too. Only
repeated quick deaths (``max_deaths`` within ``window_s``: 5 within 60 s) make
it give up and stop everything, since a child that cannot stay up needs a
person. Exit code 75 (``smartcache-cli cluster rejoin``: "restart me empty")
is a restart asked for, not a death.

Signals: none is ever handled asynchronously. ``Signals.block()`` blocks
SIGINT, SIGTERM and SIGCHLD before any thread or child exists (every thread
inherits the mask; `Child` gives its children an empty one), and the main
loop takes them with ``sigtimedwait``: a SIGINT or SIGTERM stops the stack, a
SIGCHLD wakes the loop at once to look at its children. This replaced a
``signal.signal`` handler that called ``threading.Event.set()``: the Event's
lock is a plain (non-reentrant) Lock, and Python runs a handler in the main
thread between two bytecodes, so a Ctrl-C landing while the main thread was
inside that same Event's ``wait()`` (it polled it every 50-200 ms) ran
``set()`` with the lock already held by itself: a futex wait forever, every
further SIGINT and SIGTERM running the same handler into the same wait, and
the children left running (CPython documents that signal handlers must not
use threading's locks; reproduced in tests/integration/test_supervise.py).

Stopping: the children in the reverse order of their start (the service first:
it drains; etcd last), each SIGTERM then SIGKILL after ``STOP_TIMEOUT_S``; a
second Ctrl-C while stopping kills the rest at once.

Why no library: docs/development.md ("make run's supervisor") says what was
looked at (supervisor, circus, honcho) and why each was a poor fit.
"""

from __future__ import annotations

import signal

if __name__ == "__main__":
    # `python -m smartcache.devstack.supervise`: block them before any other import. A SIGINT that Python's
    # default handler
    # turned into KeyboardInterrupt inside importlib's module-lock callback was "ignored" there, and the
    # supervisor ran on, deaf to it (CI: test_supervise, a signal at start-up). Blocked, it waits for the loop.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGCHLD})

import collections
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # devstack imports this module
    from smartcache.devstack.stack import Child

#: the signals that stop the stack
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})
#: how often the loop looks at its children when no signal wakes it
POLL_S = 0.2
#: a restarted child's "is it back?" probe runs at most this often
PROBE_EVERY_S = 0.5
#: `smartcache-cli cluster rejoin` makes an instance exit with this to be started again empty
REJOIN_EXIT_CODE = 75
#: a child that ignores SIGTERM this long gets SIGKILL
STOP_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class RestartPolicy:
    """Restart a dead child after delay_s; give up when max_deaths come within window_s."""

    delay_s: float = 1.0
    max_deaths: int = 5
    window_s: float = 60.0


class Signals:
    """SIGINT/SIGTERM/SIGCHLD taken synchronously (sigtimedwait): the `Stop` of make run's waits."""

    def __init__(self) -> None:
        #: SIGINT and SIGTERM received so far (the first stops; a second while stopping kills the rest)
        self.count = 0
        self.first: int | None = None

    def block(self) -> Signals:
        """Block the three signals in this thread (and in every thread started after this)."""
        signal.pthread_sigmask(signal.SIG_BLOCK, {*STOP_SIGNALS, signal.SIGCHLD})
        return self

    def _take(self, timeout_s: float) -> int | None:
        info = signal.sigtimedwait({*STOP_SIGNALS, signal.SIGCHLD}, max(0.0, timeout_s))
        if info is None:
            return None
        if info.si_signo in STOP_SIGNALS:
            self.count += 1
            self.first = self.first or info.si_signo
        return info.si_signo

    def wait(self, timeout: float | None = None) -> bool:
        """True once SIGINT or SIGTERM came; else waits up to timeout, returning False early on a SIGCHLD."""
        if self.count:
            return True
        deadline = time.monotonic() + (POLL_S if timeout is None else timeout)
        while True:
            got = self._take(deadline - time.monotonic())
            if got is None or got == signal.SIGCHLD:
                return bool(self.count)
            return True

    def pause(self, timeout_s: float) -> None:
        """Sleep up to timeout_s, counting any SIGINT/SIGTERM that comes; any of the three ends it early."""
        self._take(timeout_s)

    def is_set(self) -> bool:
        """Whether a SIGINT or SIGTERM came (pending ones are taken now)."""
        while self._take(0) is not None:
            pass
        return bool(self.count)


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
    waiting_back_since: float | None = None
    next_probe: float = 0.0


class Supervisor:
    """Watches children started already; restarts them by the policy; returns when stopped or given up."""

    def __init__(
        self,
        *,
        stop: Signals,
        say: Callable[[str], None],
        policy: RestartPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stop = stop
        self.say = say
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

    def run(self) -> int:
        """Until SIGINT/SIGTERM (0) or a child died too often (1)."""
        while not self.stop.wait(POLL_S):
            gave_up = self.step()
            if gave_up is not None:
                return gave_up
        return 0

    def step(self) -> int | None:
        """Look at every child once: report deaths, restart those due, report those back. 1: give up."""
        now = self.clock()
        for s in self.supervised:
            if s.restart_at is not None:
                if now >= s.restart_at:
                    self._restart(s, now)
            elif not s.child.alive():
                if self._died(s, now):
                    return 1
            elif s.waiting_back_since is not None and now >= s.next_probe:
                self._probe(s, now)
        return None

    def _died(self, s: Supervised, now: float) -> bool:
        """Report a death and plan the restart; True when this one is one too many."""
        child, p = s.child, s.policy or self.policy
        code = child.proc.returncode if child.proc is not None else None
        tail = "\n".join("    " + line for line in child.log_tail(8).splitlines())
        if code == REJOIN_EXIT_CODE:
            self.say(
                f"{child.name} (pid {child.pid}) exited {code} to start again empty (a rejoin); restarting it in "
                f"{p.delay_s:g} s"
            )
            s.restart_at = now + p.delay_s
            return False
        while s.deaths and s.deaths[0] < now - p.window_s:
            s.deaths.popleft()
        s.deaths.append(now)
        if len(s.deaths) >= p.max_deaths:
            self.say(
                f"{child.name} (pid {child.pid}) {describe_exit(code)}: {len(s.deaths)} deaths within "
                f"{p.window_s:g} s, giving up and stopping everything; its last lines:\n{tail}"
            )
            return True
        self.say(
            f"{child.name} (pid {child.pid}) {describe_exit(code)}; the others keep running; restarting it in "
            f"{p.delay_s:g} s (death {len(s.deaths)} of {p.max_deaths - 1} allowed within {p.window_s:g} s); "
            f"its last lines:\n{tail}"
        )
        s.restart_at = now + p.delay_s
        return False

    def _restart(self, s: Supervised, now: float) -> None:
        s.restart_at = None
        s.child.start()
        self.restarts += 1
        s.waiting_back_since = now
        s.next_probe = now
        self.say(f"{s.child.name} restarted (pid {s.child.pid})")

    def _probe(self, s: Supervised, now: float) -> None:
        s.next_probe = now + PROBE_EVERY_S
        if s.ready is not None and not s.ready():
            return
        since = s.waiting_back_since or now
        s.waiting_back_since = None
        what = f" ({s.describe()})" if s.describe is not None else ""
        self.say(f"{s.child.name} is back{what}, {now - since:.1f} s after its restart")


def stop_all(children: Iterable[Child], signals: Signals, say: Callable[[str], None]) -> None:
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


def main(argv: list[str] | None = None) -> int:
    """``python -m smartcache.devstack.supervise [options] CMD...``: make run's supervision of any commands, for tests.

    Starts each command (one shell-split string each) as a `Child`, pausing --gap-s between two starts (a
    start-up a signal may land in), prints one JSON line per start ({"started", "pid"}) and {"supervising":
    true}, then supervises them as make run does until SIGINT or SIGTERM, and stops them all.
    """
    import argparse  # noqa: PLC0415 - the command line of a test tool
    import json  # noqa: PLC0415
    import shlex  # noqa: PLC0415
    import sys  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from smartcache.devstack.stack import Child  # noqa: PLC0415 - devstack imports this module

    signals = Signals().block()
    parser = argparse.ArgumentParser(prog="python -m smartcache.devstack.supervise")
    parser.add_argument("commands", nargs="+")
    parser.add_argument("--logs", type=Path, required=True, help="directory for the children's logs")
    parser.add_argument("--gap-s", type=float, default=0.0)
    parser.add_argument("--delay-s", type=float, default=RestartPolicy.delay_s)
    parser.add_argument("--max-deaths", type=int, default=RestartPolicy.max_deaths)
    parser.add_argument("--window-s", type=float, default=RestartPolicy.window_s)
    a = parser.parse_args(argv)

    def say(text: str) -> None:
        print(f"supervise: {text}", file=sys.stderr, flush=True)  # noqa: T201

    children = [
        Child(name=f"child-{i}", argv=shlex.split(cmd), env={}, log_path=a.logs / f"child-{i}.log")
        for i, cmd in enumerate(a.commands, 1)
    ]
    started: list[Child] = []
    try:
        for child in children:
            child.start()
            started.append(child)
            print(json.dumps({"started": child.name, "pid": child.pid}), flush=True)  # noqa: T201
            if signals.wait(a.gap_s):
                return 0
        print(json.dumps({"supervising": True}), flush=True)  # noqa: T201
        supervisor = Supervisor(stop=signals, say=say, policy=RestartPolicy(a.delay_s, a.max_deaths, a.window_s))
        for child in started:
            supervisor.add(child)
        return supervisor.run()
    finally:
        stop_all(reversed(started), signals, say)


if __name__ == "__main__":
    from smartcache.devstack import supervise  # noqa: PLW0406 - the imported module (stack.py imports it), not __main__

    raise SystemExit(supervise.main())
