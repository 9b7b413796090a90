"""Regenerate proto/vectors/vectors.json and sessions.json from PROTOCOL.md alone (struct, msgpack, hmac).

Deliberately independent of service/smartcache/wire/: the vectors check the codec and
smartcache.wire.sessionkeys (and Lua's handles), so they must not be made by them.
Run: .venv/bin/python proto/vectors/generate.py
"""

import base64
import hashlib
import hmac
import json
import struct
import uuid
from pathlib import Path

import msgpack

HEADER = struct.Struct("!BBHHBBIQ16s")  # PROTOCOL.md, "Header frame"
SID = bytes.fromhex("6f1c2a3b4c5d4e6f8a9b0c1d2e3f4a5b")


# -- PROTOCOL.md section 4, "Session ids, stored ids and handles" -------------------------------------------

def stored_id(key, raw):
    """mac = HMAC-SHA256(K, raw); stored = mac[0:16] with raw's version nibble, variant bits and (version 8) bucket."""
    mac = bytearray(hmac.new(key, raw, hashlib.sha256).digest()[:16])
    mac[6] = (raw[6] & 0xF0) | (mac[6] & 0x0F)
    mac[8] = (raw[8] & 0xC0) | (mac[8] & 0x3F)
    if raw[6] >> 4 == 8 and raw[8] >> 6 == 0b10:
        mac[0:2] = raw[0:2]
    return bytes(mac)


def handle_of(stored):
    return "h" + base64.b32encode(stored).decode().rstrip("=").lower()


def key_id(key):
    return hmac.new(key, b"smartcache session key id", hashlib.sha256).digest()[:8].hex()


def shaped(b, bucket):
    b = bytearray(b)
    if bucket is None:
        b[6] = (b[6] & 0x0F) | 0x40
    else:
        b[0:2] = bucket.to_bytes(2, "big")
        b[6] = (b[6] & 0x0F) | 0x80
    b[8] = (b[8] & 0x3F) | 0x80
    return bytes(b)


def keyed_raw_id(key, bucket, type_name, scope, idempotency_key):
    message = b"smartcache session id"
    for part in (type_name.encode(), scope, idempotency_key.encode()):
        message += len(part).to_bytes(4, "big") + part
    return shaped(hmac.new(key, message, hashlib.sha256).digest()[:16], bucket)


ZERO_KEY = bytes(32)  # the key outside production when none is given: not secret
TEST_KEY = bytes(range(32))  # 000102...1f: the tests' fixed key
RAWS = [  # (name, raw id, its bucket or None)
    ("version 4", SID, None),
    ("version 8, bucket 870 (client-7 of 1024 buckets: buckets.json)",
     shaped(bytes.fromhex("9d42be01c6a35f7e1b2c3d4e5f607182"), 870), 870),
    ("version 8, bucket 0", shaped(bytes.fromhex("00007a55e1d24c3b9f8e7d6c5b4a3928"), 0), 0),
    ("version 8, bucket 65535", shaped(bytes.fromhex("ffff0123456789abcdeffedcba987654"), 65535), 65535),
    ("version 7 (neither 4 nor 8: version and variant kept, no bucket)",
     bytes.fromhex("01932c07a9b07c4d8e2f3a4b5c6d7e8f"), None),
    ("all ones (variant 11: not a version 8 id, no bucket kept)", b"\xff" * 16, None),
]
SESSIONS = [
    {"name": f"{name}, {kname} key", "key": key.hex(), "raw": raw.hex(), "raw_uuid": str(uuid.UUID(bytes=raw)),
     "bucket": bucket, "stored": str(uuid.UUID(bytes=stored_id(key, raw))), "handle": handle_of(stored_id(key, raw))}
    for kname, key in (("zero", ZERO_KEY), ("test", TEST_KEY)) for name, raw, bucket in RAWS
]
KEYED = [
    {"name": name, "key": TEST_KEY.hex(), "bucket": bucket, "type": type_name, "scope": scope.hex(),
     "idempotency_key": ikey, "raw": keyed_raw_id(TEST_KEY, bucket, type_name, scope, ikey).hex()}
    for name, bucket, type_name, scope, ikey in (
        ("SESSION_CREATE of client-7, one replica set", None, "SESSION_CREATE", b"client-7", "9f2c41d0"),
        ("SESSION_CREATE of client-7, bucket 870", 870, "SESSION_CREATE", b"client-7", "9f2c41d0"),
        ("SESSION_ROTATE of the version 4 id", None, "SESSION_ROTATE", SID, "rot-1"),
    )
]
NOT_HANDLES = [  # (value, why a parser refuses it)
    (str(uuid.UUID(bytes=SID)), "a session id (a UUID) is not a handle"),
    (SID.hex(), "32 hex characters: not a handle"),
    (handle_of(SID).upper(), "upper case"),
    (handle_of(SID)[1:], "no h"),
    (handle_of(SID)[:-1], "26 characters"),
    (handle_of(SID) + "a", "28 characters"),
    (handle_of(SID)[:-1] + "1", "1 is not base32"),
    (handle_of(SID)[:-1] + "b", "b (1) leaves a spare bit set: not canonical"),
    ("", "empty"),
]
HANDLE = handle_of(stored_id(TEST_KEY, SID))  # the version 4 id's handle under the test key


