"""What is generated from the registry (proto/protocol.toml): PROTOCOL.md's code tables and the
client's status enums (service/smartcache/wire/status.py).

The spec's prose is written by hand; its tables of message types, statuses
and transport errors are not: each sits between ``<!-- generated: NAME -->``
and ``<!-- end generated -->`` and is rendered here from the registry, so the
two cannot disagree. The same goes for ``Status`` and ``TransportError``, the
enums a client compares replies with: a module written here, so that type
checkers see every member. ``make lint`` runs ``--check`` (fails when either
differs); ``python -m smartcache.wire.gendoc --write`` updates both.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from smartcache.wire import REGISTRY, FieldSpec, Registry

#: the checkout: service/smartcache/wire/gendoc.py -> the top level
ROOT = Path(__file__).resolve().parents[3]
PROTOCOL_MD = ROOT / "proto" / "PROTOCOL.md"
STATUS_PY = Path(__file__).resolve().parent / "status.py"
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


def _members(names: list[tuple[str, int, str]]) -> str:
    lines = []
    for name, code, doc in names:
        lines += textwrap.wrap(f"{code}: {doc}", 112, initial_indent="    #: ", subsequent_indent="    #: ")
        lines.append(f'    {name} = "{name}"')
    return "\n".join(lines)


def status_module(r: Registry) -> str:
    """service/smartcache/wire/status.py: the statuses and transport errors as string enums, with their codes."""
    statuses = [(n, c, r.docs[n]) for n, c in sorted(r.statuses.items(), key=lambda kv: kv[1])]
    statuses = [s for s in statuses if s[0] not in r.storage_only_statuses]
    errors = [(n, c, r.docs[n]) for n, c in sorted(r.transport_errors.items(), key=lambda kv: kv[1])]
    return f'''"""The reply statuses and transport errors as enums: generated from proto/protocol.toml, do not edit.

``python -m smartcache.wire.gendoc --write`` writes this file; ``make lint`` fails when it differs
from the registry. Members are strings equal to their names (``Status.NOT_FOUND == "NOT_FOUND"``),
so ``reply.status == Status.NOT_FOUND`` and ``reply.status == "NOT_FOUND"`` are the same test;
``.code`` is the number on the wire (``reply.body["status"]``).
"""

from __future__ import annotations

from enum import StrEnum

from smartcache.wire.registry import REGISTRY


class Status(StrEnum):
    """A reply's data-level status (``Reply.status``). Statuses only storage uses are not here."""

{_members(statuses)}
    #: a status code this client does not know (a newer service): ``reply.body["status"]`` has the number
    UNKNOWN = "UNKNOWN"

    @property
    def code(self) -> int:
        """The status code on the wire (-1 for UNKNOWN)."""
        return REGISTRY.statuses.get(self.value, -1)


class TransportError(StrEnum):
    """Why a message failed in delivery (``RequestError.transport_error``); 0 on the wire is no error."""

{_members(errors)}
    #: no reply within the client's timeout (the client's own; never on the wire)
    TIMEOUT = "TIMEOUT"

    @property
    def code(self) -> int:
        """The transport error code on the wire (-1 for TIMEOUT)."""
        return REGISTRY.transport_errors.get(self.value, -1)
'''


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 when what is generated differs from the registry")
    mode.add_argument("--write", action="store_true", help="rewrite PROTOCOL.md's tables and wire/status.py")
    args = p.parse_args()
    text = PROTOCOL_MD.read_text()
    fresh = render(text)
    module = status_module(REGISTRY)
    if args.write:
        PROTOCOL_MD.write_text(fresh)
        STATUS_PY.write_text(module)
        return 0
    stale = [
        p.relative_to(ROOT)
        for p, new, old in ((PROTOCOL_MD, fresh, text), (STATUS_PY, module, _read(STATUS_PY)))
        if new != old
    ]
    if stale:
        names = ", ".join(str(p) for p in stale)
        print(f"{names} differ from proto/protocol.toml; run: python -m smartcache.wire.gendoc --write")  # noqa: T201
        return 1
    return 0


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


if __name__ == "__main__":
    sys.exit(main())
