"""Who may talk to the service, and what each may ask: CURVE, ZAP and per-key permissions.

With ``SMARTCACHE_CURVE_SECRET_KEY_FILE`` set, the client socket is a CurveZMQ
server (RFC 26): traffic is encrypted, and a client must prove it holds a key
listed in ``SMARTCACHE_CURVE_CLIENTS_DIR`` (one ZeroMQ certificate file per
allowed public key, as ``smartcache-cli keys generate`` writes them). pyzmq's
ZAP authenticator (RFC 27) asks :class:`KeyRing` about each connecting key; a
key that is not allowed never gets a frame processed. The authenticator
reports the key as the connection's ``User-Id``, which the broker reads on
every message to apply that key's permissions (``FORBIDDEN`` otherwise), so a
key removed from the directory stops working at once, even on an open
connection. The directory is read again on SIGHUP and when it changes.

Permissions: a certificate's metadata may say ``permissions = "..."``, a
comma-separated list of message type names (``*`` wildcards allowed:
``EVENTS_*``) and groups: ``@read`` (types that change nothing), ``@write``
(types that change data), ``@operator`` (INFO). Without it: ``*``, every
type. PING is always allowed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from smartcache.server.metrics import Metrics
from smartcache.wire.keys import permitted_types, read_metadata

log = structlog.get_logger("security")

#: how often the clients directory is checked for changes
WATCH_INTERVAL_S = 1.0
#: at most one log line per reason in this long (the counter counts every one)
LOG_EVERY_S = 10.0


@dataclass(frozen=True)
class ClientKey:
    """One allowed client: its name (the file name) and the type ids it may send."""

    name: str
    types: frozenset[int]


class KeyRing:
    """The allowed client keys, from a directory; safe to read from any thread (replaced whole)."""

    def __init__(self, directory: str, metrics: Metrics) -> None:
        self.directory = Path(directory)
        self._keys: dict[str, ClientKey] = {}
        self._metrics = metrics
        self._failures = metrics.auth_failures
        self._logged: dict[str, float] = {}
        self._mtime = 0
        self._stop = threading.Event()
        self._changed()
        self.reload()

    def reload(self) -> None:
        """Read every certificate in the directory; a bad file is logged and skipped, the rest apply."""
        keys: dict[str, ClientKey] = {}
        for path in sorted(self.directory.glob("*.key")):
            try:
                public, _ = zmq.auth.load_certificate(path)
                types = permitted_types(read_metadata(path).get("permissions", "*"))
            except (OSError, ValueError) as e:
                log.error("client_key_unusable", file=path.name, error=str(e))  # noqa: TRY400 - the message says it all
                continue
            keys[public.decode("ascii")] = ClientKey(path.stem, types)
        added, removed = keys.keys() - self._keys.keys(), self._keys.keys() - keys.keys()
        self._keys = keys
        self._metrics.auth_keys.set(len(keys))
        log.info("client_keys_loaded", keys=len(keys), added=len(added), removed=len(removed))

    # -- pyzmq's CURVE credentials provider -------------------------------------

    def callback(self, domain: str, key: bytes) -> bool:
        """Called by the ZAP authenticator for every connecting key (z85 text)."""
        z85 = key.decode("ascii") if isinstance(key, bytes) else str(key)
        if z85 in self._keys:
            return True
        if self._changed():  # a key added a moment ago works before the watcher's next look
            self.reload()
            if z85 in self._keys:
                return True
        self.failed("unknown_key", key_id=z85[:8])
        return False

    def failed(self, reason: str, **fields: Any) -> None:
        """Count an authentication failure; log it at most once per LOG_EVERY_S per reason."""
        self._failures.labels(reason).inc()
        now = time.monotonic()
        if now - self._logged.get(reason, 0.0) >= LOG_EVERY_S:
            self._logged[reason] = now
            log.warning("auth_failed", reason=reason, **fields)

    # -- per message --------------------------------------------------------------

    def allows(self, user_id: str | None, type_id: int) -> bool:
        client = self._keys.get(user_id or "")
        return client is not None and type_id in client.types

    def name_of(self, user_id: str | None) -> str:
        client = self._keys.get(user_id or "")
        return client.name if client else "unknown"

    # -- reload when the directory changes ------------------------------------

    def watch(self) -> None:
        """Reload in a daemon thread whenever the directory's modification time changes."""
        self._changed()
        threading.Thread(target=self._watch, name="client-keys", daemon=True).start()

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL_S):
            if self._changed():
                self.reload()

    def _changed(self) -> bool:
        """Whether the directory changed since we last looked (and remember this look)."""
        try:
            mtime = self.directory.stat().st_mtime_ns
        except OSError:
            return False
        changed, self._mtime = mtime != self._mtime, mtime
        return changed

    def stop(self) -> None:
        self._stop.set()


class Curve:
    """The server side of CURVE for one context: key pair, ZAP authenticator, key ring."""

    def __init__(self, *, secret_key_file: str, clients_dir: str, context: zmq.Context[Any], metrics: Metrics) -> None:
        self.public_key, self.secret_key = zmq.auth.load_certificate(secret_key_file)
        self.keyring = KeyRing(clients_dir, metrics)
        self._auth = ThreadAuthenticator(context)

    def start(self) -> None:
        self._auth.start()
        self._auth.configure_curve_callback(domain="*", credentials_provider=self.keyring)
        self.keyring.watch()

    def secure(self, sock: zmq.Socket[Any]) -> None:
        """Make a socket (before bind) a CURVE server with our key pair."""
        sock.curve_server = True
        sock.curve_secretkey = self.secret_key
        sock.curve_publickey = self.public_key

    def stop(self) -> None:
        self.keyring.stop()
        self._auth.stop()