def header(version=1, system=1, type_=1, terr=0, flags=0, reserved=0, lifetime=0, rid=1, sid=bytes(16)):
    return HEADER.pack(version, system, type_, terr, flags, reserved, lifetime, rid, sid)


def decoded(version=1, system=1, type_=1, terr=0, flags=0, lifetime=0, rid=1, sid=bytes(16)):
    return {"version": version, "system": system, "type": type_, "transport_error": terr, "flags": flags,
            "lifetime_ms": lifetime, "request_id": rid, "session_id": sid.hex()}


def body(obj):
    return msgpack.packb(obj, use_bin_type=True)


valid = [
    ("ping request", header(), b"", decoded(), {}),
    ("session create, no session, lifetime 1500 ms", header(type_=10, lifetime=1500, rid=0x0102030405060708),
     body({"client_id": "c-1", "ttl_s": 600, "data": {"step": 1}}),
     decoded(type_=10, lifetime=1500, rid=0x0102030405060708), {"client_id": "c-1", "ttl_s": 600, "data": {"step": 1}}),
    ("session get reply OK", header(type_=11, rid=7, sid=SID),
     body({"status": 0, "client_id": "c-1", "version": "5.2", "data": b"\x00\x01", "rev": 3,
           "updated_at_ms": 1764500000000, "expires_in_ms": 600000}),
     decoded(type_=11, rid=7, sid=SID),
     {"status": 0, "client_id": "c-1", "version": "5.2", "data": {"hex": "0001"}, "rev": 3,
      "updated_at_ms": 1764500000000, "expires_in_ms": 600000}),
    ("session rotate request", header(type_=16, rid=11, sid=SID), body({}), decoded(type_=16, rid=11, sid=SID), {}),
    ("session update merging attributes", header(type_=13, rid=12, sid=SID),
     body({"set": {"step": 2, "amount": 100}, "unset": ["draft"]}), decoded(type_=13, rid=12, sid=SID),
     {"set": {"step": 2, "amount": 100}, "unset": ["draft"]}),
    ("session create reply LIMIT_REACHED (status 5, zero session)", header(type_=10, rid=13),
     body({"status": 5, "max_sessions": 1}), decoded(type_=10, rid=13), {"status": 5, "max_sessions": 1}),
    ("queue full reply (transport error 8, DATA_ERROR)", header(type_=20, terr=8, flags=1, rid=2**64 - 1),
     body({"status": 99, "error": "QUEUE_FULL", "message": "queue full"}),
     decoded(type_=20, terr=8, flags=1, rid=2**64 - 1), {"status": 99, "error": "QUEUE_FULL", "message": "queue full"}),
    ("app start, NO_REPLY", header(type_=40, flags=2, rid=9), body({"device_id": "dev-1"}),
     decoded(type_=40, flags=2, rid=9), {"device_id": "dev-1"}),
    ("lock acquire, waiting up to 5 s in a 6 s lifetime", header(type_=60, lifetime=6000, rid=11),
     body({"name": "pay:c-1", "holder": "h2", "lease_ms": 10000, "wait_ms": 5000}),
     decoded(type_=60, lifetime=6000, rid=11), {"name": "pay:c-1", "holder": "h2", "lease_ms": 10000, "wait_ms": 5000}),
    ("lock acquire reply TIMEOUT (status 14, DATA_ERROR)", header(type_=60, flags=1, lifetime=6000, rid=11),
     body({"status": 14, "holders": 1, "error": "TIMEOUT", "message": "no permit free within wait_ms"}),
     decoded(type_=60, flags=1, lifetime=6000, rid=11),
     {"status": 14, "holders": 1, "error": "TIMEOUT", "message": "no permit free within wait_ms"}),
    ("session get with a binding", header(type_=11, rid=31, sid=SID), body({"binding": "dev-7f3a"}),
     decoded(type_=11, rid=31, sid=SID), {"binding": "dev-7f3a"}),
    ("session get reply BINDING_MISMATCH (status 6)", header(type_=11, rid=31, sid=SID), body({"status": 6}),
     decoded(type_=11, rid=31, sid=SID), {"status": 6}),
    ("session get reply OK by the old id in its grace window", header(type_=11, rid=32, sid=SID),
     body({"status": 0, "client_id": "c-1", "version": "5.2", "data": {"step": 2}, "rev": 4,
           "updated_at_ms": 1764500000000, "expires_in_ms": 1795000, "absolute_expires_in_ms": 43195000,
           "rotated": True}),
     decoded(type_=11, rid=32, sid=SID),
     {"status": 0, "client_id": "c-1", "version": "5.2", "data": {"step": 2}, "rev": 4,
      "updated_at_ms": 1764500000000, "expires_in_ms": 1795000, "absolute_expires_in_ms": 43195000, "rotated": True}),
    ("session create reply OK: the id in the header, its handle in the body", header(type_=10, rid=33, sid=SID),
     body({"status": 0, "expires_in_ms": 1800000, "absolute_expires_in_ms": 43200000, "rev": 1, "handle": HANDLE}),
     decoded(type_=10, rid=33, sid=SID),
     {"status": 0, "expires_in_ms": 1800000, "absolute_expires_in_ms": 43200000, "rev": 1, "handle": HANDLE}),
    ("session rotate with a 5 s grace window", header(type_=16, rid=34, sid=SID), body({"grace_ms": 5000}),
     decoded(type_=16, rid=34, sid=SID), {"grace_ms": 5000}),
    ("session delete by handle (zero header session)", header(type_=14, rid=35),
     body({"handle": HANDLE, "client_id": "c-1"}), decoded(type_=14, rid=35), {"handle": HANDLE, "client_id": "c-1"}),
    ("events read of a sharded cluster's shard s2, after its sequence 41", header(type_=81, rid=21),
     body({"after_seq": 41, "limit": 100, "shard": "s2"}), decoded(type_=81, rid=21),
     {"after_seq": 41, "limit": 100, "shard": "s2"}),
    ("session get reply OK with its position in shard s2's log (rev. 12)", header(type_=11, rid=36, sid=SID),
     body({"status": 0, "client_id": "c-1", "version": "5.2", "data": {"step": 2}, "rev": 4,
           "updated_at_ms": 1764500000000, "expires_in_ms": 1795000, "absolute_expires_in_ms": 43195000,
           "handle": HANDLE, "seq": 902, "shard": "s2", "refresh_in_ms": 175000}),
     decoded(type_=11, rid=36, sid=SID),
     {"status": 0, "client_id": "c-1", "version": "5.2", "data": {"step": 2}, "rev": 4,
      "updated_at_ms": 1764500000000, "expires_in_ms": 1795000, "absolute_expires_in_ms": 43195000,
      "handle": HANDLE, "seq": 902, "shard": "s2", "refresh_in_ms": 175000}),
    ("device lookup reply OK with its position (rev. 12)", header(type_=31, rid=37),
     body({"status": 0, "client_id": "c-1", "updated_at_ms": 1764500000000, "seq": 57}),
     decoded(type_=31, rid=37), {"status": 0, "client_id": "c-1", "updated_at_ms": 1764500000000, "seq": 57}),
    ("events read reply of a sharded cluster (the shard read, every shard)", header(type_=81, rid=21),
     body({"status": 0, "events": [], "last_seq": 41, "head_seq": 41, "oldest_seq": 1, "shard": "s2",
           "shards": ["s1", "s2"]}),
     decoded(type_=81, rid=21),
     {"status": 0, "events": [], "last_seq": 41, "head_seq": 41, "oldest_seq": 1, "shard": "s2",
      "shards": ["s1", "s2"]}),
]

