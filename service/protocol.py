"""The smartcache wire protocol: registry, header and body codec.

Every number lives in ``proto/protocol.toml``; this module loads it once and
holds no second copy. ``proto/PROTOCOL.md`` is the spec.

A message is two frames: a fixed 36-byte header and a msgpack body (a map with
string keys). Decoding is strict and bounded: every malformed input raises one
subclass of :class:`service.errors.ProtocolError`, never anything else.
"""

from __future__ import annotations

import importlib.resources
import os
import struct
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import msgpack

from service.errors import (
    BadBody,
    BadHeader,
    BodyTooLarge,
    UnknownSystem,
    UnknownType,
    UnsupportedVersion,
)


def _registry_path() -> Path:
    """SMARTCACHE_PROTOCOL, else the registry installed with the package (proto/ in a source tree)."""
    override = os.environ.get("SMARTCACHE_PROTOCOL")
    if override:
        return Path(override)
    try:
        resource = importlib.resources.files("smartcache_proto").joinpath("protocol.toml")
        with importlib.resources.as_file(resource) as path:
            if path.exists():
                return path
    except ModuleNotFoundError:
        pass
    return Path(__file__).resolve().parent.parent / "proto" / "protocol.toml"


REGISTRY_PATH = _registry_path()

#: The header, field by field (PROTOCOL.md section 4): the one place its layout is written.
HEADER_FIELDS = (
    ("version", "B"),
    ("system", "B"),
    ("type", "H"),
    ("transport_error", "H"),
    ("flags", "B"),
    ("reserved", "B"),
    ("lifetime_ms", "I"),
    ("request_id", "Q"),
    ("session_id", "16s"),
)
HEADER_STRUCT = struct.Struct("!" + "".join(f for _, f in HEADER_FIELDS))
#: byte offset of each header field, derived from HEADER_FIELDS
OFFSET = {
    name: struct.calcsize("!" + "".join(f for _, f in HEADER_FIELDS[:i])) for i, (name, _) in enumerate(HEADER_FIELDS)
}
NO_SESSION = bytes(16)

