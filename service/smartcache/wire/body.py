"""The body frame: a msgpack map with string keys, decoded strictly and within bounds.

Every malformed body raises :class:`~smartcache.wire.errors.BodyTooLarge` or
:class:`~smartcache.wire.errors.BadBody`, never anything else (property-tested
in tests/unit/test_protocol.py, fuzzed by ``make fuzz``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack

from smartcache.wire.errors import BadBody, BodyTooLarge
from smartcache.wire.registry import REGISTRY, STATUS


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
