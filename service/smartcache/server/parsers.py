"""Parsers of the service's own kinds of setting value; each raises SettingsError saying what is expected.

The reader of the environment and the parsers of common values (integers, seconds, ports, hosts,
URLs, etcd endpoints...) are smartcache.settings, which the console shares; these are the kinds
only the service reads: endpoints to bind, the backend's URL template, instance ids, bulkheads,
data types and their ages, CURVE's files. Used by service/smartcache/server/config.py and by the
programs next to it (make run) that check the same variables.
"""

from __future__ import annotations

import re
from pathlib import Path

from smartcache.settings import SettingsError, parse_host, parse_http_url, parse_port, parse_seconds
from smartcache.wire import REGISTRY

__all__ = [
    "SettingsError",
    "parse_bulkheads",
    "parse_data_type",
    "parse_data_types",
    "parse_directory",
    "parse_instance_id",
    "parse_log_level",
    "parse_max_ages",
    "parse_secret_key_file",
    "parse_template",
    "zmq_endpoint",
]

LOG_LEVELS = ("debug", "info", "warning", "error")
#: sockaddr_un.sun_path holds 108 bytes, the terminating NUL included
MAX_IPC_PATH_BYTES = 107
#: prewarm lease owners are "<instance id>/w<slot>": no "/" in the id
INSTANCE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")


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
