"""Session ids at rest: the raw id a client holds, the stored id storage knows it by, the handle that names it.

A session id is a bearer credential (PROTOCOL.md 4, *Session ids, stored ids and handles*): whoever
puts it in a header is the customer until the session ends. So it lives only in the client's
request header and in the header of a SESSION_CREATE or SESSION_ROTATE ``OK`` reply; the service
hashes it on the way in, with a per-cluster key storage never has:

* **raw** (16 bytes): the header's ``session_id``, made by :func:`new_raw_id` (or, under an
  idempotency key, :func:`keyed_raw_id`, so that a repeat gets the same id);
* **stored** = :func:`derive` (K, raw): the first 16 bytes of HMAC-SHA256(K, raw) with raw's
  routing bits put back (the UUID version nibble, the variant bits and, for a version 8 id, the
  bucket in bytes 0-1), so storage sees a UUID of the same version, variant and bucket and routes
  it as before. Storage keys sessions by its UUID text. HMAC: without K a stored id tells nothing
  of the raw id, and a stolen snapshot holds no credential;
* **handle** = :func:`handle` (stored): ``"h"`` and the stored id in base32 (RFC 4648, lowercase,
  no padding): 27 characters, non-secret, what events, SESSION_LIST, logs, metrics, the operator
  HTTP, the console and the CLI show. :func:`stored_of` turns it back into the stored id (storage
  looks it up by primary key); nothing turns it into the raw id, and it is never one: it is not 16
  bytes nor a UUID, and a handle's bytes sent as an id are derived again (NOT_FOUND).

:func:`key_id` names a key without revealing it: every service instance of a cluster must derive
with the same key, which storage checks (``sc.session_key_check``, the first id it is given).
Vectors: proto/vectors/sessions.json (made by proto/vectors/generate.py without this module); Lua
renders and parses handles the same way.

The service derives once per request that names a session, so the cost is per request:
:class:`SessionKey` hashes the key's two HMAC pads once and then spends two SHA-256 blocks per id:
1.6 µs on a shared two-core VM, where ``hmac.digest`` with the key each time and a bytearray to put
the routing bits back took 2.3 µs (``hmac.digest`` alone 1.7 µs: the key schedule is most of it).
A request costs the service 57-73 µs of CPU (docs/performance.md), so about 2-3 %; ``make bench``
before and after decides (issue 37 allows 3 %). Keyed BLAKE2b was as fast as the pads, but
HMAC-SHA256 is what Tarantool's ``digest`` and every audit checklist know.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import re
import secrets

#: the session key: 32 bytes, given as 64 hex characters (SMARTCACHE_SESSION_KEY)
KEY_BYTES = 32
#: a raw or stored session id
ID_BYTES = 16
#: the key outside production when none is given: all zero, and documented as not secret
ZERO_KEY = bytes(KEY_BYTES)
#: what key_id MACs: a name for the key that reveals nothing of it
KEY_ID_MESSAGE = b"smartcache session key id"
#: key_id's length in bytes (16 hex characters)
KEY_ID_BYTES = 8
#: what keyed_raw_id MACs first: keeps its inputs apart from any raw id derive sees
KEYED_ID_LABEL = b"smartcache session id"
#: a handle: "h" and 26 characters of lowercase base32 (16 bytes = 128 bits, 2 zero bits to fill)
HANDLE_PREFIX = "h"
HANDLE_CHARS = 27
_BASE32 = "abcdefghijklmnopqrstuvwxyz234567"
_HANDLE = re.compile(rf"h[{_BASE32}]{{{HANDLE_CHARS - 1}}}")
_UUID_LIKE = re.compile(r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}")
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


class NotAHandle(ValueError):
    """A value given as a session handle is not one; the message says what is wrong with it.
    Raised by :func:`stored_of`; the caller names the session by a handle it was given (SESSION_LIST,
    an event, a reply's ``handle``), never by a session id."""


def is_v8(session_id: bytes) -> bool:
    """Whether 16 id bytes are a UUID version 8 of the RFC 9562 variant: a sharded cluster's, carrying a bucket."""
    return session_id[6] >> 4 == 8 and session_id[8] >> 6 == 0b10


#: the bits of a raw id its stored id keeps (as one 128-bit big-endian integer): the version nibble
#: (byte 6, high) and the variant bits (byte 8, two high); and for a version 8 id the bucket (bytes 0-1)
_KEEP = (0xF0 << 8 * (ID_BYTES - 1 - 6)) | (0xC0 << 8 * (ID_BYTES - 1 - 8))
_KEEP_V8 = _KEEP | (0xFFFF << 8 * (ID_BYTES - 2))
_NO_SESSION = bytes(ID_BYTES)


class SessionKey:
    """A session key with its HMAC-SHA256 pads hashed once, so :meth:`derive` costs two SHA-256 blocks and no
    key schedule: what the service holds (built once at start from its settings). ``repr`` shows its id only."""

    __slots__ = ("_inner", "_outer", "id")

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, bytes | bytearray) or len(key) != KEY_BYTES:
            raise ValueError(f"a session key is {KEY_BYTES} bytes")
        block = bytes(key).ljust(hashlib.sha256().block_size, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))
        #: the key's name (:func:`key_id`)
        self.id = self.mac(KEY_ID_MESSAGE)[:KEY_ID_BYTES].hex()

    def mac(self, message: bytes) -> bytes:
        """HMAC-SHA256(key, message) (RFC 2104)."""
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

    def derive(self, raw: bytes) -> bytes:
        """The stored id of ``raw``: see :func:`derive`."""
        if len(raw) != ID_BYTES:
            raise ValueError(f"a session id is {ID_BYTES} bytes")
        if raw == _NO_SESSION:
            raise ValueError("the zero session id names no session")
        mac = int.from_bytes(self.mac(raw)[:ID_BYTES], "big")
        keep = _KEEP_V8 if is_v8(raw) else _KEEP
        return ((mac & ~keep) | (int.from_bytes(raw, "big") & keep)).to_bytes(ID_BYTES, "big")

    def __repr__(self) -> str:
        return f"SessionKey(id={self.id})"  # never the key


