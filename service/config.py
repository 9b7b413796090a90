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
