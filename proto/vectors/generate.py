"""Regenerate proto/vectors/vectors.json from PROTOCOL.md alone (struct + msgpack).

Deliberately independent of service/smartcache/wire/: the vectors check the codec,
so they must not be made by it. Run: .venv/bin/python proto/vectors/generate.py
"""

import json
import struct
from pathlib import Path

import msgpack

HEADER = struct.Struct("!BBHHBBIQ16s")  # PROTOCOL.md, "Header frame"
SID = bytes.fromhex("6f1c2a3b4c5d4e6f8a9b0c1d2e3f4a5b")


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
    ("events read of a sharded cluster's shard s2, after its sequence 41", header(type_=81, rid=21),
     body({"after_seq": 41, "limit": 100, "shard": "s2"}), decoded(type_=81, rid=21),
     {"after_seq": 41, "limit": 100, "shard": "s2"}),
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
