"""smartcache-cli's coordination commands: inspect counters, registers, sequences, semaphores, latches, queues.

Mostly reads, for operators (who holds ``pay:c-7``, how many tasks wait in
``statements``); and the few writes an operator needs: reset a rate-limit
counter (``counter-cas``), free a permit of a holder known dead before its
lease ends (``semaphore-release``), open a latch (``latch-count-down``), put a
task by hand (``queue-put``). main.py wires them in; output and exit codes are
main.py's (one JSON object; 0 OK, 1 another status, 2 transport error).

Examples::

    smartcache-cli counter-get otp:client-7
    smartcache-cli counter-cas otp:client-7 5 0          # reset an attempt counter from 5 to 0
    smartcache-cli semaphore-get pay:client-7            # holders, tokens, lease left, waiters
    smartcache-cli semaphore-release pay:client-7 HOLDER
    smartcache-cli queue-stats statements
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from smartcache.client import Client, Reply

COMMANDS = frozenset(
    {
        "counter-get",
        "counter-add",
        "counter-cas",
        "register-get",
        "register-cas",
        "sequence-get",
        "semaphore-get",
        "semaphore-release",
        "latch-get",
        "latch-count-down",
        "queue-stats",
        "queue-put",
    }
)
Command = Callable[[str, str], argparse.ArgumentParser]
Data = Callable[..., None]


def _name(sp: argparse.ArgumentParser, what: str) -> None:
    sp.add_argument("name", help=f"the {what}'s name, e.g. otp:client-7 (1..256 bytes)")


def add_parsers(command: Command, data: Data) -> None:
    """The coordination subcommands; command(name, summary) and data(parser) are main.py's helpers."""
    _name(command("counter-get", "a counter's value, revision and time left"), "counter")
    ca = command("counter-add", "add to a counter (a negative delta takes off)")
    _name(ca, "counter")
    ca.add_argument("delta", type=int, nargs="?", default=1, help="how much to add (default 1)")
    ca.add_argument("--min", type=int, metavar="N", help="refuse (CONFLICT) a change below N")
    ca.add_argument("--max", type=int, metavar="N", help="refuse (CONFLICT) a change above N")
    ca.add_argument("--ttl-ms", type=int, metavar="MS", help="if this creates the counter, it lives MS ms")
    cc = command("counter-cas", "set a counter to VALUE if it is EXPECTED (absent counts as 0)")
    _name(cc, "counter")
    cc.add_argument("expected", type=int, help="the value it must have now")
    cc.add_argument("value", type=int, help="the value to set")

    _name(command("register-get", "a register's value and revision"), "register")
    rc = command("register-cas", "write a register's value, if its revision is --expected-rev")
    _name(rc, "register")
    data(rc)
    rc.add_argument("--expected-rev", type=int, metavar="REV", help="write only at revision REV (0: absent)")
    rc.add_argument("--ttl-ms", type=int, metavar="MS", help="the register expires MS ms after this write")

    _name(command("sequence-get", "the first id a sequence's next reservation gets"), "sequence")

    _name(command("semaphore-get", "who holds a semaphore or lock: holder, token, lease left; waiters"), "lock")
    sr = command("semaphore-release", "free a holder's permit now (a holder known dead, before its lease ends)")
    _name(sr, "lock")
    sr.add_argument("holder", help="the holder, as semaphore-get prints it")

    _name(command("latch-get", "a latch's count, initial count, time left and waiters"), "latch")
    lc = command("latch-count-down", "take N off a latch's count (never below 0)")
    _name(lc, "latch")
    lc.add_argument("--n", type=int, default=1, metavar="N", help="how much to take off (default 1)")

    _name(command("queue-stats", "tasks of a queue per state (ready, taken, delayed) and takers waiting"), "queue")
    qp = command("queue-put", "add a task to a queue")
    _name(qp, "queue")
    data(qp)
    qp.add_argument("--priority", type=int, metavar="P", help="0..255, 0 first (default 0)")
    qp.add_argument("--delay-ms", type=int, metavar="MS", help="ready only after MS ms")
    qp.add_argument("--ttl-ms", type=int, metavar="MS", help="deleted if not done within MS ms")


def run(c: Client, a: argparse.Namespace) -> Reply:
    match a.command:
        case "counter-get":
            return c.counter_get(a.name)
        case "counter-add":
            return c.counter_add(a.name, a.delta, min=a.min, max=a.max, ttl_ms=a.ttl_ms)
        case "counter-cas":
            return c.counter_cas(a.name, a.expected, a.value)
        case "register-get":
            return c.register_get(a.name)
        case "register-cas":
            return c.register_cas(a.name, a.data, expected_rev=a.expected_rev, ttl_ms=a.ttl_ms)
        case "sequence-get":
            return c.sequence_get(a.name)
        case "semaphore-get":
            return c.semaphore_get(a.name)
        case "semaphore-release":
            return c.semaphore_release(a.name, a.holder)
        case "latch-get":
            return c.latch_get(a.name)
        case "latch-count-down":
            return c.latch_count_down(a.name, a.n)
        case "queue-stats":
            return c.queue_stats(a.name)
        case "queue-put":
            return c.queue_put(a.name, a.data, priority=a.priority, delay_ms=a.delay_ms, ttl_ms=a.ttl_ms)
    raise AssertionError(a.command)
