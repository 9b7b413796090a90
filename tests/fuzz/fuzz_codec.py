"""Coverage-guided fuzzing of the wire codec with atheris (libFuzzer): `make fuzz`.

Every input is split into a header frame and a body frame and decoded the way
the service decodes a client's message. Decoding must either succeed or raise
a ProtocolError (answered with its transport error); anything else is a
crash. A decoded header must encode back to the same bytes, and a decoded body
must be a map with string keys whose encoding survives a decode.

    .venv/bin/python tests/fuzz/fuzz_codec.py tests/fuzz/corpus -max_total_time=600

The corpus in tests/fuzz/corpus/ starts from the protocol's test vectors
(`make fuzz` seeds it) and keeps what the fuzzer finds interesting.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    import msgpack

    from smartcache.wire import HEADER_STRUCT, decode_body, decode_header, encode_body, encode_header
    from smartcache.wire.errors import ProtocolError

HEADER_SIZE = HEADER_STRUCT.size


def _check_body(body: object) -> None:
    assert isinstance(body, dict)
    stack = [body]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            assert all(isinstance(k, str) for k in node)
            stack.extend(v for v in node.values() if isinstance(v, dict | list))
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, dict | list))
        assert not isinstance(node, msgpack.Timestamp | msgpack.ExtType)


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    split = fdp.ConsumeIntInRange(0, min(len(data), 64))
    rest = fdp.ConsumeBytes(len(data))
    header_frame, body_frame = rest[:split], rest[split:]
    if len(header_frame) != HEADER_SIZE and len(rest) >= HEADER_SIZE and fdp.remaining_bytes() == 0:
        header_frame, body_frame = rest[:HEADER_SIZE], rest[HEADER_SIZE:]
    try:
        header = decode_header(header_frame)
    except ProtocolError:
        pass
    else:
        assert encode_header(header) == header_frame
    try:
        body = decode_body(body_frame)
    except ProtocolError:
        return
    _check_body(body)
    once = encode_body(body)  # compared as bytes: a NaN is not equal to itself
    assert encode_body(decode_body(once)) == once


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
