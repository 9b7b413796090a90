"""Settings from the environment, for every program of the house: one reader and the parsers of common values.

The service (server/config.py), the operator's console (console/settings.py) and
``smartcache-cli cluster`` (the operator's credentials, cli/admin.py) read their
``SMARTCACHE_*`` variables through `Environment`: a value is stripped and an empty one is unset
(its default); a bad one is recorded with its name (``SMARTCACHE_X='bad': what is expected``) and
replaced by its default, so every bad variable is reported at once and one restart fixes them
all; a secret comes from ``SMARTCACHE_<NAME>`` or from the file ``SMARTCACHE_<NAME>_FILE`` names
(Docker secrets), never both. Each parser here takes one kind of value and raises SettingsError
saying what is expected; the service's own kinds (endpoints to bind, templates, bulkheads...)
are in server/parsers.py. Every variable, its default, its range and its meaning are listed in
docs/configuration.md.

It imports only the wire (the cluster name's form): the server, the console and the CLI may all use it.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from smartcache.wire.topology import CLUSTER_NAME

PREFIX = "SMARTCACHE_"
MAX_PORT = 65535
#: the session key (SMARTCACHE_SESSION_KEY): 32 bytes, written as 64 hex characters
SESSION_KEY_BYTES = 32
HOSTNAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})")
ENVIRONMENTS = ("development", "production")

T = TypeVar("T")


class SettingsError(ValueError):
    """An environment variable (or an option) has a value the program cannot use; the message names it."""


class Environment:
    """Reads SMARTCACHE_* variables; a bad value is recorded (named) and replaced by its default."""

    def __init__(self, env: Mapping[str, str], prefix: str = PREFIX) -> None:
        self.env = env
        self.prefix = prefix
        self.errors: list[str] = []
        #: every variable asked for (unknown_variables: those set that nobody reads)
        self.read: set[str] = set()

    def get(self, name: str, default: T, parse: Callable[[str], T]) -> T:
        """The parsed value of SMARTCACHE_<name>; unset or empty means default."""
        self.read.add(self.prefix + name)
        raw = self.env.get(self.prefix + name, "").strip()
        if not raw:
            return default
        try:
            return parse(raw)
        except (SettingsError, ValueError) as e:
            self.errors.append(f"{self.prefix}{name}={raw!r}: {e}")
            return default

    def secret(self, name: str, default: str) -> str:
        """SMARTCACHE_<name>, or the content of the file named by SMARTCACHE_<name>_FILE (Docker secrets)."""
        path = self.get(name + "_FILE", "", str)
        value = self.get(name, "", str)
        if path and value:
            self.fail(f"{self.prefix}{name} and {self.prefix}{name}_FILE are both set: set one")
        if not path:
            return value or default
        try:
            return Path(path).read_text().strip()
        except OSError as e:
            self.fail(f"{self.prefix}{name}_FILE={path!r}: cannot read it ({e.strerror})")
            return default

    def session_key(self, name: str = "SESSION_KEY") -> bytes:
        """The session key from SMARTCACHE_<name> or its _FILE (32 bytes as 64 hex characters), b"" when unset.

        A bad one is named, never shown: the message says what is wrong with it, not what it is."""
        raw = self.secret(name, "")
        if not raw:
            return b""
        try:
            return parse_session_key(raw)
        except SettingsError as e:
            self.fail(f"{self.prefix}{name} (or {self.prefix}{name}_FILE): {e}")
            return b""

    def fail(self, message: str) -> None:
        self.errors.append(message)

    def check(self) -> None:
        """SettingsError naming every bad variable read so far, if any."""
        if self.errors:
            raise SettingsError("; ".join(self.errors))


# -- the parsers of common values -------------------------------------------------------------


def parse_integer(low: int, high: int | None = None, high_name: str = "") -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise SettingsError("not an integer") from None
        if value < low or (high is not None and value > high):
            upper = f"{high} ({high_name})" if high_name else str(high)
            raise SettingsError(f"must be at least {low}" if high is None else f"must be in {low}..{upper}")
        return value

    return parse


def parse_seconds(low: float) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise SettingsError("not a number of seconds") from None
        if not math.isfinite(value) or value < low:
            raise SettingsError(f"must be a number of seconds, at least {low}")
        return value

    return parse


def parse_port(*, allow_any: bool = False) -> Callable[[str], int]:
    low = 0 if allow_any else 1
    note = " (0: any free port)" if allow_any else ""

    def parse(raw: str) -> int:
        if not raw.isdigit() or not low <= int(raw) <= MAX_PORT:
            raise SettingsError(f"must be a port number {low}..{MAX_PORT}{note}")
        return int(raw)

    return parse


def parse_host(raw: str) -> str:
    """An IP address (IPv6 without brackets) or a host name."""
    try:
        ipaddress.ip_address(raw)
    except ValueError:
        if not HOSTNAME.fullmatch(raw):
            raise SettingsError("must be an IP address or a host name") from None
    return raw


def host_port(raw: str) -> tuple[str, int]:
    """'host:port' (IPv6 as '[addr]:port') -> (host, port); port 1..65535."""
    host, sep, port = raw.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host:
        raise SettingsError(f"{raw!r} must be host:port")
    try:
        parse_host(host)
        parse_port()(port)
    except SettingsError as e:
        raise SettingsError(f"{raw!r}: {e}") from None
    return host, int(port)


def parse_host_port_list(raw: str) -> tuple[str, ...]:
    addresses = tuple(a.strip() for a in raw.split(",") if a.strip())
    if not addresses:
        raise SettingsError("must be host:port[,host:port...]")
    for a in addresses:
        host_port(a)
    return addresses


def parse_http_url(raw: str, *, base: bool = True) -> str:
    """An http(s) URL with a host; a base URL (base=True) has no query or fragment."""
    try:
        url = urlsplit(raw)
        url.port  # noqa: B018 - raises ValueError when out of range
    except ValueError as e:
        raise SettingsError(f"must be an http:// or https:// URL ({e})") from None
    if url.scheme not in ("http", "https") or not url.hostname:
        raise SettingsError("must be an http:// or https:// URL with a host")
    if base and (url.query or url.fragment):
        raise SettingsError("must be a base URL, without ?query or #fragment")
    return raw


def parse_etcd_endpoints(raw: str) -> tuple[str, ...]:
    """Comma-separated etcd client URLs (http:// when no scheme is given), each with a host and a port."""
    out = []
    for e in (x.strip().rstrip("/") for x in raw.split(",") if x.strip()):
        url = e if "://" in e else "http://" + e
        parse_http_url(url)
        if urlsplit(url).port is None or urlsplit(url).path:
            raise SettingsError(f"{e!r} must be http://host:port (an etcd client URL)")
        out.append(url)
    if not out:
        raise SettingsError("must be http://host:port[,http://host:port...]")
    return tuple(out)


def parse_cluster_name(raw: str) -> str:
    """SC_CLUSTER's form: it becomes part of the etcd keys /smartcache/<cluster>/."""
    if not CLUSTER_NAME.fullmatch(raw):
        raise SettingsError("must be 1-64 letters, digits and . _ - (a letter or digit first), as SC_CLUSTER")
    return raw


def parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SettingsError("must be 1/true/yes or 0/false/no")


def parse_session_key(raw: str) -> bytes:
    """A session key: 64 hex characters, 32 bytes (``openssl rand -hex 32``). The error never repeats the value."""
    hex_only = all(c in "0123456789abcdefABCDEF" for c in raw)
    if len(raw) != 2 * SESSION_KEY_BYTES or not hex_only:
        found = f"{len(raw)} characters" + ("" if hex_only else ", not all hex")
        raise SettingsError(
            f"must be {2 * SESSION_KEY_BYTES} hex characters ({SESSION_KEY_BYTES} bytes: `openssl rand -hex 32`); "
            f"it has {found}"
        )
    return bytes.fromhex(raw)


def parse_environment(raw: str) -> str:
    """SMARTCACHE_ENV: development, or production (which refuses development defaults)."""
    if raw not in ENVIRONMENTS:
        raise SettingsError(f"must be one of {', '.join(ENVIRONMENTS)}")
    return raw
