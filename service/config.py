"""Settings: built once from environment variables at start-up and passed down.

Nothing else in the service reads the environment. Every variable, its default,
its range and its meaning are listed in the README ("Configuration").

Every value is checked here, at start, so that a bad one stops the service with
one ``bad_settings`` line naming the variable, rather than a traceback from
deep inside ZeroMQ, prometheus_client or the storage connector later. Every
bad variable is reported at once, so one restart fixes them all.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from service.protocol import REGISTRY

PREFIX = "SMARTCACHE_"
DEFAULT_LISTEN = "tcp://127.0.0.1:5555"
DEFAULT_TARANTOOL = "127.0.0.1:3301"
DEFAULT_WORKERS = 100
DEFAULT_WORKER_THREADS = 0  # 0: workers share the broker's event loop (measured fastest)
DEFAULT_QUEUE_CAPACITY = 3000
DEFAULT_METRICS_PORT = 9105
DEFAULT_METRICS_ADDR = "127.0.0.1"
DEFAULT_BACKEND_URL = "http://127.0.0.1:8090"
DEFAULT_DRAIN_TIMEOUT_S = 10.0
DEFAULT_STORAGE_CONNECT_TIMEOUT_S = 2.0
DEFAULT_LOG_LEVEL = "info"
DEFAULT_BACKEND_TEMPLATE = "{base}/clients/{client_id}/products/{data_type}"
DEFAULT_BACKEND_CONNECT_TIMEOUT_S = 1.0
DEFAULT_BACKEND_TIMEOUT_S = 5.0
DEFAULT_BACKEND_RETRIES = 2
DEFAULT_BACKEND_MAX_CONNECTIONS = 100
DEFAULT_PREWARM_TYPES = (1, 2, 3, 4)  # accounts, cards, deposits, loans
DEFAULT_PRODUCTS_MAX_AGE_S = 300.0
LEASE_MARGIN_S = 2.0
#: Tarantool refuses longer prewarm leases (lua/smartcache/config.lua, SC_MAX_WAIT_S)
MAX_LEASE_S = 60.0
LOG_LEVELS = ("debug", "info", "warning", "error")
MAX_PORT = 65535
#: sockaddr_un.sun_path holds 108 bytes, the terminating NUL included
MAX_IPC_PATH_BYTES = 107
#: prewarm lease owners are "<instance id>/w<slot>": no "/" in the id
INSTANCE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
HOSTNAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})")
#: settings whose value is never logged
SECRET = re.compile(r"password|token|secret|key", re.IGNORECASE)
#: make run: added to every default port (and smartcache-cli's default endpoint), to move a whole stack at once
PORT_OFFSET_VARIABLE = "SMARTCACHE_PORT_OFFSET"
#: SMARTCACHE_* variables read by other programs (smartcache-cli, make run), not by the service
OTHER_PROGRAMS_VARIABLES = frozenset(
    {"SMARTCACHE_ENDPOINT", "SMARTCACHE_VAR", "SMARTCACHE_PROTOCOL", PORT_OFFSET_VARIABLE}
)


class SettingsError(ValueError):
    """An environment variable has a value the service cannot use."""


@dataclass(frozen=True, slots=True)
class Settings:
    listen: str = DEFAULT_LISTEN
    tarantool: tuple[str, ...] = (DEFAULT_TARANTOOL,)
    tarantool_user: str = "smartcache"
    tarantool_password: str = "smartcache"  # noqa: S105 - local default, documented; set it in production
    workers: int = DEFAULT_WORKERS
    worker_threads: int = DEFAULT_WORKER_THREADS
    queue_capacity: int = DEFAULT_QUEUE_CAPACITY
    metrics_addr: str = DEFAULT_METRICS_ADDR
    metrics_port: int = DEFAULT_METRICS_PORT
    backend_url: str = DEFAULT_BACKEND_URL
    log_level: str = DEFAULT_LOG_LEVEL
    max_body_bytes: int = REGISTRY.max_body_bytes
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    storage_connect_timeout_s: float = DEFAULT_STORAGE_CONNECT_TIMEOUT_S
    instance_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    #: message type name -> most workers busy with it at once
    bulkheads: Mapping[str, int] = field(default_factory=dict)
    backend_template: str = DEFAULT_BACKEND_TEMPLATE
    backend_connect_timeout_s: float = DEFAULT_BACKEND_CONNECT_TIMEOUT_S
    backend_timeout_s: float = DEFAULT_BACKEND_TIMEOUT_S
    backend_retries: int = DEFAULT_BACKEND_RETRIES
    backend_max_connections: int = DEFAULT_BACKEND_MAX_CONNECTIONS
    prewarm_types: tuple[int, ...] = DEFAULT_PREWARM_TYPES
    #: data type -> seconds a prewarmed answer stays fresh (others: products_max_age_s)
    products_max_age: Mapping[int, float] = field(default_factory=dict)
    products_max_age_s: float = DEFAULT_PRODUCTS_MAX_AGE_S

    def max_age_ms(self, data_type: int) -> int:
        return int(self.products_max_age.get(data_type, self.products_max_age_s) * 1000)

    @property
    def lease_ms(self) -> int:
        """A prewarm lease outlives one backend call with its retries, plus a margin."""
        return int(_lease_s(self.backend_timeout_s, self.backend_retries) * 1000)

    def redacted(self) -> dict[str, Any]:
        """Every setting by name, for the start-up log: secrets (password, token, secret, key) as "***"."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = "***" if SECRET.search(f.name) else dict(value) if isinstance(value, Mapping) else value
        return out

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read SMARTCACHE_* variables; raises SettingsError naming every bad one."""
        r = _Env(os.environ if env is None else env)
        settings = _build(r)
        if r.errors:
            raise SettingsError("; ".join(r.errors))
        return settings


def unknown_variables(env: Mapping[str, str] | None = None) -> list[str]:
    """SMARTCACHE_* variables nobody reads: most likely a typo worth a warning."""
    e = os.environ if env is None else env
    r = _Env(e)
    _build(r)
    return sorted(n for n in e if n.startswith(PREFIX) and n not in r.read and n not in OTHER_PROGRAMS_VARIABLES)


T = TypeVar("T")


class _Env:
    """Reads SMARTCACHE_* variables; a bad value is recorded (named) and replaced by its default."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.errors: list[str] = []
        self.read: set[str] = set()

    def get(self, name: str, default: T, parse: Callable[[str], T]) -> T:
        """The parsed value of SMARTCACHE_<name>; unset or empty means default."""
        self.read.add(PREFIX + name)
        raw = self.env.get(PREFIX + name, "").strip()
        if not raw:
            return default
        try:
            return parse(raw)
        except (SettingsError, ValueError) as e:
            self.errors.append(f"{PREFIX}{name}={raw!r}: {e}")
            return default

    def fail(self, message: str) -> None:
        self.errors.append(message)


