"""CURVE keys as files: a client's key pair, key generation, and what a key may send.

ZeroMQ certificate files (ZPL text, as ``zmq.auth`` writes them) hold a public
key, and for the secret file also the secret key; a public file in the
service's allow-list (``SMARTCACHE_CURVE_CLIENTS_DIR``) may carry a
``permissions`` line in its metadata. ``smartcache-cli keys generate`` writes
such pairs (:func:`create_key_pair`), the server reads the allow-list
(service/smartcache/server/security.py), and a client loads its pair
(:class:`CurveKeys`). SECURITY.md is the operator's guide.

Permissions: a comma-separated list of message type names (``*`` wildcards
allowed: ``EVENTS_*``) and groups: ``@read`` (types that change nothing),
``@write`` (types that change data), ``@operator`` (INFO). PING is always
allowed.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth

from smartcache.wire.registry import REGISTRY, MessageSpec

_PING = REGISTRY.types["PING"].id


def _writes(t: MessageSpec) -> bool:
    return any(f.name == "idempotency_key" for f in t.request)


GROUPS: dict[str, frozenset[int]] = {
    "@operator": frozenset({REGISTRY.types["INFO"].id}),
    "@write": frozenset(t.id for t in REGISTRY.types.values() if _writes(t)),
    "@read": frozenset(t.id for t in REGISTRY.types.values() if not _writes(t) and t.name != "INFO"),
}


def permitted_types(spec: str) -> frozenset[int]:
    """The type ids a permissions string allows; raises ValueError naming an unknown entry."""
    allowed: set[int] = {_PING}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        if item in GROUPS:
            allowed |= GROUPS[item]
            continue
        matched = {t.id for t in REGISTRY.types.values() if fnmatch.fnmatchcase(t.name, item)}
        if not matched:
            raise ValueError(f"permission {item!r} names no message type or group ({', '.join(GROUPS)})")
        allowed |= matched
    return frozenset(allowed)


def create_key_pair(directory: Path, name: str, permissions: str | None = None) -> tuple[Path, Path]:
    """Write NAME.key (public, with the permissions in its metadata) and NAME.key_secret into directory.

    pyzmq's create_certificates puts metadata in the secret file only; the
    allow-list holds public files, so the permissions are written there too.
    """
    if permissions:
        permitted_types(permissions)  # raises ValueError on a bad entry, before anything is written
    metadata = {"permissions": f'"{permissions}"'} if permissions else None
    public, secret = zmq.auth.create_certificates(directory, name, metadata=metadata)
    if metadata:
        text = Path(public).read_text()
        Path(public).write_text(
            text.replace("metadata\n", f"metadata\n    permissions = {metadata['permissions']}\n", 1)
        )
    return Path(public), Path(secret)


def read_metadata(path: Path) -> dict[str, str]:
    """The ``metadata`` section of a ZeroMQ certificate file (ZPL: ``key = "value"`` lines)."""
    out: dict[str, str] = {}
    section = ""
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line[0].isspace():
            section = line.strip()
            continue
        if section == "metadata" and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip().strip('"')
    return out


@dataclass(frozen=True, slots=True)
class CurveKeys:
    """A CURVE client's keys (z85): the server's public key and our own pair (SECURITY.md)."""

    server_public: bytes
    public: bytes
    secret: bytes

    @classmethod
    def from_files(cls, server_key_file: str | Path, key_file: str | Path) -> CurveKeys:
        """From ZeroMQ certificate files: the server's public one and our secret one (smartcache-cli keys generate)."""
        server_public, _ = zmq.auth.load_certificate(server_key_file)
        public, secret = zmq.auth.load_certificate(key_file)
        if secret is None:
            raise ValueError(f"{key_file} holds no secret key (use the *.key_secret file)")
        return cls(server_public, public, secret)

    def apply(self, sock: zmq.Socket[Any]) -> None:
        """Make sock (before connect) a CURVE client of the server."""
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret
