"""The deadline budget: every margin and period that decides who answers a message near its end.

A message lives until its deadline ``D`` (the header's ``lifetime_ms``, else
its type's, capped by the registry's ``max_lifetime_ms``). The broker turns
it into a monotonic deadline when it arrives and hands the worker the
milliseconds left (the ticket); the worker's :class:`~smartcache.server.job.Job`
holds it on its own loop's clock, and storage gets it on the instance's
wall clock with every call (``meta``, lua/smartcache/api.lua). Around ``D``,
several parties may answer, and exactly one must. They are ordered so that
the one that knows most answers first::

    D - HANDLER_WAIT_MARGIN_S   a waiting handler (coordination, prewarm) stops and answers its own TIMEOUT
    D - LUA_WAIT_MARGIN_S       storage stops a waiting procedure (the backstop for the line above)
    D - STORAGE_ANSWER_MARGIN_S the service stops waiting for a leader: STORAGE_UNAVAILABLE (not executed)
    D - LUA_ANSWER_MARGIN_S     storage stops waiting for a key's pending write: WRITE_PENDING
    D                           storage refuses a call that arrives now: DEADLINE_EXCEEDED (not executed)
    D + DEADLINE_SWEEP_S        the worker cancels the task: EXPIRED, or OUTCOME_UNKNOWN if storage had it
    D + WATCHDOG_GRACE_S        the broker's watchdog answers OUTCOME_UNKNOWN and takes the slot back

The Lua values are read from lua/smartcache/config.lua by
tests/unit/test_deadlines.py, which asserts every order stated here.

Shutdown has a budget of its own: the broker drains for ``drain_timeout_s``
(a setting); then each part gets ``STOP_GRACE_S`` to end its tasks, and the
process waits ``JOIN_MARGIN_S`` for each thread beyond that.
"""

from __future__ import annotations

#: a waiting handler (coordination waits, a prewarm fetch or wait) stops this long before the deadline,
#: so that it answers its own TIMEOUT (or BACKEND_ERROR) instead of being cancelled by the sweep
HANDLER_WAIT_MARGIN_S = 0.01
#: storage's waiting procedures stop this long before the deadline they are given (lua config WAIT_MARGIN_MS)
LUA_WAIT_MARGIN_S = 0.005
#: a wait for a leader ends this long before the deadline, so that its STORAGE_UNAVAILABLE comes
#: before the worker's deadline sweep answers EXPIRED
STORAGE_ANSWER_MARGIN_S = 0.05
#: storage's wait for a key's pending synchronous write ends this long before the deadline
#: (lua config ANSWER_MARGIN_S), so that its WRITE_PENDING reaches the service while the message lives
LUA_ANSWER_MARGIN_S = 0.05
#: the worker cancels the tasks whose deadline passed this often (one timer per loop, not one per call)
DEADLINE_SWEEP_S = 0.02
#: the broker's watchdog looks for slots held past their deadline this often...
WATCHDOG_PERIOD_S = 0.25
#: ...and answers and takes back a slot whose worker has not answered this long after the deadline
WATCHDOG_GRACE_S = 1.0
#: a call made without a message (cleanup, settling a prewarm lease) waits this long for a leader
NO_DEADLINE_WAIT_S = 2.0

#: at stop, the broker's loop, each worker and the publisher get this long to end their tasks
STOP_GRACE_S = 5.0
#: the process waits this much beyond each part's own budget for its thread to end
JOIN_MARGIN_S = 10.0