def _build(r: _Env) -> Settings:
    workers = r.get("WORKERS", DEFAULT_WORKERS, _integer(1))
    backend_url = r.get("BACKEND_URL", DEFAULT_BACKEND_URL, _http_url)
    backend_timeout_s = r.get("BACKEND_TIMEOUT_S", DEFAULT_BACKEND_TIMEOUT_S, _seconds(0.01))
    backend_retries = r.get("BACKEND_RETRIES", DEFAULT_BACKEND_RETRIES, _integer(0, 10))
    if _lease_s(backend_timeout_s, backend_retries) > MAX_LEASE_S:
        r.fail(
            f"{PREFIX}BACKEND_TIMEOUT_S={backend_timeout_s} x (1 + {PREFIX}BACKEND_RETRIES={backend_retries})"
            f" + {LEASE_MARGIN_S} s must be at most {MAX_LEASE_S} s (the longest prewarm lease Tarantool grants)"
        )
    return Settings(
        listen=r.get("LISTEN", DEFAULT_LISTEN, zmq_endpoint),
        tarantool=r.get("TARANTOOL", (DEFAULT_TARANTOOL,), _host_port_list),
        tarantool_user=r.get("TARANTOOL_USER", "smartcache", str),
        tarantool_password=r.get("TARANTOOL_PASSWORD", "smartcache", str),
        workers=workers,
        worker_threads=r.get("WORKER_THREADS", DEFAULT_WORKER_THREADS, _integer(0, workers, "SMARTCACHE_WORKERS")),
        queue_capacity=r.get("QUEUE_CAPACITY", DEFAULT_QUEUE_CAPACITY, _integer(1)),
        metrics_addr=r.get("METRICS_ADDR", DEFAULT_METRICS_ADDR, _host),
        metrics_port=r.get("METRICS_PORT", DEFAULT_METRICS_PORT, _port(allow_any=True)),
        backend_url=backend_url,
        log_level=r.get("LOG_LEVEL", DEFAULT_LOG_LEVEL, _log_level),
        max_body_bytes=r.get("MAX_BODY_BYTES", REGISTRY.max_body_bytes, _integer(64, REGISTRY.max_body_bytes)),
        drain_timeout_s=r.get("DRAIN_TIMEOUT_S", DEFAULT_DRAIN_TIMEOUT_S, _seconds(0)),
        storage_connect_timeout_s=r.get("STORAGE_CONNECT_TIMEOUT_S", DEFAULT_STORAGE_CONNECT_TIMEOUT_S, _seconds(0.1)),
        instance_id=r.get("INSTANCE_ID", f"{socket.gethostname()}-{os.getpid()}", _instance_id),
        bulkheads=r.get("BULKHEADS", _bulkheads("", workers), lambda spec: _bulkheads(spec, workers)),
        backend_template=r.get("BACKEND_TEMPLATE", DEFAULT_BACKEND_TEMPLATE, lambda t: _template(t, backend_url)),
        backend_connect_timeout_s=r.get("BACKEND_CONNECT_TIMEOUT_S", DEFAULT_BACKEND_CONNECT_TIMEOUT_S, _seconds(0.01)),
        backend_timeout_s=backend_timeout_s,
        backend_retries=backend_retries,
        backend_max_connections=r.get("BACKEND_MAX_CONNECTIONS", DEFAULT_BACKEND_MAX_CONNECTIONS, _integer(1)),
        prewarm_types=r.get("PREWARM_TYPES", DEFAULT_PREWARM_TYPES, _data_types),
        products_max_age=r.get("PRODUCTS_MAX_AGE", {}, _max_ages),
        products_max_age_s=r.get("PRODUCTS_MAX_AGE_S", DEFAULT_PRODUCTS_MAX_AGE_S, _seconds(0)),
    )


