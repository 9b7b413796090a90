"""Every exception smartcache raises on purpose.

::

    SmartcacheError
    ├── ProtocolError            a frame could not be decoded (carries transport_error)
    │   ├── BadHeader
    │   ├── UnsupportedVersion
    │   ├── UnknownSystem
    │   ├── UnknownType
    │   ├── BodyTooLarge
    │   └── BadBody
    ├── RequestError             the service answered with a transport error (client side)
    │   └── RequestTimeout       no reply within the client's timeout
    ├── CoordinationError        a coordination helper got an answer it cannot use (client side)
    │   ├── NotAcquired          no permit within the wait
    │   └── LeaseLost            a lease passed before its holder was done
    ├── CursorTooOld             a subscriber's events were dropped by retention (client side)
    ├── StorageError             Tarantool failed
    │   ├── StorageUnavailable   not executed: no connection, stalled, no leader, cannot write
    │   │   ├── NotLeader        not executed: the instance may not write now
    │   │   └── WritesHeld       not executed: the leader holds writes for a moment (a rollback near)
    │   ├── DeadlineExceeded     not executed: storage got the call after its deadline
    │   ├── OutcomeUnknown       sent, and maybe executed: no answer, or a synchronous rollback
    │   └── ProcedureError       a stored procedure raised (a bug or misuse)
    └── BackendError             the core backend failed
        └── BackendBadReply      it answered something unparsable

Exceptions from zmq, msgpack and the Tarantool connector are translated at the
edge of each layer, with ``raise ... from e``; nothing else leaks out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from smartcache.wire.layout import Header


class SmartcacheError(Exception):
    """Root of all smartcache exceptions."""


class ProtocolError(SmartcacheError):
    """A frame could not be decoded.

    ``transport_error`` names the transport error (registry) to answer with;
    ``header`` is the decoded header when the failure came after it, so the
    sender can still be answered with its request id. Callers answer or drop
    and count; they never crash.
    """

    transport_error = "INTERNAL"

    def __init__(self, message: str, *, header: Header | None = None) -> None:
        super().__init__(message)
        self.header = header


class BadHeader(ProtocolError):
    """Header has the wrong size, reserved bits set, or an unknown transport error."""

    transport_error = "BAD_HEADER"


class UnsupportedVersion(ProtocolError):
    """Header version is not one this codec speaks."""

    transport_error = "UNSUPPORTED_VERSION"


class UnknownSystem(ProtocolError):
    """Header addresses a system other than smartcache."""

    transport_error = "UNKNOWN_SYSTEM"


class UnknownType(ProtocolError):
    """Header message type is not in the registry."""

    transport_error = "UNKNOWN_TYPE"


class BodyTooLarge(ProtocolError):
    """Body frame is longer than the allowed maximum."""

    transport_error = "BODY_TOO_LARGE"


class BadBody(ProtocolError):
    """Body is not valid msgpack, not a map, too deep, or has non-string keys."""

    transport_error = "BAD_BODY"


class RequestError(SmartcacheError):
    """The service answered with a non-zero transport error.

    Raised by the client library. ``transport_error`` is the registry name
    (``QUEUE_FULL``, ``EXPIRED``...; compare with ``smartcache.TransportError``),
    ``body`` the error object, and ``type_name``, ``request_id`` and
    ``endpoint`` say which request to which service it answers (the message
    names them too). QUEUE_FULL, EXPIRED, STORAGE_UNAVAILABLE and SHUTTING_DOWN
    mean it was not executed: worth a retry later (``retries=`` does it).
    """

    def __init__(
        self,
        transport_error: str,
        message: str,
        body: dict[str, Any] | None = None,
        *,
        type_name: str | None = None,
        request_id: int | None = None,
        endpoint: str | None = None,
    ) -> None:
        super().__init__(transport_error, message)
        self.transport_error = transport_error
        self.message = message
        self.body = body or {}
        self.type_name = type_name
        self.request_id = request_id
        self.endpoint = endpoint

    def located(self, type_name: str | None, request_id: int | None, endpoint: str) -> RequestError:
        """The same error, saying which request to which service it answers (the client calls it)."""
        self.type_name, self.request_id, self.endpoint = type_name, request_id, endpoint
        return self

    def __str__(self) -> str:
        where = []
        if self.type_name is not None:
            where.append(self.type_name)
        if self.request_id is not None:
            where.append(f"request {self.request_id}")
        if self.endpoint is not None:
            where.append(f"to {self.endpoint}")
        return f"{self.transport_error}: {self.message}" + (f" ({' '.join(where)})" if where else "")


class RequestTimeout(RequestError):
    """No reply arrived within the client's timeout; the request may still run (or have run)."""

    def __init__(
        self,
        message: str,
        *,
        type_name: str | None = None,
        request_id: int | None = None,
        endpoint: str | None = None,
    ) -> None:
        super().__init__("TIMEOUT", message, type_name=type_name, request_id=request_id, endpoint=endpoint)


