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
import time
from collections import Counter
from collections.abc import Iterator

import pytest
import zmq

from smartcache.devstack.stack import Tarantool, free_port
from smartcache.wire import (
    HEADER_STRUCT,
    REGISTRY,
    TRANSPORT_ERROR,
    frame_request_id,
)
from tests.conftest import Running, running_service, service_settings
from tests.helpers import metric
from tests.mutator import Mutator, bound_lifetime, expected_answers, with_rid

FRAMES = int(os.environ.get("SMARTCACHE_FUZZ_FRAMES", "40000"))
SEED = int(os.environ.get("SMARTCACHE_FUZZ_SEED", str(random.SystemRandom().randrange(2**32))))
BATCH = 500


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
                    frames[i] = with_rid(bound_lifetime(frames[i]), next_rid)
                    if expected_answers(frames):
                        expected[next_rid] = 1
                    next_rid += 1
                else:
                    anonymous += expected_answers(frames)
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