def _lease_s(backend_timeout_s: float, backend_retries: int) -> float:
    return backend_timeout_s * (1 + backend_retries) + LEASE_MARGIN_S


# -- parsers: one per kind of value; each raises SettingsError saying what is expected ----------


def _integer(low: int, high: int | None = None, high_name: str = "") -> Callable[[str], int]:
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


def _seconds(low: float) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise SettingsError("not a number of seconds") from None
        if not math.isfinite(value) or value < low:
            raise SettingsError(f"must be a number of seconds, at least {low}")
        return value

    return parse


def _port(*, allow_any: bool = False) -> Callable[[str], int]:
    low = 0 if allow_any else 1
    note = " (0: any free port)" if allow_any else ""

    def parse(raw: str) -> int:
        if not raw.isdigit() or not low <= int(raw) <= MAX_PORT:
            raise SettingsError(f"must be a port number {low}..{MAX_PORT}{note}")
        return int(raw)

    return parse


def _host(raw: str) -> str:
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
        _host(host)
        _port()(port)
    except SettingsError as e:
        raise SettingsError(f"{raw!r}: {e}") from None
    return host, int(port)


def zmq_endpoint(raw: str) -> str:
    """A ZeroMQ endpoint to bind: tcp://host:port (port 0 or * for any free port) or ipc://path."""
    scheme, sep, rest = raw.partition("://")
    if not sep or scheme not in ("tcp", "ipc"):
        raise SettingsError("must be tcp://host:port or ipc://path")
    if scheme == "ipc":
        if not rest:
            raise SettingsError("ipc:// needs a path")
        if len(rest.encode()) > MAX_IPC_PATH_BYTES:
            raise SettingsError(f"ipc path is longer than {MAX_IPC_PATH_BYTES} bytes")
        if not rest.startswith("@") and not Path(rest).parent.is_dir():  # @name: Linux abstract namespace
            raise SettingsError(f"directory {str(Path(rest).parent)!r} does not exist")
        return raw
    host, sep, port = rest.rpartition(":")
    if not sep or not host:
        raise SettingsError("must be tcp://host:port")
    if host != "*":
        _host(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
    if port != "*":
        _port(allow_any=True)(port)
    return raw


def _host_port_list(raw: str) -> tuple[str, ...]:
    addresses = tuple(a.strip() for a in raw.split(",") if a.strip())
    if not addresses:
        raise SettingsError("must be host:port[,host:port...]")
    for a in addresses:
        host_port(a)
    return addresses


def _http_url(raw: str, *, base: bool = True) -> str:
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


def _template(raw: str, base: str) -> str:
    if "{client_id}" not in raw or "{data_type}" not in raw:
        raise SettingsError("must contain {client_id} and {data_type}")
    try:
        url = raw.format(base=base.rstrip("/"), client_id="c", data_type=1)
    except (KeyError, IndexError, ValueError) as e:
        raise SettingsError(f"only {{base}}, {{client_id}} and {{data_type}} may be used ({e!r})") from None
    _http_url(url, base=False)
    return raw


def _log_level(raw: str) -> str:
    level = raw.lower()
    if level not in LOG_LEVELS:
        raise SettingsError(f"must be one of {', '.join(LOG_LEVELS)}")
    return level


def _instance_id(raw: str) -> str:
    if not INSTANCE_ID.fullmatch(raw):
        raise SettingsError("must be 1-128 characters: letters, digits and . _ : @ - (not first)")
    return raw


def _bulkheads(spec: str, workers: int) -> dict[str, int]:
    """Per-type limits: the registry's max_busy_percent of workers, overridden by 'TYPE=N,...'."""
    limits = {name: max(1, workers * t.max_busy_percent // 100) for name, t in REGISTRY.types.items()}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or name not in REGISTRY.types or not value.isdigit() or int(value) < 1:
            raise SettingsError(f"item {item!r} must be TYPE=N with a known type and N >= 1")
        limits[name] = int(value)
    return limits


def _data_type(raw: str) -> int:
    if not raw.strip().isdigit() or int(raw) < 1:
        raise SettingsError(f"data type {raw.strip()!r} must be a positive integer")
    return int(raw)


def _data_types(spec: str) -> tuple[int, ...]:
    types = tuple(_data_type(x) for x in spec.split(",") if x.strip())
    if len(set(types)) != len(types):
        raise SettingsError("lists a data type twice")
    return types


def _max_ages(spec: str) -> dict[int, float]:
    """'1=60,2=300' -> {1: 60.0, 2: 300.0}."""
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise SettingsError(f"item {item!r} must be TYPE=SECONDS")
        out[_data_type(key)] = _seconds(0)(value)
    return out
