"""A message in progress in a worker slot, and how code deep in a handler finds it.

The worker makes one :class:`Job` per message it is given and runs the
message's task with the job in :data:`current_job` (a context variable:
each asyncio task has its own copy). Storage reads it to send the message's
deadline with every stored procedure call, and records on it whether a call
reached storage, which decides what an unfinished message is answered:
``EXPIRED`` (never executed) or ``OUTCOME_UNKNOWN`` (maybe executed).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(slots=True, eq=False)
class Job:
    """One message taken by a worker slot."""

    ticket: bytes
    header: bytes
    body: bytes
    #: loop time (monotonic seconds) at which the message's lifetime ends
    deadline: float
    #: the same deadline in wall-clock milliseconds (storage gets it on its own clock: plus its offset)
    deadline_ms: float
    #: stored procedure calls handed to the connection, and those that came back (answer or error)
    sent: int = 0
    returned: int = 0

    @property
    def reached_storage(self) -> bool:
        """Some call was sent: the message may have changed data."""
        return self.sent > 0


current_job: ContextVar[Job | None] = ContextVar("smartcache_job", default=None)
