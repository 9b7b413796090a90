"""The header frame: its layout, its codec, and the fast paths that patch it.

A message is two frames: a fixed 36-byte header and a msgpack body
(:mod:`.body`). The layout is written once, in :mod:`.layout` (with
:class:`~smartcache.wire.layout.Header`, which the errors carry too); every
offset is derived from it. Decoding is strict: every malformed header raises
one subclass of :class:`~smartcache.wire.errors.ProtocolError`, never anything
else.
"""

from __future__ import annotations

import struct

from smartcache.wire.errors import BadHeader, UnknownSystem, UnknownType, UnsupportedVersion
from smartcache.wire.layout import HEADER_STRUCT, NO_SESSION, OFFSET, Header
from smartcache.wire.registry import FLAG_DATA_ERROR, FLAG_NO_REPLY, REGISTRY, SYSTEM_SMARTCACHE, Registry

_KNOWN_FLAGS = FLAG_DATA_ERROR | FLAG_NO_REPLY
_NEVER_ANSWERED = frozenset(t.id for t in REGISTRY.types.values() if not t.answered)
_CREATES_SESSION = frozenset(t.id for t in REGISTRY.types.values() if t.creates_session)


def trusted_header(frame: bytes) -> Header:
    """Unpack a header that was validated before (the broker's, inside the service); no checks."""
    version, system, type_id, terr, flags, _, lifetime_ms, request_id, session_id = HEADER_STRUCT.unpack(frame)
    return Header(version, system, type_id, terr, flags, lifetime_ms, request_id, session_id)


def loose_header(frame: bytes) -> Header:
    """Whatever can be read from a frame that failed validation, to address an error reply.

    A 36-byte frame keeps its type, lifetime, request id and session; anything
    else gives a zero header. Version and system are always ours.
    """
    if len(frame) != HEADER_STRUCT.size:
        return Header(REGISTRY.version, SYSTEM_SMARTCACHE, 0, 0, 0, 0, 0, NO_SESSION)
    _, _, type_id, _, _, _, lifetime_ms, request_id, session_id = HEADER_STRUCT.unpack(frame)
    return Header(REGISTRY.version, SYSTEM_SMARTCACHE, type_id, 0, 0, lifetime_ms, request_id, session_id)


# -- fast paths on header frames ------------------------------------------------
#
# The broker and the workers answer by patching the request's header frame in
# place of decoding and re-encoding it; these functions are the only code that
# knows where a field lies (OFFSET, from HEADER_FIELDS).

_TYPE = struct.Struct("!H")
_REQUEST_ID = struct.Struct("!Q")
_ERROR_AND_FLAGS = struct.Struct("!HB")
_O_TYPE = OFFSET["type"]
_O_TERR = OFFSET["transport_error"]
_O_FLAGS = OFFSET["flags"]
_O_RESERVED = OFFSET["reserved"]
_O_REQUEST_ID = OFFSET["request_id"]
_O_SESSION = OFFSET["session_id"]


def frame_type(frame: bytes) -> int:
    """The type id of a 36-byte header frame."""
    return int(_TYPE.unpack_from(frame, _O_TYPE)[0])


def frame_request_id(frame: bytes) -> int:
    """The request id of a 36-byte header frame."""
    return int(_REQUEST_ID.unpack_from(frame, _O_REQUEST_ID)[0])


def frame_flags(frame: bytes) -> int:
    """The flags byte of a 36-byte header frame."""
    return frame[_O_FLAGS]


def frame_no_reply(frame: bytes) -> bool:
    """Whether a message with this header gets no answer at all, errors included (PROTOCOL.md 4).

    The rule: the frame is header-sized and either its NO_REPLY flag is set or
    it addresses a never-answered type (APP_START) of this version and system.
    """
    if len(frame) != HEADER_STRUCT.size:
        return False
    if frame[_O_FLAGS] & FLAG_NO_REPLY:
        return True
    return frame[0] == REGISTRY.version and frame[1] == SYSTEM_SMARTCACHE and frame_type(frame) in _NEVER_ANSWERED


def with_flags(frame: bytes, flags: int) -> bytes:
    """A header frame with its flags replaced."""
    return frame[:_O_FLAGS] + bytes((flags,)) + frame[_O_FLAGS + 1 :]


def with_session(frame: bytes, session_id: bytes) -> bytes:
    """A header frame with its session id replaced (16 raw bytes)."""
    return frame[:_O_SESSION] + session_id


def with_transport_error(frame: bytes, transport_error: int) -> bytes:
    """The error reply header for a validated request header: transport_error set, DATA_ERROR
    the only flag, and a zero session id for a type that creates sessions (a refusal created none)."""
    out = frame[:_O_TERR] + _ERROR_AND_FLAGS.pack(transport_error, FLAG_DATA_ERROR) + frame[_O_RESERVED:]
    if frame_type(frame) in _CREATES_SESSION:
        out = with_session(out, NO_SESSION)
    return out


def encode_header(h: Header) -> bytes:
    """Pack a header; raises BadHeader for out-of-range fields."""
    try:
        return HEADER_STRUCT.pack(
            h.version, h.system, h.type, h.transport_error, h.flags, 0, h.lifetime_ms, h.request_id, h.session_id
        )
    except struct.error as e:
        raise BadHeader(f"cannot encode header: {e}") from e


def decode_header(frame: bytes, registry: Registry = REGISTRY, *, check_type: bool = True) -> Header:
    """Unpack and validate a header frame.

    Raises BadHeader, UnsupportedVersion, UnknownSystem or UnknownType; every
    error after the size check carries the decoded header so the sender can be
    answered with its own request id. ``check_type=False`` accepts any type id
    (a client reading an error reply to a type the service did not know).
    """
    if len(frame) != HEADER_STRUCT.size:
        raise BadHeader(f"header is {len(frame)} bytes, expected {HEADER_STRUCT.size}")
    version, system, type_id, terr, flags, reserved, lifetime_ms, request_id, session_id = HEADER_STRUCT.unpack(frame)
    h = Header(version, system, type_id, terr, flags, lifetime_ms, request_id, session_id)
    if version != registry.version:
        raise UnsupportedVersion(f"protocol version {version} is not supported (speak {registry.version})", header=h)
    if system != SYSTEM_SMARTCACHE:
        raise UnknownSystem(f"system {system} is not smartcache ({SYSTEM_SMARTCACHE})", header=h)
    if reserved or flags & ~_KNOWN_FLAGS:
        raise BadHeader(f"reserved bits set (flags={flags:#04x}, reserved={reserved:#04x})", header=h)
    if terr not in registry.transport_error_names:
        raise BadHeader(f"unknown transport error {terr}", header=h)
    if check_type and type_id not in registry.types_by_id:
        raise UnknownType(f"unknown message type {type_id}", header=h)
    return h
