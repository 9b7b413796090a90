"""One process supervisor, for make run (smartcache.devstack) and ``smartcache --processes N`` (the server).

Children started by us, stopped by their PID, gone when we are (``PR_SET_PDEATHSIG``): child.py.
Restarted after a death by a policy (a fixed delay, or one that doubles while the child dies young;
giving up after repeated quick deaths, or never), every death and return reported as an `Event`
for the caller to word; stopped in an order, or together: supervisor.py. Signals taken by
``sigtimedwait``, never by a handler: signals.py.

It imports nothing else of smartcache: the server may use it, and make run's stack builds on it.

Why no library: docs/development.md ("The process supervisor") says what was looked at (supervisor,
circus, honcho) and why each was a poor fit.
"""

from smartcache.supervision.child import STOP_TIMEOUT_S, Child, die_with_parent
from smartcache.supervision.signals import POLL_S, STOP_SIGNALS, Signals
from smartcache.supervision.supervisor import (
    REJOIN_EXIT_CODE,
    Event,
    RestartPolicy,
    Supervisor,
    describe_exit,
    stop_in_order,
    stop_together,
)

__all__ = [
    "POLL_S",
    "REJOIN_EXIT_CODE",
    "STOP_SIGNALS",
    "STOP_TIMEOUT_S",
    "Child",
    "Event",
    "RestartPolicy",
    "Signals",
    "Supervisor",
    "describe_exit",
    "die_with_parent",
    "stop_in_order",
    "stop_together",
]
