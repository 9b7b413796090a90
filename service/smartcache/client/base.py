"""What every client call shares: session ids, the reply, request frames, and the retry policy.

Retries (``retries=N`` on a client, default 0): a request refused without
being executed (QUEUE_FULL, EXPIRED, STORAGE_UNAVAILABLE, SHUTTING_DOWN) is
sent again, after a short backoff, up to N times. One whose outcome is
unknown (OUTCOME_UNKNOWN, INTERNAL, no reply in time) is sent again only when
repeating it is safe: the type is idempotent, or the request carries an
``idempotency_key``. With retries on, every write without a key gets one (a
random UUID, the same for all its attempts), so storage applies it once
however often it is sent. Both sets come from the registry.
"""

from __future__ import annotations

import types
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from smartcache.wire import (
    FLAG_DATA_ERROR,
    FLAG_NO_REPLY,
    HEADER_STRUCT,
    NO_SESSION,
    REGISTRY,
    Header,
    decode_body,
    decode_header,
    encode_body,
    encode_header,
    frame_request_id,
)
from smartcache.wire.errors import ProtocolError, RequestError
from smartcache.wire.sessionkeys import is_handle
from smartcache.wire.status import Status

DEFAULT_TIMEOUT_S = 5.0
RETRY_BACKOFF_FIRST_S = 0.02
RETRY_BACKOFF_MAX_S = 0.5
#: transport errors that say the request was not executed (and was not malformed): always safe to send again
RETRY_ALWAYS = frozenset(e for e, done in REGISTRY.executed.items() if done == "no") - REGISTRY.final_errors
#: outcomes that may have been executed: safe to send again only for idempotent requests
RETRY_IF_IDEMPOTENT = frozenset(e for e, done in REGISTRY.executed.items() if done == "unknown") | {"TIMEOUT"}

#: a session id as the client takes it: a UUID, its text, or 16 raw bytes (never a handle: PROTOCOL.md 4)
SessionId = bytes | uuid.UUID | str
_CLIENT_STATUSES = frozenset(s.value for s in Status)


def session_bytes(sid: SessionId | None) -> bytes:
    """Accept a UUID, its string form, or 16 raw bytes; None is 'no session'. A handle is refused with a
    ValueError that says so: it names a session, it is not its id (PROTOCOL.md 4)."""
    if sid is None:
        return NO_SESSION
    if isinstance(sid, uuid.UUID):
        return sid.bytes
    if isinstance(sid, str):
        if is_handle(sid):
            raise ValueError(
                f"{sid!r} is a session handle, not a session id: a handle names a session in lists and events "
                "and is never sent as its id (end that session with session_delete(handle=..., client_id=...))"
            )
        return uuid.UUID(sid).bytes
    if len(sid) != 16:
        raise ValueError(f"session id must be 16 bytes, got {len(sid)}")
    return sid


@dataclass(frozen=True, slots=True)
class Reply:
    """A decoded reply: the header and the body map."""

    header: Header
    body: dict[str, Any]
    #: answered from the client's near cache, with no round trip (the header is the kept reply's)
    near: bool = False

    @property
    def status(self) -> Status:
        """The reply's status: ``Status.OK``, ``Status.NOT_FOUND``... (equal to its name as a string;
        ``body["status"]`` keeps the code that came on the wire)."""
        name = REGISTRY.status_names.get(self.body.get("status", -1))
        return Status(name) if name in _CLIENT_STATUSES else Status.UNKNOWN

    @property
    def ok(self) -> bool:
        """The status is OK."""
        return self.status is Status.OK

    @property
    def data_error(self) -> bool:
        """The body is an error object (``error``, ``message``): the header's DATA_ERROR flag."""
        return bool(self.header.flags & FLAG_DATA_ERROR)

    @property
    def session_id(self) -> uuid.UUID | None:
        """The session id the header carries (SESSION_CREATE's new session; None for zero). Session ids
        travel in the header, never in the body."""
        sid = self.header.session_id
        return None if sid == NO_SESSION else uuid.UUID(bytes=sid)

    @property
    def handle(self) -> str | None:
        """The session's handle (SESSION_CREATE's and SESSION_ROTATE's reply body; None elsewhere): the
        non-secret name events, SESSION_LIST and SESSION_DELETE by handle use for it (PROTOCOL.md 4)."""
        value = self.body.get("handle")
        return value if isinstance(value, str) else None