_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "bytes": (bytes,),
    "uuid": (bytes,),
    "list": (list,),
    "any": (object,),
}


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One body field of a message type: its type name and whether it may be absent."""

    name: str
    type: str
    optional: bool

    def accepts(self, value: object) -> bool:
        if self.type == "any":
            return True
        if self.type == "int" and isinstance(value, bool):
            return False
        if self.type == "uuid":
            return isinstance(value, bytes) and len(value) == 16
        return isinstance(value, _FIELD_TYPES[self.type])


@dataclass(frozen=True, slots=True)
class MessageSpec:
    """One message type of the registry."""

    name: str
    id: int
    priority: int
    lifetime_ms: int
    session: str
    request: tuple[FieldSpec, ...]
    reply: tuple[FieldSpec, ...]
    statuses: tuple[str, ...]
    doc: str
    max_busy_percent: int
    #: internal types are made by the service itself; clients may not send them
    internal: bool = False
    #: repeating it leaves the same state and answer (safe to retry after OUTCOME_UNKNOWN)
    idempotent: bool = False
    #: False: never answered, errors included (APP_START)
    answered: bool = True
    #: an OK reply carries the created session's id in the header; any other answer zero
    creates_session: bool = False

    def check_request(self, body: Mapping[str, Any]) -> str | None:
        """Return why ``body`` is not a valid request of this type, or None."""
        for f in self.request:
            if f.name not in body:
                if not f.optional:
                    return f"missing field {f.name!r}"
            elif not f.accepts(body[f.name]) and not (f.optional and body[f.name] is None):
                return f"field {f.name!r} must be {f.type}"
        return None


@dataclass(frozen=True, slots=True)
class Registry:
    """The parsed ``protocol.toml``."""

    version: int
    header_size: int
    max_body_bytes: int
    max_depth: int
    max_lifetime_ms: int
    systems: Mapping[str, int]
    flags: Mapping[str, int]
    statuses: Mapping[str, int]
    transport_errors: Mapping[str, int]
    types: Mapping[str, MessageSpec]
    types_by_id: Mapping[int, MessageSpec] = field(default_factory=dict)
    status_names: Mapping[int, str] = field(default_factory=dict)
    transport_error_names: Mapping[int, str] = field(default_factory=dict)
    #: statuses whose reply has DATA_ERROR set and an error object body
    data_error_statuses: frozenset[str] = frozenset()
    #: statuses only stored procedures return; never sent to clients
    storage_only_statuses: frozenset[str] = frozenset()
    #: transport error -> whether the message may have been executed: "yes", "no" or "unknown"
    executed: Mapping[str, str] = field(default_factory=dict)
    #: transport errors that mean the sender's message was malformed
    bad_input_errors: frozenset[str] = frozenset()
    #: transport errors a retry cannot change: bad input, and refusals like FORBIDDEN
    final_errors: frozenset[str] = frozenset()
    #: status or transport error name -> its meaning (for PROTOCOL.md's tables)
    docs: Mapping[str, str] = field(default_factory=dict)


def _fields(table: Mapping[str, str]) -> tuple[FieldSpec, ...]:
    out = []
    for name, spec in table.items():
        optional = spec.endswith("?")
        type_name = spec.rstrip("?")
        if type_name not in _FIELD_TYPES:
            raise ValueError(f"unknown field type {spec!r} for {name!r}")
        out.append(FieldSpec(name, type_name, optional))
    return tuple(out)


def _codes(table: Mapping[str, Any]) -> dict[str, int]:
    return {name: int(entry["code"]) for name, entry in table.items()}


def load_registry(path: Path = REGISTRY_PATH) -> Registry:
    """Load and check the registry; raises ValueError on an inconsistent file."""
    with path.open("rb") as f:
        raw = tomllib.load(f)
    statuses = _codes(raw["statuses"])
    types = {}
    for name, t in raw["types"].items():
        unknown = set(t["statuses"]) - statuses.keys()
        if unknown:
            raise ValueError(f"{name}: unknown statuses {sorted(unknown)}")
        if t["session"] not in ("required", "optional", "none"):
            raise ValueError(f"{name}: bad session rule {t['session']!r}")
        types[name] = MessageSpec(
            name=name,
            id=int(t["id"]),
            priority=int(t["priority"]),
            lifetime_ms=int(t["lifetime_ms"]),
            session=t["session"],
            request=_fields(t["request"]),
            reply=_fields(t["reply"]),
            statuses=tuple(t["statuses"]),
            doc=t["doc"],
            max_busy_percent=int(t["max_busy_percent"]),
            internal=bool(t.get("internal", False)),
            idempotent=bool(t["idempotent"]),
            answered=bool(t.get("answered", True)),
            creates_session=bool(t.get("creates_session", False)),
        )
    transport_errors = _codes(raw["transport_errors"])
    for what, table in (
        ("type", {t.name: t.id for t in types.values()}),
        ("status", statuses),
        ("transport error", transport_errors),
    ):
        if len(set(table.values())) != len(table):
            raise ValueError(f"duplicate {what} codes in {path}")
    proto = raw["protocol"]
    if proto["header_size"] != HEADER_STRUCT.size:
        raise ValueError(f"header_size {proto['header_size']} != {HEADER_STRUCT.size}")
    return Registry(
        version=int(proto["version"]),
        header_size=int(proto["header_size"]),
        max_body_bytes=int(proto["max_body_bytes"]),
        max_depth=int(proto["max_depth"]),
        max_lifetime_ms=int(proto["max_lifetime_ms"]),
        systems=dict(raw["systems"]),
        flags=dict(raw["flags"]),
        statuses=statuses,
        transport_errors=transport_errors,
        types=types,
        types_by_id={t.id: t for t in types.values()},
        status_names={v: k for k, v in statuses.items()},
        transport_error_names={v: k for k, v in transport_errors.items()},
        data_error_statuses=frozenset(k for k, v in raw["statuses"].items() if v.get("data_error")),
        storage_only_statuses=frozenset(k for k, v in raw["statuses"].items() if v.get("storage_only")),
        executed={k: str(v["executed"]) for k, v in raw["transport_errors"].items()},
        bad_input_errors=frozenset(k for k, v in raw["transport_errors"].items() if v.get("bad_input")),
        final_errors=frozenset(k for k, v in raw["transport_errors"].items() if v.get("bad_input") or v.get("final")),
        docs={k: str(v["doc"]) for table in ("statuses", "transport_errors") for k, v in raw[table].items()},
    )


REGISTRY = load_registry()
STATUS = REGISTRY.statuses
TRANSPORT_ERROR = REGISTRY.transport_errors
FLAG_DATA_ERROR = REGISTRY.flags["DATA_ERROR"]
FLAG_NO_REPLY = REGISTRY.flags["NO_REPLY"]
_KNOWN_FLAGS = FLAG_DATA_ERROR | FLAG_NO_REPLY
SYSTEM_SMARTCACHE = REGISTRY.systems["SMARTCACHE"]
_NEVER_ANSWERED = frozenset(t.id for t in REGISTRY.types.values() if not t.answered)
_CREATES_SESSION = frozenset(t.id for t in REGISTRY.types.values() if t.creates_session)


class Header(NamedTuple):
    """A decoded header (the reserved byte is always zero and not kept)."""

    version: int
    system: int
    type: int
    transport_error: int
    flags: int
    lifetime_ms: int
    request_id: int
    session_id: bytes

    @classmethod
    def request(
        cls, type_id: int, *, request_id: int, session_id: bytes = NO_SESSION, lifetime_ms: int = 0, flags: int = 0
    ) -> Header:
        """A header for a client request to smartcache."""
        return cls(REGISTRY.version, SYSTEM_SMARTCACHE, type_id, 0, flags, lifetime_ms, request_id, session_id)

    def reply(self, *, transport_error: int = 0, flags: int = 0, session_id: bytes | None = None) -> Header:
        """The header of the answer to this message: same type, request id and session."""
        return self._replace(
            transport_error=transport_error,
            flags=flags,
            session_id=self.session_id if session_id is None else session_id,
        )


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


def _no_ext(code: int, data: bytes) -> object:
    raise BadBody(f"msgpack extension type {code} is not allowed")


#: msgpack's timestamp extension (type -1) as fixext 4, fixext 8 and ext 8 (12 bytes). msgpack
#: decodes it itself, without ext_hook; a body holding none of these byte pairs cannot contain one.
_TIMESTAMP_MARKS = (b"\xd6\xff", b"\xd7\xff", b"\xc7\x0c\xff")


def _check_shape(obj: object, max_depth: int, *, timestamps: bool) -> None:
    """Reject bodies that are not a map, nest deeper than max_depth (maps and arrays both count),
    or have non-str keys; with ``timestamps``, also any msgpack Timestamp value."""
    if not isinstance(obj, dict):
        raise BadBody(f"body must be a msgpack map, not {type(obj).__name__}")
    stack: list[tuple[object, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise BadBody(f"body nests deeper than {max_depth} levels")
        if isinstance(node, dict):
            for k, v in node.items():
                if not isinstance(k, str):
                    raise BadBody(f"map keys must be strings, not {type(k).__name__}")
                if isinstance(v, dict | list):
                    stack.append((v, depth + 1))
                elif timestamps and isinstance(v, msgpack.Timestamp):
                    raise BadBody("msgpack extension type -1 (timestamp) is not allowed")
        elif isinstance(node, list):
            for v in node:
                if isinstance(v, dict | list):
                    stack.append((v, depth + 1))
                elif timestamps and isinstance(v, msgpack.Timestamp):
                    raise BadBody("msgpack extension type -1 (timestamp) is not allowed")


def decode_body(
    frame: bytes, *, max_bytes: int = REGISTRY.max_body_bytes, max_depth: int = REGISTRY.max_depth
) -> dict[str, Any]:
    """Unpack a body frame into a dict; raises BodyTooLarge or BadBody.

    An empty frame is an empty map (clients with nothing to say may send b"").
    """
    if len(frame) > max_bytes:
        raise BodyTooLarge(f"body is {len(frame)} bytes, limit {max_bytes}")
    if not frame:
        return {}
    try:
        obj = msgpack.unpackb(frame, raw=False, strict_map_key=True, ext_hook=_no_ext, use_list=True)
    except BadBody:
        raise
    except (ValueError, msgpack.UnpackException) as e:  # ExtraData, FormatError, StackError...
        raise BadBody(f"invalid msgpack: {e}") from e
    timestamps = b"\xff" in frame and any(mark in frame for mark in _TIMESTAMP_MARKS)  # one memchr, usually
    _check_shape(obj, max_depth, timestamps=timestamps)
    return obj  # type: ignore[no-any-return]  # checked to be a dict above


def encode_body(body: Mapping[str, Any]) -> bytes:
    """Pack a body map (str as msgpack str, bytes as bin)."""
    return msgpack.packb(body, use_bin_type=True)  # type: ignore[no-any-return]


def error_body(status: str, error: str, message: str) -> dict[str, Any]:
    """An error object: the body of every reply with DATA_ERROR set."""
    return {"status": STATUS[status], "error": error, "message": message}
