"""Prometheus metrics: one registry, one prefix (``smartcache_``), base units.

Labels are bounded: message type names, outcome names and procedure names
come from the registry and the code; no client or session ids. Gauges that
mirror broker state are computed on scrape (``set_function``), so the hot
path pays nothing for them.
"""

from __future__ import annotations

import platform
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from service import __version__
from service.protocol import REGISTRY

PREFIX = "smartcache"
REJECTION_REASONS = ("full", "evicted", "expired", "shutting_down")
#: transport errors that mean the sender's input was malformed
BAD_INPUT_ERRORS = (
    "BAD_HEADER",
    "UNSUPPORTED_VERSION",
    "UNKNOWN_SYSTEM",
    "UNKNOWN_TYPE",
    "BODY_TOO_LARGE",
    "BAD_BODY",
    "BAD_FRAMES",
)
#: fine below 10 ms, where the service lives; coarse above for outages
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """Every metric of one service process."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        p = PREFIX
        self.messages = Counter(
            f"{p}_messages_total",
            "Messages answered or finished, by type and outcome.",
            ["type", "outcome"],
            registry=r,
        )
        self.duration = Histogram(
            f"{p}_request_duration_seconds",
            "From arrival to reply sent (queue wait included), by type.",
            ["type"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.queue_depth = Gauge(f"{p}_queue_depth", "Messages waiting in the queue.", registry=r)
        self.queue_capacity = Gauge(f"{p}_queue_capacity", "Queue capacity.", registry=r)
        self.rejections = Counter(
            f"{p}_queue_rejections_total",
            "Messages refused or dropped by the queue, by reason.",
            ["reason"],
            registry=r,
        )
        self.workers = Gauge(f"{p}_workers", "Worker slots in the pool.", registry=r)
        self.workers_busy = Gauge(f"{p}_workers_busy", "Worker slots busy with a message.", registry=r)
        self.workers_busy_by_type = Gauge(
            f"{p}_workers_busy_by_type", "Busy worker slots, by message type.", ["type"], registry=r
        )
        self.bulkhead_limit = Gauge(
            f"{p}_bulkhead_limit", "Most worker slots one message type may occupy.", ["type"], registry=r
        )
        self.storage_calls = Counter(
            f"{p}_storage_calls_total",
            "Stored procedure calls, by procedure and outcome.",
            ["procedure", "outcome"],
            registry=r,
        )
        self.storage_latency = Histogram(
            f"{p}_storage_call_duration_seconds",
            "Stored procedure call latency.",
            ["procedure"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.storage_connected = Gauge(
            f"{p}_storage_connected",
            "1 per worker thread connected to its Tarantool instance, by address.",
            ["address"],
            registry=r,
        )
        self.storage_active = Gauge(
            f"{p}_storage_active", "1 for the Tarantool instance the service writes to.", ["address"], registry=r
        )
        self.bad_input = Counter(
            f"{p}_bad_input_total", "Malformed messages, by transport error.", ["error"], registry=r
        )
        self.dropped_replies = Counter(
            f"{p}_dropped_replies_total", "Replies that could not be delivered, by reason.", ["reason"], registry=r
        )
        self.prewarm = Counter(f"{p}_prewarm_total", "Prewarm fetches, by outcome.", ["outcome"], registry=r)
        self.products = Counter(f"{p}_products_total", "PRODUCTS_GET answers, by source.", ["source"], registry=r)
        self.backend_calls = Counter(
            f"{p}_backend_calls_total",
            "Core backend HTTP calls, by data type and outcome.",
            ["data_type", "outcome"],
            registry=r,
        )
        self.backend_latency = Histogram(
            f"{p}_backend_call_duration_seconds",
            "Core backend call latency.",
            ["data_type"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.build_info = Gauge(f"{p}_build_info", "Build information.", ["version", "python", "protocol"], registry=r)
        self.build_info.labels(__version__, platform.python_version(), str(REGISTRY.version)).set(1)
        # Pre-create label children so every series exists from the start.
        for name in REGISTRY.types:
            self.duration.labels(name)
            self.workers_busy_by_type.labels(name)
        for outcome in ("started", "skipped_fresh", "skipped_busy", "completed", "failed"):
            self.prewarm.labels(outcome)
        for source in ("cache", "waited", "fetched", "error"):
            self.products.labels(source)
        for reason in REJECTION_REASONS:
            self.rejections.labels(reason)
        for error in BAD_INPUT_ERRORS:
            self.bad_input.labels(error)

    def watch(self, gauge: Gauge, fn: Callable[[], float]) -> None:
        """Compute a gauge on scrape."""
        gauge.set_function(fn)

    def serve(self, addr: str, port: int) -> int:
        """Start the /metrics HTTP server in a daemon thread; returns the bound port."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return int(server.server_port)