@functools.lru_cache(maxsize=8)
def _session_key(key: bytes) -> SessionKey:
    return SessionKey(key)


def _check_id(raw: bytes, what: str) -> None:
    if not isinstance(raw, bytes | bytearray) or len(raw) != ID_BYTES:
        raise ValueError(f"a {what} is {ID_BYTES} bytes")


def derive(key: bytes, raw: bytes) -> bytes:
    """The stored id of a raw session id: HMAC-SHA256(key, raw)[0:16] with raw's version nibble (byte 6,
    high), variant bits (byte 8, two high) and, for a version 8 id, bucket (bytes 0-1) put back.
    ValueError for a key that is not 32 bytes, an id that is not 16, or the zero id."""
    _check_id(raw, "session id")
    return _session_key(bytes(key)).derive(raw)


def handle(stored: bytes) -> str:
    """The handle of a stored id: "h" and its 16 bytes in lowercase base32, no padding (27 characters)."""
    _check_id(stored, "stored id")
    return HANDLE_PREFIX + base64.b32encode(stored).decode("ascii").rstrip("=").lower()


def stored_of(value: str) -> bytes:
    """The stored id a handle names; :class:`NotAHandle`, saying why, for anything that is not a handle."""
    if not isinstance(value, str):
        raise NotAHandle(f"a handle is a str, not {type(value).__name__}")
    if _HANDLE.fullmatch(value) is None:
        raise NotAHandle(_why_not(value))
    if _BASE32.index(value[-1]) & 0b11:
        raise NotAHandle(f"{value!r} is not a handle: its last character must leave the two spare bits zero")
    return base64.b32decode(value[1:].upper() + "======")


#: the name the design note gives it
stored_of_handle = stored_of


