"""Session ids as the service gives them to storage (PROTOCOL.md revision 11), for the load tests that call storage's
procedures themselves (the direct yardstick, the ceiling's sketch, the resharding preload).

Storage keys a session by its stored id, HMAC-SHA256 of the client's raw id under the cluster's session key
(smartcache.wire.sessionkeys); a create given no id makes a raw-keyed row, as only a service of before revision 11
does. So these make a raw id as the service does (version 4, or version 8 carrying the client's bucket) and derive
its stored id with the key the bench's service has: $SMARTCACHE_SESSION_KEY or _FILE when set, else the all-zero
key the service uses without one. The derivation costs what it costs the service (its pads hashed once).
"""

from __future__ import annotations

import os
import uuid

from smartcache.settings import Environment
from smartcache.wire import sessionkeys

#: the bench's service's key (read once, as the service reads it)
KEY = sessionkeys.SessionKey(Environment(os.environ).session_key() or sessionkeys.ZERO_KEY)


def stored_text(raw: bytes) -> str:
    """The stored id of a raw id, as UUID text: what storage's session procedures take."""
    return str(uuid.UUID(bytes=KEY.derive(raw)))


def new(bucket: int | None = None) -> tuple[bytes, str]:
    """A new raw id (version 8 carrying ``bucket``, else version 4) and its stored id's text."""
    raw = sessionkeys.new_raw_id(bucket)
    return raw, stored_text(raw)
