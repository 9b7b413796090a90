"""Seed tests/fuzz/corpus with the protocol's test vectors (header + body, as one input each)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    corpus = ROOT / "tests" / "fuzz" / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    vectors = json.loads((ROOT / "proto" / "vectors" / "vectors.json").read_text())
    for vec in vectors["valid"] + vectors["invalid"]:
        header, body = (bytes.fromhex(f) for f in vec["frames"][:2])
        data = bytes([len(header)]) + header + body  # the fuzz target's first byte picks the split
        (corpus / hashlib.sha1(data).hexdigest()).write_bytes(data)


if __name__ == "__main__":
    main()