def _why_not(value: str) -> str:
    shown = value if len(value) <= 40 else value[:37] + "..."
    if _UUID_LIKE.fullmatch(value):
        return f"{shown!r} is a session id (a UUID), not a handle: a session id is never taken where a handle goes"
    if _HANDLE.fullmatch(value.lower()) is not None:
        return f"{shown!r} is not a handle: a handle is lowercase"
    if not value.startswith(HANDLE_PREFIX):
        return f"{shown!r} is not a handle: a handle starts with {HANDLE_PREFIX!r}"
    if len(value) != HANDLE_CHARS:
        return f"{shown!r} is not a handle: a handle is {HANDLE_CHARS} characters, not {len(value)}"
    bad = next(i for i, c in enumerate(value[1:], 1) if c not in _BASE32)
    return f"{shown!r} is not a handle: {value[bad]!r} at {bad} is not lowercase base32 (a-z, 2-7)"


def is_handle(value: object) -> bool:
    """Whether ``value`` is a handle (a str :func:`stored_of` takes)."""
    try:
        stored_of(value)  # type: ignore[arg-type]
    except NotAHandle:
        return False
    return True


def key_id(key: bytes) -> str:
    """A key's name, safe to log and to give storage: the first 8 bytes of HMAC-SHA256(key,
    "smartcache session key id"), in hex (16 characters)."""
    return _session_key(bytes(key)).id


def key_from_hex(text: str) -> bytes:
    """A session key from its 64 hex characters (SMARTCACHE_SESSION_KEY, or a key file's content: surrounding
    white space is ignored). The error never repeats the text: it may be a key."""
    value = text.strip()
    if _HEX64.fullmatch(value) is None:
        raise ValueError(
            f"a session key is {2 * KEY_BYTES} hex characters ({KEY_BYTES} bytes), got {len(value)} characters"
        )
    return binascii.unhexlify(value)


def _shaped(b: bytearray, bucket: int | None) -> bytes:
    """16 bytes made a UUID of the RFC 9562 variant: version 4, or version 8 carrying ``bucket`` in bytes 0-1."""
    if bucket is None:
        b[6] = (b[6] & 0x0F) | 0x40
    else:
        if not 0 <= bucket < 1 << 16:
            raise ValueError(f"a bucket is 0..65535, not {bucket}")
        b[0:2] = bucket.to_bytes(2, "big")
        b[6] = (b[6] & 0x0F) | 0x80
    b[8] = (b[8] & 0x3F) | 0x80
    return bytes(b)


def new_raw_id(bucket: int | None) -> bytes:
    """A new raw session id from the operating system's CSPRNG: version 8 carrying ``bucket`` (a sharded
    cluster: the client's bucket; 106 random bits), or version 4 for None (122 random bits)."""
    return _shaped(bytearray(secrets.token_bytes(ID_BYTES)), bucket)


def keyed_raw_id(key: bytes, bucket: int | None, type_name: str, scope: bytes | str, idempotency_key: str) -> bytes:
    """The raw id a request under an idempotency key makes, the same on every repeat (storage's stored answer
    names the stored id; the raw one is made again from this): HMAC-SHA256(key, "smartcache session id" and
    each of type_name, scope, idempotency_key as a 4-byte big-endian length and its bytes)[0:16], shaped as
    :func:`new_raw_id` shapes. ``scope``: SESSION_CREATE's client_id; SESSION_ROTATE's old raw id (so the new
    id cannot be made again without the old one)."""
    message = bytearray(KEYED_ID_LABEL)
    for part in (type_name, scope, idempotency_key):
        data = part.encode() if isinstance(part, str) else bytes(part)
        message += len(data).to_bytes(4, "big") + data
    return _shaped(bytearray(_session_key(bytes(key)).mac(bytes(message))[:ID_BYTES]), bucket)


def binding_digest(binding: str) -> str:
    """What storage is given and keeps of a session's binding: SHA-256 of its UTF-8 bytes, in hex (64
    characters), so the value itself never reaches storage."""
    return hashlib.sha256(binding.encode()).hexdigest()
