"""Parsers of setting values: one per kind of value; each raises SettingsError saying what is expected.

Used by service/smartcache/server/config.py (the service's settings) and by the programs next to
it (make run, smartcache-cli) that read the same variables.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from smartcache.wire import REGISTRY
from smartcache.wire.topology import CLUSTER_NAME

LOG_LEVELS = ("debug", "info", "warning", "error")
MAX_PORT = 65535
#: sockaddr_un.sun_path holds 108 bytes, the terminating NUL included
MAX_IPC_PATH_BYTES = 107
#: prewarm lease owners are "<instance id>/w<slot>": no "/" in the id
INSTANCE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
HOSTNAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})")


class SettingsError(ValueError):
    """An environment variable has a value the service cannot use."""


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
        parse_host(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
    if port != "*":
        parse_port(allow_any=True)(port)
    return raw


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


def parse_template(raw: str, base: str) -> str:
    if "{client_id}" not in raw or "{data_type}" not in raw:
        raise SettingsError("must contain {client_id} and {data_type}")
    try:
        url = raw.format(base=base.rstrip("/"), client_id="c", data_type=1)
    except (KeyError, IndexError, ValueError) as e:
        raise SettingsError(f"only {{base}}, {{client_id}} and {{data_type}} may be used ({e!r})") from None
    parse_http_url(url, base=False)
    return raw


def parse_log_level(raw: str) -> str:
    level = raw.lower()
    if level not in LOG_LEVELS:
        raise SettingsError(f"must be one of {', '.join(LOG_LEVELS)}")
    return level


def parse_instance_id(raw: str) -> str:
    if not INSTANCE_ID.fullmatch(raw):
        raise SettingsError("must be 1-128 characters: letters, digits and . _ : @ - (not first)")
    return raw


def parse_bulkheads(spec: str, workers: int) -> dict[str, int]:
    """Per-type limits: the registry's max_busy_percent of workers, overridden by 'TYPE=N,...'."""
    limits = {name: max(1, workers * t.max_busy_percent // 100) for name, t in REGISTRY.types.items()}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or name not in REGISTRY.types or not value.isdigit() or int(value) < 1:
            raise SettingsError(f"item {item!r} must be TYPE=N with a known type and N >= 1")
        limits[name] = int(value)
    return limits


def parse_data_type(raw: str) -> int:
    if not raw.strip().isdigit() or int(raw) < 1:
        raise SettingsError(f"data type {raw.strip()!r} must be a positive integer")
    return int(raw)


def parse_data_types(spec: str) -> tuple[int, ...]:
    types = tuple(parse_data_type(x) for x in spec.split(",") if x.strip())
    if len(set(types)) != len(types):
        raise SettingsError("lists a data type twice")
    return types


def parse_max_ages(spec: str) -> dict[int, float]:
    """'1=60,2=300' -> {1: 60.0, 2: 300.0}."""
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise SettingsError(f"item {item!r} must be TYPE=SECONDS")
        out[parse_data_type(key)] = parse_seconds(0)(value)
    return out


def parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SettingsError("must be 1/true/yes or 0/false/no")


ENVIRONMENTS = ("development", "production")


def parse_environment(raw: str) -> str:
    if raw not in ENVIRONMENTS:
        raise SettingsError(f"must be one of {', '.join(ENVIRONMENTS)}")
    return raw


def parse_directory(raw: str) -> str:
    if not Path(raw).is_dir():
        raise SettingsError("is not a directory")
    return raw


def parse_secret_key_file(raw: str) -> str:
    """A ZeroMQ certificate file holding a CURVE secret key (smartcache-cli keys generate writes one)."""
    import zmq.auth  # noqa: PLC0415 - only when CURVE is configured

    try:
        public, secret = zmq.auth.load_certificate(raw)
    except (OSError, ValueError) as e:
        raise SettingsError(f"cannot read a key pair from it ({e})") from None
    if not public or not secret:
        raise SettingsError("holds no secret key (the *.key_secret file of a pair, not the public *.key)")
    return raw
