"""The header frame's layout and its decoded form, :class:`Header`.

What both the codec (:mod:`.header`) and the exception tree (:mod:`.errors`: a
:class:`~smartcache.wire.errors.ProtocolError` carries the header it could decode)
need, so it lies below both: the layout is written once, in :data:`HEADER_FIELDS`,
and every offset is derived from it. No checks and no codec here.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from smartcache.wire.registry import REGISTRY, SYSTEM_SMARTCACHE

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
if REGISTRY.header_size != HEADER_STRUCT.size:
    raise ValueError(f"the registry's header_size {REGISTRY.header_size} != {HEADER_STRUCT.size}")


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