invalid = [
    ("header too short", header()[:35], b"", "BAD_HEADER"),
    ("header too long", header() + b"\x00", b"", "BAD_HEADER"),
    ("version 2", header(version=2), b"", "UNSUPPORTED_VERSION"),
    ("system 7", header(system=7), b"", "UNKNOWN_SYSTEM"),
    ("type 999", header(type_=999), b"", "UNKNOWN_TYPE"),
    ("reserved flag bit 2", header(flags=4), b"", "BAD_HEADER"),
    ("reserved byte", header(reserved=1), b"", "BAD_HEADER"),
    ("body is an array", header(), body([1, 2]), "BAD_BODY"),
    ("body truncated", header(), body({"key": "abcdef"})[:-2], "BAD_BODY"),
    ("body with trailing bytes", header(), body({}) + b"\xc0", "BAD_BODY"),
    ("body with integer key", header(), body({1: 2}), "BAD_BODY"),
    ("body with never-used byte 0xc1", header(), b"\x81\xa1k\xc1", "BAD_BODY"),
]

out = {
    "doc": "Test vectors for PROTOCOL.md v1. frames are hex; header/body give the decoded meaning "
           "(bytes shown as {\"hex\": ...}); error is the transport error a decoder must raise.",
    "valid": [{"name": n, "frames": [h.hex(), b.hex()], "header": d, "body": bd} for n, h, b, d, bd in valid],
    "invalid": [{"name": n, "frames": [h.hex(), b.hex()], "error": e} for n, h, b, e in invalid],
}
Path(__file__).with_name("vectors.json").write_text(json.dumps(out, indent=1) + "\n")

sessions = {
    "doc": "PROTOCOL.md section 4, Session ids, stored ids and handles. key: the session key K (hex); raw: the "
           "header's session id (hex); stored: derive(K, raw) as storage keys it (UUID text); handle: 'h' and "
           "the stored id in lowercase base32, no padding. keys: each key's id (key_id). keyed: the raw id a "
           "SESSION_CREATE or SESSION_ROTATE under an idempotency key makes (scope: the client id's UTF-8, or "
           "the old raw id; hex). not_handles: values a handle parser refuses.",
    "keys": [{"key": k.hex(), "key_id": key_id(k)} for k in (ZERO_KEY, TEST_KEY)],
    "sessions": SESSIONS,
    "keyed": KEYED,
    "not_handles": [{"value": v, "why": why} for v, why in NOT_HANDLES],
}
Path(__file__).with_name("sessions.json").write_text(json.dumps(sessions, indent=1) + "\n")
