"""Mutated ZeroMQ messages for the service: valid requests of every client type, then mutated.

Shared by the socket-level fuzz test (tests/integration/test_fuzz.py) and the fault suite's fuzz-mix
row (tests/faults/load.py). Each seed is a valid request; ``mutate`` changes header bytes, the header's
length, body bytes, replaces the body with random msgpack, adds, drops or empties frames.
"""

from __future__ import annotations

import random
import struct
import uuid
from typing import Any

import msgpack

from smartcache.wire import HEADER_STRUCT, OFFSET, REGISTRY, Header, encode_body, encode_header, frame_no_reply

MAX_LIFETIME_MS = 2000
_RID = struct.Struct("!Q")
_LIFETIME = struct.Struct("!I")


class Mutator:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.client_types = [t for t in REGISTRY.types.values() if not t.internal]

    def value(self, depth: int = 0) -> Any:
        r = self.rng
        kind = r.randrange(10 if depth < 4 else 7)
        return [
            lambda: None,
            lambda: r.random() < 0.5,
            lambda: r.randrange(-(2**63), 2**64),
            lambda: r.random() * 1e6,
            lambda: "".join(r.choice("ab€\x00z") for _ in range(r.randrange(8))),
            lambda: r.randbytes(r.randrange(8)),
            lambda: r.randrange(-5, 100),
            lambda: [self.value(depth + 1) for _ in range(r.randrange(4))],
            lambda: {self.key(): self.value(depth + 1) for _ in range(r.randrange(4))},
            lambda: (
                msgpack.ExtType(r.randrange(128), r.randbytes(r.randrange(4)))
                if r.random() < 0.5
                else msgpack.Timestamp(r.randrange(2**34), r.randrange(10**9))
            ),
        ][kind]()

    def key(self) -> str:
        return self.rng.choice(["client_id", "data", "key", "ttl_s", "device_id", "data_type", "idempotency_key", "x"])

    def field(self, type_name: str) -> Any:
        r = self.rng
        return {
            "str": lambda: r.choice(["c1", "dev-1", "k", ""]) + str(r.randrange(50)),
            "int": lambda: r.choice([0, 1, 2, 60, -1, 2**40]),
            "bool": lambda: True,
            "bytes": lambda: r.randbytes(4),
            "uuid": lambda: r.randbytes(16),
            "list": lambda: [1, 2],
            "any": self.value,
        }[type_name]()

    def seed(self, max_lifetime_ms: int = MAX_LIFETIME_MS) -> list[bytes]:
        spec = self.rng.choice(self.client_types)
        body = {f.name: self.field(f.type) for f in spec.request if not f.optional or self.rng.random() < 0.5}
        if "idempotency_key" in body:
            body["idempotency_key"] = uuid.uuid4().hex
        session = self.rng.randbytes(16) if spec.session == "required" or self.rng.random() < 0.2 else bytes(16)
        h = Header.request(spec.id, request_id=0, session_id=session, lifetime_ms=self.rng.randrange(max_lifetime_ms))
        try:
            packed = encode_body(body)
        except (TypeError, ValueError):
            packed = b""
        return [encode_header(h), packed]

    def mutate(self, frames: list[bytes]) -> list[bytes]:
        r = self.rng
        header, body = bytearray(frames[0]), frames[1]
        for _ in range(r.randrange(4)):
            op = r.randrange(8)
            if op == 0 and header:
                header[r.randrange(len(header))] = r.randrange(256)
            elif op == 1 and len(header) == HEADER_STRUCT.size:  # flags and type bytes are the interesting ones
                header[OFFSET["flags"]] = r.randrange(256) if r.random() < 0.3 else r.choice((0, 1, 2, 3))
            elif op == 2:
                header = header[: r.randrange(len(header) + 1)] if r.random() < 0.5 else header + r.randbytes(3)
            elif op == 3 and body:
                b = bytearray(body)
                b[r.randrange(len(b))] = r.randrange(256)
                body = bytes(b)
            elif op == 4:
                body = body[: r.randrange(len(body) + 1)] if body else r.randbytes(r.randrange(6))
            elif op == 5:
                try:
                    body = msgpack.packb(self.value(), use_bin_type=True)
                except (TypeError, ValueError, OverflowError):
                    body = r.randbytes(5)
            elif op == 6:
                body = body + r.randbytes(r.randrange(1, 4))
            elif op == 7 and len(header) == HEADER_STRUCT.size:
                header[OFFSET["type"] : OFFSET["type"] + 2] = struct.pack("!H", r.choice(list(REGISTRY.types_by_id)))
        out = [bytes(header), body]
        shape = r.randrange(12)
        if shape == 0:
            out = out[:1]
        elif shape == 1:
            out = [*out, r.randbytes(2)]
        elif shape == 2:
            out = [b"", *out]  # looks like a REQ envelope
        elif shape == 3:
            out = [out[0], b""]
        return out


def bound_lifetime(frame: bytes, max_ms: int = MAX_LIFETIME_MS) -> bytes:
    """Keep lifetimes short so a batch settles quickly (the fuzzer is about answers, not waits)."""
    if len(frame) != HEADER_STRUCT.size:
        return frame
    o = OFFSET["lifetime_ms"]
    lifetime = _LIFETIME.unpack_from(frame, o)[0] % max_ms
    return frame[:o] + _LIFETIME.pack(lifetime) + frame[o + 4 :]


def with_rid(frame: bytes, rid: int) -> bytes:
    o = OFFSET["request_id"]
    return frame[:o] + _RID.pack(rid) + frame[o + 8 :]


def expected_answers(frames: list[bytes]) -> int:
    """What the service must answer: the envelope rule of the broker, then the NO_REPLY rule."""
    payload = frames[1:] if len(frames) > 1 and frames[0] == b"" else frames
    first = payload[0] if payload else b""
    return 0 if frame_no_reply(first) else 1
