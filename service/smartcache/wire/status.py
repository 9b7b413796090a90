"""The reply statuses and transport errors as enums: generated from proto/protocol.toml, do not edit.

``python -m smartcache.wire.gendoc --write`` writes this file; ``make lint`` fails when it differs
from the registry. Members are strings equal to their names (``Status.NOT_FOUND == "NOT_FOUND"``),
so ``reply.status == Status.NOT_FOUND`` and ``reply.status == "NOT_FOUND"`` are the same test;
``.code`` is the number on the wire (``reply.body["status"]``).
"""

from __future__ import annotations

from enum import StrEnum

from smartcache.wire.registry import REGISTRY


class Status(StrEnum):
    """A reply's data-level status (``Reply.status``). Statuses only storage uses are not here."""

    #: 0: Done; the body holds the reply fields.
    OK = "OK"
    #: 1: No such live record (missing or expired). For a session: the client ends it.
    NOT_FOUND = "NOT_FOUND"
    #: 2: Compare-and-set failed (the record's revision or value is not the expected one), or a bounded change
    #: or a task's attempt was refused; the reply carries the current state.
    CONFLICT = "CONFLICT"
    #: 3: A record with this key exists already.
    ALREADY_EXISTS = "ALREADY_EXISTS"
    #: 4: A body field is missing, of the wrong type or out of range; 'message' says which.
    BAD_REQUEST = "BAD_REQUEST"
    #: 5: The client holds max_sessions live sessions already and the limit's policy is refuse: nothing was
    #: created. The reply says nothing of the other sessions but the limit (max_sessions).
    LIMIT_REACHED = "LIMIT_REACHED"
    #: 6: The session is bound (created with a binding) and the request carried no binding or another one:
    #: nothing was done, nothing refreshed, and storage wrote a session.binding_mismatch event. The reply says
    #: nothing else of the session.
    BINDING_MISMATCH = "BINDING_MISMATCH"
    #: 14: Waited the whole timeout (or wait_ms) and what was awaited did not happen (record idle, permit free,
    #: latch open, task ready); body is an error object.
    TIMEOUT = "TIMEOUT"
    #: 20: The core backend failed or timed out; body is an error object.
    BACKEND_ERROR = "BACKEND_ERROR"
    #: 21: The core backend answered something unparsable; body is an error object.
    BACKEND_BAD_REPLY = "BACKEND_BAD_REPLY"
    #: 50: The events after the cursor were dropped with their day partition (retention); the reply carries
    #: oldest_seq, the oldest event kept: the reader rebuilds what it holds from its source of truth, then reads
    #: on from oldest_seq - 1.
    CURSOR_TOO_OLD = "CURSOR_TOO_OLD"
    #: 99: Not served; header transport_error and the error object say why.
    ERROR = "ERROR"
    #: a status code this client does not know (a newer service): ``reply.body["status"]`` has the number
    UNKNOWN = "UNKNOWN"

    @property
    def code(self) -> int:
        """The status code on the wire (-1 for UNKNOWN)."""
        return REGISTRY.statuses.get(self.value, -1)


class TransportError(StrEnum):
    """Why a message failed in delivery (``RequestError.transport_error``); 0 on the wire is no error."""

    #: 0: No transport error: the message was executed and the body is its answer.
    NONE = "NONE"
    #: 1: Header frame has the wrong size, reserved bits/byte set, or a non-zero transport_error from a client.
    BAD_HEADER = "BAD_HEADER"
    #: 2: Header version is not one the service speaks.
    UNSUPPORTED_VERSION = "UNSUPPORTED_VERSION"
    #: 3: Header system is not 1 (smartcache).
    UNKNOWN_SYSTEM = "UNKNOWN_SYSTEM"
    #: 4: Message type id is not in the registry or is internal.
    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    #: 5: Body frame is larger than max_body_bytes.
    BODY_TOO_LARGE = "BODY_TOO_LARGE"
    #: 6: Body is not a msgpack map with string keys within max_depth, or is truncated or has trailing bytes.
    BAD_BODY = "BAD_BODY"
    #: 7: Wrong number of frames (expected header and body).
    BAD_FRAMES = "BAD_FRAMES"
    #: 8: Queue full, or the message was evicted by a more urgent one, or it names a session and its connection
    #: had more NOT_FOUND answers about sessions in the last second than SMARTCACHE_NOT_FOUND_PER_PEER_PER_S
    #: allows (guessing: PROTOCOL.md 4). Retry later.
    QUEUE_FULL = "QUEUE_FULL"
    #: 9: Lifetime ended before the message was executed (in the queue, or refused by storage at a deadline that
    #: passed on the service's clock too); it was never executed.
    EXPIRED = "EXPIRED"
    #: 10: Not executed: no storage instance could take it (down, stalled, read-only, no leader this service can
    #: reach, disk or memory full, a storage clock that disagrees with the service's, a read of a key whose
    #: write still waited for its quorum at the deadline). Safe to retry, here or on another service instance.
    STORAGE_UNAVAILABLE = "STORAGE_UNAVAILABLE"
    #: 11: The service is stopping and takes no new messages; this one was not executed.
    SHUTTING_DOWN = "SHUTTING_DOWN"
    #: 12: Unexpected failure inside the service; the message names an error id that the service's log carries
    #: too.
    INTERNAL = "INTERNAL"
    #: 13: Sent to storage, and it may or may not have been applied: no result came back within the lifetime,
    #: the connection broke, or storage rolled back a synchronous write without its quorum or failed it in its
    #: WAL while a synchronous cluster's leader (a later leader may still confirm it). Retry only idempotent
    #: types, or writes that carry an idempotency_key.
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
    #: 14: The client's CURVE key may not send this message type (its permissions); nothing was done.
    FORBIDDEN = "FORBIDDEN"
    #: no reply within the client's timeout (the client's own; never on the wire)
    TIMEOUT = "TIMEOUT"

    @property
    def code(self) -> int:
        """The transport error code on the wire (-1 for TIMEOUT)."""
        return REGISTRY.transport_errors.get(self.value, -1)
