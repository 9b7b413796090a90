"""The registry: every number of the wire protocol, loaded once from ``proto/protocol.toml``.

The types, statuses, transport errors, flags and limits live in the TOML file
(the spec's ``proto/PROTOCOL.md`` tables are generated from it); this module
parses and checks it and holds no second copy. The codec (:mod:`.header`,
:mod:`.body`), the server's validation, priorities, lifetimes and bulkheads,
and the metric series all read this one :data:`REGISTRY`.
"""

from __future__ import annotations

import importlib.resources
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _registry_path() -> Path:
    """SMARTCACHE_PROTOCOL, else the registry installed with the package (package data
    ``smartcache.wire.spec``, which is proto/ in the source tree), else proto/ beside the package."""
    override = os.environ.get("SMARTCACHE_PROTOCOL")
    if override:
        return Path(override)
    try:
        resource = importlib.resources.files("smartcache.wire.spec").joinpath("protocol.toml")
        with importlib.resources.as_file(resource) as path:
            if path.exists():
                return path
    except ModuleNotFoundError:
        pass
    return Path(__file__).resolve().parents[3] / "proto" / "protocol.toml"  # a checkout: service/smartcache/wire/


REGISTRY_PATH = _registry_path()

_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "bytes": (bytes,),
    "uuid": (bytes,),
    "list": (list,),
    "any": (object,),
}


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One body field of a message type: its type name and whether it may be absent."""

    name: str
    type: str
    optional: bool

    def accepts(self, value: object) -> bool:
        if self.type == "any":
            return True
        if self.type == "int" and isinstance(value, bool):
            return False
        if self.type == "uuid":
            return isinstance(value, bytes) and len(value) == 16
        return isinstance(value, _FIELD_TYPES[self.type])


@dataclass(frozen=True, slots=True)
class MessageSpec:
    """One message type of the registry."""

    name: str
    id: int
    priority: int
    lifetime_ms: int
    session: str
    request: tuple[FieldSpec, ...]
    reply: tuple[FieldSpec, ...]
    statuses: tuple[str, ...]
    doc: str
    max_busy_percent: int
    #: internal types are made by the service itself; clients may not send them
    internal: bool = False
    #: repeating it leaves the same state and answer (safe to retry after OUTCOME_UNKNOWN)
    idempotent: bool = False
    #: False: never answered, errors included (APP_START)
    answered: bool = True
    #: an OK reply carries the created session's id in the header; any other answer zero
    creates_session: bool = False

    def check_request(self, body: Mapping[str, Any]) -> str | None:
        """Return why ``body`` is not a valid request of this type, or None."""
        for f in self.request:
            if f.name not in body:
                if not f.optional:
                    return f"missing field {f.name!r}"
            elif not f.accepts(body[f.name]) and not (f.optional and body[f.name] is None):
                return f"field {f.name!r} must be {f.type}"
        return None


@dataclass(frozen=True, slots=True)
class Registry:
    """The parsed ``protocol.toml``."""

    version: int
    header_size: int
    max_body_bytes: int
    max_depth: int
    max_lifetime_ms: int
    #: the largest wait_ms the service takes ([limits.wait_ms]; the other [limits] are storage's checks)
    max_wait_ms: int
    systems: Mapping[str, int]
    flags: Mapping[str, int]
    statuses: Mapping[str, int]
    transport_errors: Mapping[str, int]
    types: Mapping[str, MessageSpec]
    types_by_id: Mapping[int, MessageSpec] = field(default_factory=dict)
    status_names: Mapping[int, str] = field(default_factory=dict)
    transport_error_names: Mapping[int, str] = field(default_factory=dict)
    #: statuses whose reply has DATA_ERROR set and an error object body
    data_error_statuses: frozenset[str] = frozenset()
    #: statuses only stored procedures return; never sent to clients
    storage_only_statuses: frozenset[str] = frozenset()
    #: transport error -> whether the message may have been executed: "yes", "no" or "unknown"
    executed: Mapping[str, str] = field(default_factory=dict)
    #: transport errors that mean the sender's message was malformed
    bad_input_errors: frozenset[str] = frozenset()
    #: transport errors a retry cannot change: bad input, and refusals like FORBIDDEN
    final_errors: frozenset[str] = frozenset()
    #: status or transport error name -> its meaning (for PROTOCOL.md's tables)
    docs: Mapping[str, str] = field(default_factory=dict)


def _fields(table: Mapping[str, str]) -> tuple[FieldSpec, ...]:
    out = []
    for name, spec in table.items():
        optional = spec.endswith("?")
        type_name = spec.rstrip("?")
        if type_name not in _FIELD_TYPES:
            raise ValueError(f"unknown field type {spec!r} for {name!r}")
        out.append(FieldSpec(name, type_name, optional))
    return tuple(out)


def _codes(table: Mapping[str, Any]) -> dict[str, int]:
    return {name: int(entry["code"]) for name, entry in table.items()}


def load_registry(path: Path = REGISTRY_PATH) -> Registry:
    """Load and check the registry; raises ValueError on an inconsistent file."""
    with path.open("rb") as f:
        raw = tomllib.load(f)
    statuses = _codes(raw["statuses"])
    types = {}
    for name, t in raw["types"].items():
        unknown = set(t["statuses"]) - statuses.keys()
        if unknown:
            raise ValueError(f"{name}: unknown statuses {sorted(unknown)}")
        if t["session"] not in ("required", "optional", "none"):
            raise ValueError(f"{name}: bad session rule {t['session']!r}")
        types[name] = MessageSpec(
            name=name,
            id=int(t["id"]),
            priority=int(t["priority"]),
            lifetime_ms=int(t["lifetime_ms"]),
            session=t["session"],
            request=_fields(t["request"]),
            reply=_fields(t["reply"]),
            statuses=tuple(t["statuses"]),
            doc=t["doc"],
            max_busy_percent=int(t["max_busy_percent"]),
            internal=bool(t.get("internal", False)),
            idempotent=bool(t["idempotent"]),
            answered=bool(t.get("answered", True)),
            creates_session=bool(t.get("creates_session", False)),
        )
    transport_errors = _codes(raw["transport_errors"])
    for what, table in (
        ("type", {t.name: t.id for t in types.values()}),
        ("status", statuses),
        ("transport error", transport_errors),
    ):
        if len(set(table.values())) != len(table):
            raise ValueError(f"duplicate {what} codes in {path}")
    proto = raw["protocol"]
    return Registry(
        version=int(proto["version"]),
        header_size=int(proto["header_size"]),
        max_body_bytes=int(proto["max_body_bytes"]),
        max_depth=int(proto["max_depth"]),
        max_lifetime_ms=int(proto["max_lifetime_ms"]),
        max_wait_ms=int(raw["limits"]["wait_ms"]["max"]),
        systems=dict(raw["systems"]),
        flags=dict(raw["flags"]),
        statuses=statuses,
        transport_errors=transport_errors,
        types=types,
        types_by_id={t.id: t for t in types.values()},
        status_names={v: k for k, v in statuses.items()},
        transport_error_names={v: k for k, v in transport_errors.items()},
        data_error_statuses=frozenset(k for k, v in raw["statuses"].items() if v.get("data_error")),
        storage_only_statuses=frozenset(k for k, v in raw["statuses"].items() if v.get("storage_only")),
        executed={k: str(v["executed"]) for k, v in raw["transport_errors"].items()},
        bad_input_errors=frozenset(k for k, v in raw["transport_errors"].items() if v.get("bad_input")),
        final_errors=frozenset(k for k, v in raw["transport_errors"].items() if v.get("bad_input") or v.get("final")),
        docs={k: str(v["doc"]) for table in ("statuses", "transport_errors") for k, v in raw[table].items()},
    )


REGISTRY = load_registry()
STATUS = REGISTRY.statuses
TRANSPORT_ERROR = REGISTRY.transport_errors
FLAG_DATA_ERROR = REGISTRY.flags["DATA_ERROR"]
FLAG_NO_REPLY = REGISTRY.flags["NO_REPLY"]
SYSTEM_SMARTCACHE = REGISTRY.systems["SMARTCACHE"]
