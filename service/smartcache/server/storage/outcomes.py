"""What a call's answer or failure means for the message, decided here, once: the client's retry
depends on it.

* not sent (no leader, no connection, instance stalled) or refused without
  effect (NOT_LEADER, read-only, disk or memory full: the procedure's
  transaction rolled back) -> :class:`StorageUnavailable`: not executed. A
  refusal by an instance that stopped leading is retried on the new leader
  while the message has time left;
* refused at the deadline -> :class:`DeadlineExceeded`: not executed. Only
  when our own clock agrees that the lifetime is over: otherwise the offset
  the deadline was sent with is wrong (the instance's wall clock jumped), and
  the call is sent again once the offset is measured again, or answered
  :class:`StorageUnavailable` if the clocks still disagree;
* a synchronous write rolled back (quorum timeout, ROLLBACK) ->
  :class:`OutcomeUnknown`: on Tarantool 2.6.0 the next leader may still
  confirm it;
* sent and then the connection broke -> :class:`OutcomeUnknown`;
* the procedure raised for another reason -> :class:`ProcedureError` (a bug).

:class:`Outcomes` also counts every call by procedure and outcome, with its latency, and logs
when writes start failing, change reason, and recover.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, NoReturn

import structlog
from asynctnt.exceptions import TarantoolDatabaseError, TarantoolError

from smartcache.server.metrics import Metrics, label
from smartcache.server.storage.instances import CANNOT_WRITE, Instance, maybe_applied
from smartcache.server.storage.procedures import WRITES
from smartcache.wire.errors import (
    DeadlineExceeded,
    NotLeader,
    OutcomeUnknown,
    ProcedureError,
    StorageUnavailable,
    WritesHeld,
)

log = structlog.get_logger("storage")

#: a write the leader held (WRITES_HELD) waits at most this long before it is sent again (the leader's
#: retry_after_ms is at most the synchronous timeout's margin, 0.25 s, plus a little)
HELD_WAIT_MAX_S = 0.5
#: how a statement refused inside a transaction for that reason begins (lua/smartcache/quorum.lua HELD_PREFIX)
HELD_PREFIX = "writes held:"


class Outcomes:
    """What each call's answer or failure means (the module docstring), counted and logged."""

    def __init__(self, *, metrics: Metrics, lost: Callable[[Instance], None]) -> None:
        """lost(instance): the connection to it broke during a call (Leadership.lost)."""
        self._metrics = metrics
        self._lost = lost
        self._calls: dict[tuple[str, str], Any] = {}
        self._latency: dict[str, Any] = {}
        #: why writes fail right now (None: they don't), and how many failed since
        self._write_failure: str | None = None
        self._write_failures = 0

    def failed(self, instance: Instance, procedure: str, e: BaseException, started: float) -> NoReturn:
        """The call sent at ``started`` (perf_counter) raised: say what that means for the message (see the
        module docstring)."""
        seconds = time.perf_counter() - started
        if isinstance(e, TarantoolDatabaseError):
            reason = CANNOT_WRITE.get(e.code)
            maybe = maybe_applied(e.code, instance.role.get("role"))
            if maybe is not None:
                self.observe(procedure, "unknown", seconds)
                self._write_failed(maybe)
                raise OutcomeUnknown(
                    f"{procedure}: the synchronous write failed on {instance.address} ({e.message}); "
                    "it may be on the followers, and a later leader may still confirm it"
                ) from e
            if reason == "read_only" and str(e.message).startswith(HELD_PREFIX):
                self.observe(procedure, "held", seconds)
                self._write_failed("writes_held")
                raise WritesHeld(f"{procedure}: {instance.address}: {e.message}", HELD_WAIT_MAX_S / 5) from e
            if reason is None:
                self.observe(procedure, "error", seconds)
                raise ProcedureError(f"{procedure}: {e}") from e
            self.observe(procedure, "unavailable", seconds)
            self._write_failed(reason)
            if reason == "read_only":
                raise NotLeader(f"{procedure}: {instance.address} is read-only") from e
            raise StorageUnavailable(f"{procedure}: storage cannot write ({reason.replace('_', ' ')})") from e
        if isinstance(e, TimeoutError | TarantoolError | OSError):
            self.observe(procedure, "unknown", seconds)
            self._lost(instance)
            raise OutcomeUnknown(f"{procedure}: connection to {instance.address} lost: {type(e).__name__}") from e
        self.observe(procedure, "cancelled" if isinstance(e, asyncio.CancelledError) else "error", seconds)
        raise e

    def result(self, instance: Instance, procedure: str, result: dict[str, Any], started: float) -> dict[str, Any]:
        """The answer to the call sent at ``started`` (perf_counter): returned, or the refusal it is raised as."""
        outcome = result.get("status", "error")
        self.observe(procedure, outcome, time.perf_counter() - started)
        if outcome == "NOT_LEADER":
            self._write_failed("not_leader")
            raise NotLeader(f"{procedure}: {instance.address} may not write now (no leader lease)")
        if outcome == "DEADLINE_EXCEEDED":
            raise DeadlineExceeded(f"{procedure}: storage got the call after the message's deadline")
        if outcome == "WRITES_HELD":
            self._write_failed("writes_held")
            raise WritesHeld(
                f"{procedure}: {instance.address} holds writes for a moment (a synchronous rollback may be near)",
                result.get("retry_after_ms", 0) / 1000,
            )
        if outcome == "WRITE_PENDING":
            raise StorageUnavailable(
                f"{procedure}: a write of this key still waited for its quorum at the deadline (no dirty read)"
            )
        if self._write_failure is not None and procedure in WRITES:
            log.info("storage_writes_recovered", address=instance.address, failed=self._write_failures)
            self._write_failure, self._write_failures = None, 0
        return result

    def _write_failed(self, reason: str) -> None:
        """Count a failed write (refused, or rolled back); log once per change of reason, never with the
        call's data."""
        self._write_failures += 1
        if reason != self._write_failure:
            self._write_failure = reason
            log.warning("storage_writes_failing", reason=reason)
        self._metrics.storage_write_failures.labels(reason).inc()

    def observe(self, procedure: str, outcome: str, seconds: float) -> None:
        """Count one call by procedure and outcome, and its latency."""
        key = (procedure, outcome)
        counter = self._calls.get(key)
        if counter is None:
            counter = self._calls[key] = self._metrics.storage_calls.labels(procedure, label(outcome))
        counter.inc()
        hist = self._latency.get(procedure)
        if hist is None:
            hist = self._latency[procedure] = self._metrics.storage_latency.labels(procedure)
        hist.observe(seconds)