def decode_reply(frames: list[bytes]) -> Reply:
    if frames and frames[0] == b"":  # REQ-style empty delimiter
        frames = frames[1:]
    if len(frames) != 2:
        raise RequestError("BAD_FRAMES", f"reply has {len(frames)} frames, expected 2")
    try:
        reply = Reply(decode_header(frames[0], check_type=False), decode_body(frames[1]))
    except ProtocolError as e:
        raise RequestError(e.transport_error, f"undecodable reply: {e}") from e
    if reply.header.transport_error:
        name = REGISTRY.transport_error_names[reply.header.transport_error]
        raise RequestError(name, str(reply.body.get("message", "")), reply.body)
    return reply


def is_write(type_name: str) -> bool:
    """A type that changes data: it takes an idempotency_key (registry)."""
    return any(f.name == "idempotency_key" for f in REGISTRY.types[type_name].request)


def retryable(error: RequestError, type_name: str, body: Mapping[str, Any] | None) -> bool:
    if error.transport_error in RETRY_ALWAYS:
        return True
    if error.transport_error not in RETRY_IF_IDEMPOTENT:
        return False
    return REGISTRY.types[type_name].idempotent or bool(body and body.get("idempotency_key"))


def with_key(type_name: str, body: Mapping[str, Any] | None, retries: int) -> Mapping[str, Any] | None:
    """With retries on, a write gets an idempotency key for all its attempts."""
    if retries and is_write(type_name) and not (body and body.get("idempotency_key")):
        return {**(body or {}), "idempotency_key": uuid.uuid4().hex}
    return body


def backoff_s(attempt: int) -> float:
    return float(min(RETRY_BACKOFF_MAX_S, RETRY_BACKOFF_FIRST_S * 2**attempt))


def request_frames(
    type_name: str,
    body: Mapping[str, Any] | None,
    *,
    request_id: int,
    session_id: SessionId | None,
    lifetime_ms: int,
    no_reply: bool,
) -> list[bytes]:
    spec = REGISTRY.types[type_name]
    header = Header.request(
        spec.id,
        request_id=request_id,
        session_id=session_bytes(session_id),
        lifetime_ms=lifetime_ms,
        flags=FLAG_NO_REPLY if no_reply else 0,
    )
    clean = {k: v for k, v in (body or {}).items() if v is not None}
    return [encode_header(header), encode_body(clean)]


def request_id_of(frames: list[bytes]) -> int:
    """Best-effort request id of an undecodable reply (0 when even that fails)."""
    for f in frames:
        if len(f) == HEADER_STRUCT.size:
            return frame_request_id(f)
    return 0


F = TypeVar("F", bound=Callable[..., Any])


def sends(type_name: str, note: str = "") -> Callable[[F], F]:
    """A typed call of message type ``type_name``: its docstring is the registry's own words for the
    type, its statuses and reply fields (so help() and the spec say the same), plus ``note``."""
    spec = REGISTRY.types[type_name]
    fields = ", ".join(f.name for f in spec.reply) or "none"
    statuses = ", ".join(spec.statuses)

    def document(fn: F) -> F:
        parts = [f"{type_name}: {spec.doc}"]
        if note:
            parts.append(note)
        parts.append(f"Statuses: {statuses}. Reply fields: {fields}.")
        if spec.idempotent:
            parts.append("Idempotent: safe to send again after an unknown outcome.")
        fn.__doc__ = "\n\n".join(parts)
        fn.__sends__ = type_name  # type: ignore[attr-defined]
        return fn

    return document


def with_return(cls: type, returns: str, *bases: type) -> None:
    """Give ``cls`` its own copy of every typed call of ``bases`` (made with :func:`sends`) annotated to
    return ``returns``: the calls are written once, generic in what ``call`` returns, and help() on
    each client shows what that client really returns (a Reply, or an awaitable of one)."""
    for base in bases:
        for name, fn in vars(base).items():
            if not isinstance(fn, types.FunctionType) or not hasattr(fn, "__sends__") or name in vars(cls):
                continue
            copy = types.FunctionType(fn.__code__, fn.__globals__, name, fn.__defaults__, fn.__closure__)
            copy.__kwdefaults__ = fn.__kwdefaults__
            copy.__doc__ = fn.__doc__
            copy.__dict__.update(fn.__dict__)
            copy.__qualname__ = f"{cls.__qualname__}.{name}"
            copy.__module__ = cls.__module__
            copy.__annotations__ = {**fn.__annotations__, "return": returns}
            setattr(cls, name, copy)
