"""Prometheus metrics: one registry, one prefix (``smartcache_``), base units.

Labels are bounded: message type names, outcome names and procedure names
come from the registry and the code; no client or session ids. Every label
value is lower case (``label``): the registry's names (SESSION_GET, NOT_FOUND)
appear as session_get, not_found, like the code's own reasons (client_gone). Gauges that
mirror broker state are computed on scrape (``set_function``), so the hot
path pays nothing for them.

The same HTTP server answers ``/health/live`` and ``/health/ready`` for
orchestrators (200, or 503 with a JSON body naming the failing checks), so a
Docker or Kubernetes probe needs no other port. ``_created`` series are off
(issue 13 counted 881 such lines at idle; Prometheus does not use them); the
standard ``process_*`` series (RSS, CPU, open fds) come from
prometheus_client's ProcessCollector.
"""

from __future__ import annotations

import hmac
import json
import platform
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import structlog
from prometheus_client import CollectorRegistry, Gauge, ProcessCollector, disable_created_metrics, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from smartcache import __version__
from smartcache.server.metric_families import (
    BAD_INPUT_ERRORS,
    EVENT_TOPIC_LABELS,
    LATENCY_BUCKETS_S,
    PREFIX,
    REJECTION_REASONS,
    BackendMetrics,
    EventMetrics,
    FailureMetrics,
    HandlerMetrics,
    MessageMetrics,
    RoutingMetrics,
    StorageMetrics,
    label,
)
from smartcache.wire import REGISTRY

__all__ = [
    "BAD_INPUT_ERRORS",
    "EVENT_TOPIC_LABELS",
    "LATENCY_BUCKETS_S",
    "PREFIX",
    "REJECTION_REASONS",
    "Checks",
    "Metrics",
    "Probe",
    "label",
    "probe_answer",
    "serve_http",
]

#: a health check: check name -> passing; healthy when every check passes
Checks = Callable[[], Mapping[str, bool]]

disable_created_metrics()  # type: ignore[no-untyped-call]  # process-wide: no *_created series
log = structlog.get_logger("metrics")


class Metrics(
    MessageMetrics, StorageMetrics, RoutingMetrics, FailureMetrics, HandlerMetrics, EventMetrics, BackendMetrics
):
    """Every metric of one service process: the families (service/smartcache/server/metric_families.py) on
    one registry, and the HTTP server that serves them."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        p = PREFIX
        ProcessCollector(registry=r)  # process_resident_memory_bytes, process_cpu_seconds_total, process_open_fds...
        self._server: ThreadingWSGIServer | None = None
        # In the order a scrape lists them.
        self._add_message_metrics(r, p)
        self._add_storage_metrics(r, p)
        self._add_routing_metrics(r, p)
        self._add_failure_metrics(r, p)
        self._add_handler_metrics(r, p)
        self._add_event_metrics(r, p)
        self._add_backend_metrics(r, p)
        self.build_info = Gauge(f"{p}_build_info", "Build information.", ["version", "python", "protocol"], registry=r)
        self.build_info.labels(__version__, platform.python_version(), str(REGISTRY.version)).set(1)

    def watch(self, gauge: Gauge, fn: Callable[[], float]) -> None:
        """Compute a gauge on scrape."""
        gauge.set_function(fn)

    def serve(
        self,
        addr: str,
        port: int,
        *,
        live: Checks | None = None,
        ready: Checks | None = None,
        token: str = "",
    ) -> int:
        """Start the HTTP server (/metrics, /health/live, /health/ready) in a daemon thread; returns its port.

        live and ready are called on each probe; without them the probe passes while the process answers.
        token: /metrics then needs ``Authorization: Bearer <token>`` (the probes stay open: they show no data).
        """
        probes = {"/health/live": live or dict, "/health/ready": ready or dict}
        self._server = serve_http(
            addr,
            port,
            metrics_app=make_wsgi_app(self.registry),
            probes={path: _probe_of(checks) for path, checks in probes.items()},
            token=token,
        )
        return int(self._server.server_port)

    def close(self) -> None:
        """Stop the HTTP server and free its port."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


#: a health probe's answer: HTTP status (200 or 503) and JSON body
Probe = Callable[[], tuple[int, bytes]]


def serve_http(
    addr: str, port: int, *, metrics_app: Callable[..., Iterable[bytes]], probes: Mapping[str, Probe], token: str
) -> ThreadingWSGIServer:
    """An HTTP server in a daemon thread: the probes on their paths, metrics_app on every other one (behind
    the bearer token when there is one). The one service process's and the ``--processes`` parent's."""
    expected = f"Bearer {token}".encode()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        probe = probes.get(environ.get("PATH_INFO", ""))
        if probe is None:
            given = environ.get("HTTP_AUTHORIZATION", "").encode()
            if token and not hmac.compare_digest(given, expected):
                start_response("401 Unauthorized", [("WWW-Authenticate", "Bearer"), ("Content-Length", "0")])
                return [b""]
            return metrics_app(environ, start_response)
        code, body = probe()
        start_response(
            "200 OK" if code == 200 else "503 Service Unavailable",
            [
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(body))),
                ("Cache-Control", "no-store"),
            ],
        )
        return [body]

    class Server(ThreadingWSGIServer):
        address_family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0][0]

    server = make_server(addr, port, app, Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server


def _probe_of(checks: Checks) -> Probe:
    return lambda: _probe(checks)


def _probe(checks: Checks) -> tuple[int, bytes]:
    """(HTTP status, JSON body) of one health probe: 503 names the failing checks."""
    try:
        results = {name: bool(ok) for name, ok in checks().items()}
    except Exception as e:
        log.exception("health_check_failed")
        return probe_answer({}, failing=[f"check raised {type(e).__name__}"])
    return probe_answer(results)


def probe_answer(
    results: Mapping[str, bool], *, failing: list[str] | None = None, detail: Mapping[str, Any] | None = None
) -> tuple[int, bytes]:
    """(HTTP status, JSON body) of checks that ran: 200 when each passed, else 503 naming the failing ones;
    detail (the ``--processes`` parent's: each process's own answer) goes in the body as it is."""
    if failing is None:
        failing = sorted(name for name, ok in results.items() if not ok)
    doc: dict[str, Any] = {"status": "fail" if failing else "pass", "checks": dict(results), "failing": failing}
    if detail is not None:
        doc["processes"] = detail
    return (503 if failing else 200), json.dumps(doc).encode()


class _QuietHandler(WSGIRequestHandler):
    """No access log on stderr: probes and scrapes every few seconds are not news."""

    def log_message(self, format: str, *args: Any) -> None:
        pass
