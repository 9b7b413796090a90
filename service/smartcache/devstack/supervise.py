"""make run's supervision: its restart policies and its words, on the shared supervisor (smartcache.supervision).

What it promises, as the Docker stack does with ``restart: on-failure``: a child that dies is
reported (its exit code or signal, the end of its log), everything else keeps running (a
Tarantool leader's death is a failover, not the end of the stack), and after the policy's delay
the child is started again on the same data (a Tarantool instance rejoins as a follower, an etcd
member rejoins its cluster); once it answers again that is reported too. Only repeated quick
deaths (5 within 60 s) make it give up and stop everything, since a child that cannot stay up
needs a person. Exit code 75 (``smartcache-cli cluster rejoin``: "restart me empty") is a restart
asked for, not a death.

Stopping: the children in the reverse order of their start (the service first: it drains; etcd
last), each SIGTERM then SIGKILL after 15 s; a second Ctrl-C while stopping kills the rest at
once (`smartcache.supervision.stop_in_order`). Signals are taken by ``sigtimedwait``, never by a
handler (smartcache/supervision/signals.py says why).

``python -m smartcache.devstack.supervise`` runs the same supervision over any commands, for the
tests (tests/integration/test_supervise.py).
"""

from __future__ import annotations

import signal

if __name__ == "__main__":
    # `python -m smartcache.devstack.supervise`: block them before any other import. A SIGINT that Python's
    # default handler turned into KeyboardInterrupt inside importlib's module-lock callback was "ignored"
    # there, and the supervisor ran on, deaf to it (CI: test_supervise, a signal at start-up). Blocked, it
    # waits for the loop.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGCHLD})

import os
from collections.abc import Callable

from smartcache.supervision import Event, RestartPolicy, describe_exit

#: make run's restart policy (as the Docker stack's restart: on-failure, with a limit)
RESTART = RestartPolicy()
#: a Tarantool instance waits out the failover first (the lease, TTL + 2 s at most: docs/operations.md), so that
#: a killed leader comes back as a follower of its successor; started sooner, it removes its own stale key and,
#: having every row, may well win the election again (seen here with a 1 s delay)
TARANTOOL_RESTART = RestartPolicy(delay_s=float(os.environ.get("SC_LEADER_TTL_S") or 5) + 2)


def sentence(e: Event) -> str:
    """What the supervisor saw or did, as make run says it."""
    child, p = e.child, e.policy
    if e.kind == "restarted":
        return f"{child.name} restarted (pid {e.pid})"
    if e.kind == "back":
        return f"{child.name} is back{f' ({e.what})' if e.what else ''}, {e.back_after_s:.1f} s after its restart"
    if e.kind == "rejoin":
        return (
            f"{child.name} (pid {e.pid}) exited {e.returncode} to start again empty (a rejoin); restarting it in "
            f"{e.restart_in_s:g} s"
        )
    tail = "\n".join("    " + line for line in child.log_tail(8).splitlines())
    if e.kind == "gave_up":
        return (
            f"{child.name} (pid {e.pid}) {describe_exit(e.returncode)}: {e.deaths} deaths within "
            f"{p.window_s:g} s, giving up and stopping everything; its last lines:\n{tail}"
        )
    return (
        f"{child.name} (pid {e.pid}) {describe_exit(e.returncode)}; the others keep running; restarting it in "
        f"{e.restart_in_s:g} s (death {e.deaths} of {(p.max_deaths or 0) - 1} allowed within {p.window_s:g} s); "
        f"its last lines:\n{tail}"
    )


def reporter(say: Callable[[str], None]) -> Callable[[Event], None]:
    """The supervisor's reports, said in make run's words."""
    return lambda e: say(sentence(e))


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

    from smartcache.devstack.child import Child  # noqa: PLC0415
    from smartcache.supervision import Signals, Supervisor, stop_in_order  # noqa: PLC0415

    signals = Signals().block()
    parser = argparse.ArgumentParser(prog="python -m smartcache.devstack.supervise")
    parser.add_argument("commands", nargs="+")
    parser.add_argument("--logs", type=Path, required=True, help="directory for the children's logs")
    parser.add_argument("--gap-s", type=float, default=0.0)
    parser.add_argument("--delay-s", type=float, default=RESTART.delay_s)
    parser.add_argument("--max-deaths", type=int, default=RESTART.max_deaths)
    parser.add_argument("--window-s", type=float, default=RESTART.window_s)
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
        policy = RestartPolicy(delay_s=a.delay_s, max_deaths=a.max_deaths, window_s=a.window_s)
        supervisor = Supervisor(report=reporter(say), policy=policy)
        for child in started:
            supervisor.add(child)
        return supervisor.run(signals)
    finally:
        stop_in_order(reversed(started), signals, say)


if __name__ == "__main__":
    raise SystemExit(main())
