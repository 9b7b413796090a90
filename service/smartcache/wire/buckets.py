"""Buckets: which of a sharded cluster's B buckets a key belongs to, and the bucket a session id carries.

docs/design/sharding.md is the design. A key's bucket is ``crc32c(utf8(key)) mod B``
(CRC-32C, Castagnoli: the polynomial 0x82F63B78 reflected, initial value and final XOR
0xFFFFFFFF; its check value ``crc32c(b"123456789") == 0xE3069283``). Tarantool
computes the same with ``bit.bxor(digest.crc32(s), 0xFFFFFFFF)`` (its ``digest.crc32``
leaves out the final XOR): lua/smartcache/sharding/buckets.lua, and proto/vectors/buckets.json
holds vectors both sides are tested against.

A session id made by a sharded cluster is a UUID version 8 (RFC 9562) whose first two
bytes are its bucket, big-endian; ids of version 4 (made before sharding) carry none.
No I/O; pure functions, shared by the service (routing) and any client that wants to know.
"""

from __future__ import annotations

#: the most buckets a cluster may have: a session id has two bytes for its bucket
MAX_BUCKETS = 1 << 16
#: what ``cluster init --shards`` gives a cluster unless told otherwise
DEFAULT_BUCKETS = 1024


def _table() -> tuple[int, ...]:
    out = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        out.append(c)
    return tuple(out)


_TABLE = _table()


def crc32c(data: bytes) -> int:
    """CRC-32C of data (as iSCSI, ext4 and Tarantool's digest.crc32 with the final XOR)."""
    c = 0xFFFFFFFF
    for byte in data:
        c = _TABLE[(c ^ byte) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def bucket_of(key: str, buckets: int) -> int:
    """The bucket of a routing key (a client id, a device id, an object's name) among ``buckets``."""
    if not 1 <= buckets <= MAX_BUCKETS:
        raise ValueError(f"a cluster has 1..{MAX_BUCKETS} buckets, not {buckets}")
    return crc32c(key.encode()) % buckets


def session_bucket(session_id: bytes) -> int | None:
    """The bucket a session id carries (its 16 raw bytes), or None for an id made before sharding (version 4)."""
    if len(session_id) != 16:
        raise ValueError(f"a session id is 16 bytes, not {len(session_id)}")
    if session_id[6] >> 4 != 8 or session_id[8] >> 6 != 0b10:
        return None
    return int.from_bytes(session_id[:2], "big")


def session_id_with_bucket(random16: bytes, bucket: int) -> bytes:
    """A version 8 session id carrying ``bucket``, the rest from ``random16`` (16 random bytes; storage makes
    the ids, this is for tests and for a client that wants to check one)."""
    if len(random16) != 16:
        raise ValueError("16 random bytes are needed")
    if not 0 <= bucket < MAX_BUCKETS:
        raise ValueError(f"a bucket is 0..{MAX_BUCKETS - 1}, not {bucket}")
    b = bytearray(random16)
    b[0:2] = bucket.to_bytes(2, "big")
    b[6] = (b[6] & 0x0F) | 0x80
    b[8] = (b[8] & 0x3F) | 0x80
    return bytes(b)
