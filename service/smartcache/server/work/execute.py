"""One message, from its body to its answer: decode, validate, run the handler, build the reply.

No sockets: the worker feeds it jobs and sends what it returns, and unit
tests call :func:`execute` directly (tests/unit/test_execute.py). It returns an :class:`Answer` or
raises; the worker turns a raise (and a cancelled task) into a transport
error, so every message gets exactly one answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import structlog

from smartcache.server.handlers import Context, Handler, Request
from smartcache.server.job import Job
from smartcache.server.metrics import label
from smartcache.wire import (
    FLAG_DATA_ERROR,
    NO_SESSION,
    REGISTRY,
    STATUS,
    MessageSpec,
    decode_body,
    encode_body,
    frame_flags,
    trusted_header,
    with_flags,
    with_session,
)
from smartcache.wire.errors import DeadlineExceeded, OutcomeUnknown, ProtocolError, StorageUnavailable

log = structlog.get_logger("execute")
_STORAGE_ONLY = REGISTRY.storage_only_statuses
_DATA_ERROR = REGISTRY.data_error_statuses
#: types about sessions that may name none in the header (a create, a list, log out everywhere): refused too
#: while the service's session key is not the cluster's
_SESSION_TYPES = frozenset(name for name in REGISTRY.types if name.startswith("SESSION_"))
#: types whose NOT_FOUND says the session they name is not live (SESSION_DELETE: by header id or by handle)
_MISS_TYPES = frozenset({"SESSION_GET", "SESSION_TOUCH", "SESSION_UPDATE", "SESSION_DELETE", "SESSION_ROTATE"})
#: a cache type's NOT_FOUND says so only with this message (a live session's missing key has none)
_NOT_LIVE = "session is not live"
#: a session's binding, in bytes (proto/protocol.toml [limits.binding])
BINDING_MIN_BYTES, BINDING_MAX_BYTES = 1, 256


class Answer(NamedTuple):
    """What to send for one message: reply frames, or a transport error the broker answers with.

    (A NamedTuple: one is made per message, and a frozen dataclass costs several times more to build.)
    """

    #: outcome name for the metrics: a status or a transport error
    outcome: str
    frames: tuple[bytes, bytes] | None = None
    #: transport error name and message, when the message failed in delivery
    error: str | None = None
    message: str = ""
    #: the reply says a session the request named is not live (the NOT_FOUND throttle counts it)
    miss: bool = False


def failure(error: str, message: str) -> Answer:
    return Answer(outcome=error, error=error, message=message)


async def execute(job: Job, context: Context, handlers: Mapping[str, Handler], max_body_bytes: int) -> Answer:
    """Run one message; storage failures become the transport error that says what happened."""
    header = trusted_header(job.header)  # the broker validated it
    spec = REGISTRY.types_by_id[header.type]
    try:
        body = decode_body(job.body, max_bytes=max_body_bytes)
    except ProtocolError as e:
        context.metrics.bad_input.labels(label(e.transport_error)).inc()
        return failure(e.transport_error, str(e))
    problem = spec.check_request(body) or _session_problem(spec.session, header.session_id) or _binding_problem(body)
    if problem is not None:
        return reply(job.header, spec, {"status": "BAD_REQUEST", "message": problem})
    sessions = context.sessions
    if sessions.refusal is not None and (header.session_id != NO_SESSION or spec.name in _SESSION_TYPES):
        return failure("STORAGE_UNAVAILABLE", sessions.refusal)  # another key than the cluster's: not executed
    # The stored id, before any storage call: the header's raw id goes no further (issue 37).
    req = Request(header=header, body=body, job=job, session=sessions.stored(header.session_id))
    try:
        result = await handlers[spec.name](req, context)
    except StorageUnavailable as e:
        return failure("STORAGE_UNAVAILABLE", str(e))
    except DeadlineExceeded as e:
        return failure("EXPIRED", f"lifetime ended before storage could execute it: {e}")
    except OutcomeUnknown as e:
        return failure("OUTCOME_UNKNOWN", str(e))
    answer = reply(job.header, spec, result, req.reply_session)
    if answer.outcome == "NOT_FOUND" and (
        spec.name in _MISS_TYPES or (req.session and result.get("message") == _NOT_LIVE)
    ):
        return answer._replace(miss=True)
    return answer


def reply(header_frame: bytes, spec: MessageSpec, result: dict[str, Any], session: bytes | None = None) -> Answer:
    """The reply to a request from a handler's result map (``status`` a name; replaced by its code).

    The reply header is the request's with the reply's flags: DATA_ERROR for
    statuses that carry an error object. A type that creates sessions
    answers with the created one on OK, and a zero session id otherwise.
    """
    status = result["status"]
    if status in _STORAGE_ONLY:
        raise ValueError(f"{spec.name}: storage status {status} must not reach a client")
    result["status"] = STATUS[status]
    if status in _DATA_ERROR:
        result.setdefault("error", status)
        result.setdefault("message", status)
        flags = FLAG_DATA_ERROR
    else:
        flags = 0
    frame = header_frame
    if spec.creates_session:
        frame = with_session(frame, session if status == "OK" and session is not None else NO_SESSION)
    if flags != frame_flags(frame):
        frame = with_flags(frame, flags)
    log.debug("request_done", type=spec.name, status=status)  # a no-op below DEBUG (filtering logger)
    return Answer(outcome=status, frames=(frame, encode_body(result)))


def _binding_problem(body: dict[str, Any]) -> str | None:
    """A binding reaches storage as its SHA-256, so its length is checked here (storage sees 64 characters)."""
    value = body.get("binding")
    if value is not None and not BINDING_MIN_BYTES <= len(value.encode()) <= BINDING_MAX_BYTES:
        return f"binding must be a string of {BINDING_MIN_BYTES}..{BINDING_MAX_BYTES} bytes"
    return None


def _session_problem(rule: str, session_id: bytes) -> str | None:
    if rule == "required" and session_id == NO_SESSION:
        return "header session_id is required for this type"
    if rule == "none" and session_id != NO_SESSION:
        return "header session_id must be zero for this type"
    return None
