"""The signals a supervisor waits for, taken synchronously (``sigtimedwait``): never a handler.

``Signals.block()`` blocks SIGINT, SIGTERM and SIGCHLD (and SIGHUP when asked) before any thread
or child exists (every thread inherits the mask; a `Child` gets an empty one), and the main loop
takes them with ``sigtimedwait``: a SIGINT or SIGTERM stops, a SIGCHLD wakes the loop at once to
look at its children, a SIGHUP is counted for the loop to pass on. This replaced a
``signal.signal`` handler that called ``threading.Event.set()``: the Event's lock is a plain
(non-reentrant) Lock, and Python runs a handler in the main thread between two bytecodes, so a
Ctrl-C landing while the main thread was inside that same Event's ``wait()`` ran ``set()`` with
the lock already held by itself: a futex wait forever, every further SIGINT and SIGTERM running
the same handler into the same wait, and the children left running (CPython documents that
signal handlers must not use threading's locks; reproduced in
tests/integration/test_supervise.py).
"""

from __future__ import annotations

import signal
import time

#: the signals that stop a supervisor
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})
#: how long a wait lasts when no timeout is given
POLL_S = 0.2


class Signals:
    """SIGINT/SIGTERM/SIGCHLD (and SIGHUP with reload=True) taken by sigtimedwait; what a supervisor waits on."""

    def __init__(self, *, reload: bool = False) -> None:
        self._taken = {*STOP_SIGNALS, signal.SIGCHLD, *([signal.SIGHUP] if reload else [])}
        #: SIGINT and SIGTERM received so far (the first stops; a second while stopping kills the rest)
        self.count = 0
        self.first: int | None = None
        #: SIGHUPs received and not yet taken by take_reloads
        self.reloads = 0

    def block(self) -> Signals:
        """Block the signals in this thread (and in every thread started after this)."""
        signal.pthread_sigmask(signal.SIG_BLOCK, self._taken)
        return self

    def _take(self, timeout_s: float) -> int | None:
        info = signal.sigtimedwait(self._taken, max(0.0, timeout_s))
        if info is None:
            return None
        if info.si_signo in STOP_SIGNALS:
            self.count += 1
            self.first = self.first or info.si_signo
        elif info.si_signo == signal.SIGHUP:
            self.reloads += 1
        return info.si_signo

    def wait(self, timeout: float | None = None) -> bool:
        """True once SIGINT or SIGTERM came; else waits up to timeout, returning False early on another signal."""
        if self.count:
            return True
        deadline = time.monotonic() + (POLL_S if timeout is None else timeout)
        got = self._take(deadline - time.monotonic())
        return bool(self.count) if got is None or got not in STOP_SIGNALS else True

    def pause(self, timeout_s: float) -> None:
        """Sleep up to timeout_s, counting any signal that comes; any of them ends it early."""
        self._take(timeout_s)

    def is_set(self) -> bool:
        """Whether a SIGINT or SIGTERM came (pending ones are taken now)."""
        while self._take(0) is not None:
            pass
        return bool(self.count)

    def take_reloads(self) -> int:
        """The SIGHUPs received since the last call."""
        n, self.reloads = self.reloads, 0
        return n
