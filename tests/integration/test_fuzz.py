"""A socket-level mutation fuzzer against a live service: no client input may produce INTERNAL,
and every message gets exactly the answers PROTOCOL.md promises (one, or none under the NO_REPLY rule).

Seeds are valid requests of every client type; each is mutated (header bytes,
header length, body bytes, body replaced by random msgpack, frames added,
dropped or emptied) and sent over a real DEALER socket. Replies are matched to
requests by request id (each 36-byte header frame gets a unique one after
mutation; other frames are answered with request id 0 and counted).
``SMARTCACHE_FUZZ_FRAMES`` sets how many messages (default 40,000, to keep ``make test`` near ten
minutes: 100,000 took 79 s of its 624 s; set more for a longer run) and
``SMARTCACHE_FUZZ_SEED`` the seed (printed on failure).
"""

from __future__ import annotations

import os
import random
import struct
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq

from devtools.devstack import Tarantool, free_port
from smartcache.wire import (
    HEADER_STRUCT,
    OFFSET,
    REGISTRY,
    TRANSPORT_ERROR,
    Header,
    encode_body,
    encode_header,
    frame_no_reply,
    frame_request_id,
)
from tests.conftest import Running, running_service, service_settings
from tests.helpers import metric

FRAMES = int(os.environ.get("SMARTCACHE_FUZZ_FRAMES", "40000"))
SEED = int(os.environ.get("SMARTCACHE_FUZZ_SEED", str(random.SystemRandom().randrange(2**32))))
BATCH = 500
MAX_LIFETIME_MS = 2000
_RID = struct.Struct("!Q")
_LIFETIME = struct.Struct("!I")


@pytest.fixture(scope="module")
def fuzz_target(storage: Tarantool) -> Iterator[Running]:
    # The backend URL points at a closed port: PRODUCTS_GET fails fast instead of waiting.
    settings = service_settings(
        storage,
        backend_url=f"http://127.0.0.1:{free_port()}",
        backend_retries=0,
        bad_input_per_peer_per_s=10**9,  # the fuzzer counts every answer: no throttling here
        bad_input_per_s=10**9,
    )
    with running_service(settings) as r:
        yield r


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

    def seed(self) -> list[bytes]:
        spec = self.rng.choice(self.client_types)
        body = {f.name: self.field(f.type) for f in spec.request if not f.optional or self.rng.random() < 0.5}
        if "idempotency_key" in body:
            body["idempotency_key"] = uuid.uuid4().hex
        session = self.rng.randbytes(16) if spec.session == "required" or self.rng.random() < 0.2 else bytes(16)
        h = Header.request(spec.id, request_id=0, session_id=session, lifetime_ms=self.rng.randrange(MAX_LIFETIME_MS))
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


def _bound_lifetime(frame: bytes) -> bytes:
    """Keep lifetimes short so a batch settles quickly (the fuzzer is about answers, not waits)."""
    if len(frame) != HEADER_STRUCT.size:
        return frame
    o = OFFSET["lifetime_ms"]
    lifetime = _LIFETIME.unpack_from(frame, o)[0] % MAX_LIFETIME_MS
    return frame[:o] + _LIFETIME.pack(lifetime) + frame[o + 4 :]


def _with_rid(frame: bytes, rid: int) -> bytes:
    o = OFFSET["request_id"]
    return frame[:o] + _RID.pack(rid) + frame[o + 8 :]


def _expected_answers(frames: list[bytes]) -> int:
    """What the service must answer: the envelope rule of the broker, then the NO_REPLY rule."""
    payload = frames[1:] if len(frames) > 1 and frames[0] == b"" else frames
    first = payload[0] if payload else b""
    return 0 if frame_no_reply(first) else 1


def test_mutated_messages_never_produce_internal_and_get_exactly_the_promised_answers(fuzz_target: Running) -> None:
    rng = random.Random(SEED)
    m = Mutator(rng)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(fuzz_target.endpoint)
    errors: Counter[str] = Counter()
    next_rid = 1
    sent = 0
    try:
        while sent < FRAMES:
            expected: dict[int, int] = {}
            anonymous = 0
            for _ in range(min(BATCH, FRAMES - sent)):
                frames = m.mutate(m.seed())
                i = 1 if len(frames) > 1 and frames[0] == b"" else 0
                if i < len(frames) and len(frames[i]) == HEADER_STRUCT.size:
                    frames[i] = _with_rid(_bound_lifetime(frames[i]), next_rid)
                    if _expected_answers(frames):
                        expected[next_rid] = 1
                    next_rid += 1
                else:
                    anonymous += _expected_answers(frames)
                sock.send_multipart(frames)
                sent += 1
            got: Counter[int] = Counter()
            deadline = time.monotonic() + 30
            while (sum(got.values()) < len(expected) + anonymous) and time.monotonic() < deadline:
                if sock.poll(100):
                    reply = sock.recv_multipart()
                    header = reply[1] if reply[0] == b"" else reply[0]
                    got[frame_request_id(header)] += 1
                    errors[REGISTRY.transport_error_names.get(int.from_bytes(header[4:6], "big"), "?")] += 1
            extra = sock.poll(200)
            assert not extra, f"an unexpected extra answer arrived (seed {SEED})"
            anonymous_got = got.pop(0, 0)
            assert anonymous_got == anonymous, (
                f"{anonymous} messages without a request id, {anonymous_got} answers (seed {SEED})"
            )
            assert got == expected, f"answers differ from the promise (seed {SEED}): missing {set(expected) - set(got)}"
    finally:
        sock.close()
    assert errors["INTERNAL"] == 0, f"INTERNAL answered (seed {SEED})"
    assert metric(fuzz_target.metrics_url, "smartcache_messages_total", {"outcome": "internal"}) == 0
    assert metric(fuzz_target.metrics_url, "smartcache_internal_errors_total") == 0
    assert metric(fuzz_target.metrics_url, "smartcache_watchdog_reclaimed_total") == 0
    assert errors["NONE"] > 0, "no mutated message was valid: the fuzzer explores too little"
    assert sum(errors.values()) > FRAMES // 2
    assert TRANSPORT_ERROR["BAD_BODY"]
    assert errors["BAD_BODY"] > 0
