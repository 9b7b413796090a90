"""The codec agrees with every test vector in proto/vectors/vectors.json."""

import json
from pathlib import Path
from typing import Any

import pytest

from smartcache.wire import Header, decode_body, decode_header, encode_body, encode_header
from smartcache.wire.errors import ProtocolError

VECTORS = json.loads((Path(__file__).parents[2] / "proto" / "vectors" / "vectors.json").read_text())


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@pytest.mark.parametrize("vec", VECTORS["valid"], ids=lambda v: v["name"])
def test_valid_vector_decodes_to_its_meaning_and_encodes_back(vec: dict[str, Any]) -> None:
    header_frame, body_frame = (bytes.fromhex(f) for f in vec["frames"])
    h = decode_header(header_frame)
    assert {**h._asdict(), "session_id": h.session_id.hex()} == vec["header"]
    body = decode_body(body_frame)
    assert _plain(body) == vec["body"]
    assert encode_header(Header(**h._asdict())) == header_frame
    if body_frame:
        assert encode_body(body) == body_frame


@pytest.mark.parametrize("vec", VECTORS["invalid"], ids=lambda v: v["name"])
def test_invalid_vector_raises_its_transport_error(vec: dict[str, Any]) -> None:
    header_frame, body_frame = (bytes.fromhex(f) for f in vec["frames"])

    def decode() -> None:
        decode_header(header_frame)
        decode_body(body_frame)

    with pytest.raises(ProtocolError) as e:
        decode()
    assert e.value.transport_error == vec["error"]


def test_vectors_cover_every_decoder_error() -> None:
    assert {v["error"] for v in VECTORS["invalid"]} >= {
        "BAD_HEADER",
        "UNSUPPORTED_VERSION",
        "UNKNOWN_SYSTEM",
        "UNKNOWN_TYPE",
        "BAD_BODY",
    }
