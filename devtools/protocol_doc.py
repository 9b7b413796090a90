"""PROTOCOL.md's code tables, generated from the registry (proto/protocol.toml).

The spec's prose is written by hand; its tables of message types, statuses
and transport errors are not: each sits between ``<!-- generated: NAME -->``
and ``<!-- end generated -->`` and is rendered here from the registry, so the
two cannot disagree. ``make lint`` runs ``--check`` (fails when they differ);
``python -m devtools.protocol_doc --write`` updates the file.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from service.protocol import REGISTRY, FieldSpec, Registry

PROTOCOL_MD = Path(__file__).resolve().parent.parent / "proto" / "PROTOCOL.md"
_BLOCK = re.compile(r"(<!-- generated: (\w+) -->\n)(.*?)(<!-- end generated -->)", re.S)


def _fields(fields: tuple[FieldSpec, ...]) -> str:
    return ", ".join(f"{f.name} {f.type}{'?' if f.optional else ''}" for f in fields) or "—"


def types_table(r: Registry) -> str:
    rows = [
        "| Name | Code | Prio | Lifetime ms | Session | Idempotent | Request fields | Reply fields | Statuses |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t in sorted(r.types.values(), key=lambda t: t.id):
        reply = "(never answered)" if not t.answered else "(internal)" if t.internal else _fields(t.reply)
        statuses = ", ".join(t.statuses) or "—"
        rows.append(
            f"| {t.name} | {t.id} | {t.priority} | {t.lifetime_ms} | {t.session} | {'yes' if t.idempotent else 'no'} "
            f"| {_fields(t.request)} | {reply} | {statuses} |"
        )
    return "\n".join(rows) + "\n"


def statuses_table(r: Registry) -> str:
    rows = ["| Name | Code | Error object | Meaning |", "|---|---|---|---|"]
    for name, code in sorted(r.statuses.items(), key=lambda kv: kv[1]):
        kind = "yes" if name in r.data_error_statuses else "no"
        if name in r.storage_only_statuses:
            kind = "— (storage only)"
        rows.append(f"| {name} | {code} | {kind} | {r.docs[name]} |")
    return "\n".join(rows) + "\n"


def transport_errors_table(r: Registry) -> str:
    rows = ["| Name | Code | Executed? | Meaning |", "|---|---|---|---|"]
    for name, code in sorted(r.transport_errors.items(), key=lambda kv: kv[1]):
        rows.append(f"| {name} | {code} | {r.executed[name]} | {r.docs[name]} |")
    return "\n".join(rows) + "\n"


TABLES: dict[str, Callable[[Registry], str]] = {
    "types": types_table,
    "statuses": statuses_table,
    "transport_errors": transport_errors_table,
}


def render(text: str, registry: Registry = REGISTRY) -> str:
    """The document with every generated block rendered anew."""
    seen = set()

    def block(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in TABLES:
            raise ValueError(f"unknown generated block {name!r}")
        seen.add(name)
        return m.group(1) + TABLES[name](registry) + m.group(4)

    out = _BLOCK.sub(block, text)
    missing = set(TABLES) - seen
    if missing:
        raise ValueError(f"PROTOCOL.md lacks generated blocks {sorted(missing)}")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 when PROTOCOL.md's tables differ from the registry")
    mode.add_argument("--write", action="store_true", help="rewrite PROTOCOL.md's tables from the registry")
    args = p.parse_args()
    text = PROTOCOL_MD.read_text()
    fresh = render(text)
    if args.write:
        PROTOCOL_MD.write_text(fresh)
        return 0
    if fresh != text:
        print("proto/PROTOCOL.md tables differ from proto/protocol.toml; run: python -m devtools.protocol_doc --write")  # noqa: T201
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