class CoordinationError(SmartcacheError):
    """A coordination helper (service/smartcache/client/coordination.py) got a status it cannot turn into a value.

    ``status`` is the status name, ``body`` the reply. BAD_REQUEST means the
    arguments are wrong: fix the call.
    """

    def __init__(self, status: str, message: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.body = body or {}


class NotAcquired(CoordinationError):
    """No permit of the semaphore (or the lock) became free within the wait; nothing is held. Try later."""


class LeaseLost(CoordinationError):
    """The lease passed before the holder released it (renewals failed, or the process stalled): someone
    else may have held the permit meanwhile. Work done under it may have overlapped; resources that check
    the fencing token refuse the old holder."""


class CursorTooOld(SmartcacheError):
    """The events after a subscriber's cursor were dropped with their day partition (retention).

    Raised by a subscription (service/smartcache/client/subscriber.py) instead of skipping them silently. What the
    subscriber holds may be stale: rebuild it from the source of truth, then subscribe again from
    ``oldest_seq``.
    """

    def __init__(self, cursor: int, oldest_seq: int) -> None:
        super().__init__(f"CURSOR_TOO_OLD: events after {cursor} were dropped; the oldest kept is {oldest_seq}")
        self.cursor = cursor
        self.oldest_seq = oldest_seq


class StorageError(SmartcacheError):
    """Tarantool failed; see subclasses."""


class StorageUnavailable(StorageError):
    """The call was not executed: no connection, a stalled instance, no leader this service can reach
    (none elected in time, or one that only this service cannot reach), one that cannot write
    (read-only, disk or memory full; the procedure's transaction rolled back), or an instance whose
    wall clock disagrees with ours about a deadline that has not passed here.

    Answer STORAGE_UNAVAILABLE (safe to retry, here or on another service instance); the connection
    recovers by itself.
    """


class NotLeader(StorageUnavailable):
    """The instance answered NOT_LEADER: it may not write now, and did nothing.

    The service looks for the leader again; the client gets STORAGE_UNAVAILABLE if none is found in time.
    """


class WritesHeld(StorageUnavailable):
    """The leader refused the write for a moment (WRITES_HELD, or a statement refused with the
    "writes held:" prefix): the oldest synchronous write in flight nears its timeout, and on Tarantool
    2.6.0 a write that entered the limbo while that rollback was written would be rolled back on the
    leader only. Nothing was done.

    The service sends the call again to the same leader after ``retry_after_s`` (it still leads), while
    the message has time; the client gets STORAGE_UNAVAILABLE only if it has none left.
    """

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(StorageError):
    """Storage received the call after the message's deadline, our clock agrees, and nothing was done:
    answer EXPIRED."""


class OutcomeUnknown(StorageError):
    """The call was sent and may have been applied: its answer never came (connection lost), or the
    leader rolled the synchronous write back (quorum timeout, ROLLBACK), which Tarantool 2.6.0 does not
    make definitive: a leader that dies before its ROLLBACK replicates may see the next leader confirm it.

    Answer OUTCOME_UNKNOWN; only idempotent messages, or writes with an idempotency key, are safe to retry.
    """


class ProcedureError(StorageError):
    """A stored procedure raised: a bug or a misuse, answered INTERNAL."""


class BackendError(SmartcacheError):
    """The core backend failed or timed out after the allowed retries.

    Answered with status BACKEND_ERROR and DATA_ERROR; the prewarm lease is
    released (``fail``) so the next asker tries again.
    """

    status = "BACKEND_ERROR"


class BackendBadReply(BackendError):
    """The core backend answered, but not with parsable JSON: BACKEND_BAD_REPLY, not retried."""

    status = "BACKEND_BAD_REPLY"
