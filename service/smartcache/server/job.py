"""A message in progress in a worker slot: what every layer below the broker knows of it.

The worker makes one :class:`Job` per message it is given (its ticket and
frames, its deadline on the worker loop's clock), the handler gets it inside
its :class:`~smartcache.server.handlers.Request`, and passes it to every
stored procedure call (``storage.call(..., job=req.job)``). Storage sends the
deadline with the call and counts on the job the calls it sent and those that
came back, which decides what an unfinished message is answered: ``EXPIRED``
(never executed) or ``OUTCOME_UNKNOWN`` (maybe executed).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, eq=False)
class Job:
    """One message taken by a worker slot."""

    ticket: bytes
    header: bytes
    body: bytes
    #: loop time (monotonic seconds) at which the message's lifetime ends
    deadline: float
    #: stored procedure calls handed to the connection, and those that came back (answer or error)
    sent: int = 0
    returned: int = 0

    @property
    def reached_storage(self) -> bool:
        """Some call was sent: the message may have changed data."""
        return self.sent > 0
