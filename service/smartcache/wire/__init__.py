"""The wire: what both ends of a ZeroMQ conversation with smartcache share.

The registry (:mod:`.registry`, every type, status, error code and limit from
``proto/protocol.toml``), the header's layout (:mod:`.layout`), the header and
body codec (:mod:`.header`, :mod:`.body`), the exception tree (:mod:`.errors`),
CURVE key files (:mod:`.keys`), session ids at rest (:mod:`.sessionkeys`: stored ids and
handles) and the default ports (:mod:`.ports`). It imports
nothing else of smartcache (``make lint`` checks it): the client, the CLI and
the server all build on it. ``proto/PROTOCOL.md`` is the spec it implements.
"""

from smartcache.wire.body import decode_body, encode_body, error_body
from smartcache.wire.header import (
    decode_header,
    encode_header,
    frame_flags,
    frame_no_reply,
    frame_request_id,
    frame_type,
    loose_header,
    trusted_header,
    with_flags,
    with_session,
    with_transport_error,
)
from smartcache.wire.layout import HEADER_FIELDS, HEADER_STRUCT, NO_SESSION, OFFSET, Header
from smartcache.wire.registry import (
    FLAG_DATA_ERROR,
    FLAG_NO_REPLY,
    REGISTRY,
    REGISTRY_PATH,
    STATUS,
    SYSTEM_SMARTCACHE,
    TRANSPORT_ERROR,
    FieldSpec,
    MessageSpec,
    Registry,
    load_registry,
)

__all__ = [
    "FLAG_DATA_ERROR",
    "FLAG_NO_REPLY",
    "HEADER_FIELDS",
    "HEADER_STRUCT",
    "NO_SESSION",
    "OFFSET",
    "REGISTRY",
    "REGISTRY_PATH",
    "STATUS",
    "SYSTEM_SMARTCACHE",
    "TRANSPORT_ERROR",
    "FieldSpec",
    "Header",
    "MessageSpec",
    "Registry",
    "decode_body",
    "decode_header",
    "encode_body",
    "encode_header",
    "error_body",
    "frame_flags",
    "frame_no_reply",
    "frame_request_id",
    "frame_type",
    "load_registry",
    "loose_header",
    "trusted_header",
    "with_flags",
    "with_session",
    "with_transport_error",
]
