"""Settings: built once from environment variables at start-up and passed down.

Nothing else in the service reads the environment. Every variable, its default
and its meaning are listed in the README ("Configuration").
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from service.protocol import REGISTRY

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
        return int((self.backend_timeout_s * (1 + self.backend_retries) + LEASE_MARGIN_S) * 1000)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read SMARTCACHE_* variables; raises SettingsError naming the bad one."""
        e = os.environ if env is None else env

        def get(name: str, default: str) -> str:
            return e.get(f"SMARTCACHE_{name}", "") or default

        def num(name: str, default: float, kind: type[int] | type[float], low: float) -> int | float:
            raw = get(name, str(default))
            try:
                value = kind(raw)
            except ValueError:
                raise SettingsError(f"SMARTCACHE_{name}={raw!r} is not a number") from None
            if value < low:
                raise SettingsError(f"SMARTCACHE_{name}={raw!r} must be at least {low}")
            return value

        workers = int(num("WORKERS", DEFAULT_WORKERS, int, 1))
        level = get("LOG_LEVEL", DEFAULT_LOG_LEVEL).lower()
        if level not in ("debug", "info", "warning", "error"):
            raise SettingsError(f"SMARTCACHE_LOG_LEVEL={level!r} is not debug, info, warning or error")
        return cls(
            listen=get("LISTEN", DEFAULT_LISTEN),
            tarantool=tuple(a.strip() for a in get("TARANTOOL", DEFAULT_TARANTOOL).split(",") if a.strip()),
            tarantool_user=get("TARANTOOL_USER", "smartcache"),
            tarantool_password=get("TARANTOOL_PASSWORD", "smartcache"),
            workers=workers,
            worker_threads=min(workers, int(num("WORKER_THREADS", DEFAULT_WORKER_THREADS, int, 0))),
            queue_capacity=int(num("QUEUE_CAPACITY", DEFAULT_QUEUE_CAPACITY, int, 1)),
            metrics_addr=get("METRICS_ADDR", DEFAULT_METRICS_ADDR),
            metrics_port=int(num("METRICS_PORT", DEFAULT_METRICS_PORT, int, 0)),
            backend_url=get("BACKEND_URL", DEFAULT_BACKEND_URL),
            log_level=level,
            max_body_bytes=min(REGISTRY.max_body_bytes, int(num("MAX_BODY_BYTES", REGISTRY.max_body_bytes, int, 64))),
            drain_timeout_s=float(num("DRAIN_TIMEOUT_S", DEFAULT_DRAIN_TIMEOUT_S, float, 0)),
            storage_connect_timeout_s=float(
                num("STORAGE_CONNECT_TIMEOUT_S", DEFAULT_STORAGE_CONNECT_TIMEOUT_S, float, 0.1)
            ),
            instance_id=get("INSTANCE_ID", f"{socket.gethostname()}-{os.getpid()}"),
            bulkheads=_bulkheads(get("BULKHEADS", ""), workers),
            backend_template=get("BACKEND_TEMPLATE", DEFAULT_BACKEND_TEMPLATE),
            backend_connect_timeout_s=float(
                num("BACKEND_CONNECT_TIMEOUT_S", DEFAULT_BACKEND_CONNECT_TIMEOUT_S, float, 0.01)
            ),
            backend_timeout_s=float(num("BACKEND_TIMEOUT_S", DEFAULT_BACKEND_TIMEOUT_S, float, 0.01)),
            backend_retries=int(num("BACKEND_RETRIES", DEFAULT_BACKEND_RETRIES, int, 0)),
            backend_max_connections=int(num("BACKEND_MAX_CONNECTIONS", DEFAULT_BACKEND_MAX_CONNECTIONS, int, 1)),
            prewarm_types=_int_list("PREWARM_TYPES", get("PREWARM_TYPES", ",".join(map(str, DEFAULT_PREWARM_TYPES)))),
            products_max_age=_int_map("PRODUCTS_MAX_AGE", get("PRODUCTS_MAX_AGE", "")),
            products_max_age_s=float(num("PRODUCTS_MAX_AGE_S", DEFAULT_PRODUCTS_MAX_AGE_S, float, 0)),
        )


def _bulkheads(spec: str, workers: int) -> dict[str, int]:
    """Per-type limits: the registry's max_busy_percent of workers, overridden by 'TYPE=N,...'."""
    limits = {name: max(1, workers * t.max_busy_percent // 100) for name, t in REGISTRY.types.items()}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, sep, value = item.partition("=")
        if not sep or name not in REGISTRY.types or not value.isdigit() or int(value) < 1:
            raise SettingsError(f"SMARTCACHE_BULKHEADS item {item!r} must be TYPE=N with a known type and N >= 1")
        limits[name] = int(value)
    return limits


def _int_list(name: str, spec: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in spec.split(",") if x.strip())
    except ValueError:
        raise SettingsError(f"SMARTCACHE_{name}={spec!r} must be comma-separated integers") from None


def _int_map(name: str, spec: str) -> dict[int, float]:
    """'1=60,2=300' -> {1: 60.0, 2: 300.0}."""
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        key, sep, value = item.partition("=")
        try:
            out[int(key)] = float(value)
        except ValueError:
            raise SettingsError(f"SMARTCACHE_{name} item {item!r} must be TYPE=SECONDS") from None
        if not sep:
            raise SettingsError(f"SMARTCACHE_{name} item {item!r} must be TYPE=SECONDS")
    return out
