"""The service process (``python -m smartcache.server`` / ``smartcache``), in the foreground.

Start-up order (the brief): command line (``--help``, ``--version``: nothing
else starts); logger; settings from the environment (every bad variable named
in one ``bad_settings`` line, exit 2); the effective settings logged, secrets
hidden; metrics and health HTTP server; worker threads, if
``SMARTCACHE_WORKER_THREADS`` asks for them; the CURVE authenticator; the
events publisher's thread (when the workers have threads); the broker thread,
whose loop runs the worker slots and the publisher by default (each worker
starts connecting to storage in the background). SIGTERM or SIGINT starts a
graceful stop (:meth:`Service.stop` keeps its order). With ``--processes N`` above 1 (or
``SMARTCACHE_PROCESSES``), after the settings this process becomes the parent of N such services
behind one endpoint instead (:mod:`smartcache.server.processes`); a child is told its index and
where to announce itself (PID, metrics port) by two hidden options.

Exit codes: 0 after a stop, whether or not the drain finished in time -- a
message still queued or running at the drain deadline has been answered
(SHUTTING_DOWN or OUTCOME_UNKNOWN) and the stop is logged as
``broker_drain_incomplete``; 1 when a port cannot be bound or the broker dies;
2 on bad settings.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog
import zmq

from smartcache import __version__
from smartcache.ops import moves
from smartcache.ops.access import Access
from smartcache.server import logs, processes
from smartcache.server.broker.broker import Broker, Guest
from smartcache.server.config import Settings, unknown_variables
from smartcache.server.deadlines import JOIN_MARGIN_S
from smartcache.server.handlers import Handler, plain
from smartcache.server.metrics import Metrics
from smartcache.server.parsers import SettingsError
from smartcache.server.publisher import EventPublisher
from smartcache.server.security import Curve
from smartcache.server.sessionids import SessionIds
from smartcache.server.work.workers import WorkerPool
from smartcache.wire import REGISTRY

log = structlog.get_logger("main")


class StartError(Exception):
    """A port or endpoint could not be bound; the message names the variable to change."""


class Service:
    """The whole service in one process: metrics, worker pool, broker."""

    def __init__(self, settings: Settings, handlers: dict[str, Handler] | None = None) -> None:
        """handlers replaces the message handlers (tests use it to add a deliberately slow one)."""
        self.settings = settings
        self.context: zmq.Context[Any] = zmq.Context()
        self.metrics = Metrics()
        self.started_at = time.monotonic()
        self.sessions = SessionIds(settings)
        self.pool = WorkerPool(
            settings=settings,
            context=self.context,
            metrics=self.metrics,
            handlers=handlers,
            introspect=self.introspect,
            sessions=self.sessions,
        )
        self.curve = (
            Curve(
                secret_key_file=settings.curve_secret_key_file,
                clients_dir=settings.curve_clients_dir,
                context=self.context,
                metrics=self.metrics,
            )
            if settings.curve
            else None
        )
        self.events = (
            EventPublisher(settings=settings, context=self.context, metrics=self.metrics, curve=self.curve)
            if settings.events_listen
            else None
        )
        # Who runs where: the event publisher shares the broker's loop with the worker slots when they do (no
        # thread switch between the requests that write events and the reader that publishes them), else it
        # has a thread of its own, as each worker then has.
        guests: list[Guest] = list(self.pool.local)
        self._events_on_broker = self.events is not None and bool(self.pool.local)
        if self.events is not None and self._events_on_broker:
            guests.append(self.events)
        self.broker = Broker(
            settings=settings,
            context=self.context,
            metrics=self.metrics,
            guests=guests,
            links=[w.link for w in self.pool.local if w.link is not None],
            curve=self.curve,
        )
        self.metrics_port = 0
        # Moves of buckets left half-done by their driver (a killed CLI, a failover) are finished or given up
        # by every service instance (service/smartcache/ops/moves/settler.py): each step is checked by storage, so
        # many at once are safe, and no move waits for a person.
        self.settler = (
            moves.Settler(
                Access(
                    addresses=(),
                    user=settings.tarantool_user,
                    password=settings.tarantool_password,
                    etcd=settings.etcd,
                    cluster=settings.cluster,
                ),
                log=lambda result: log.info("buckets_settled", **result),
                observe=self._observe_buckets,
            )
            if settings.discovery
            else None
        )

    def _observe_buckets(self, result: dict[str, Any]) -> None:
        """The settler's pass: the buckets each shard serves and has in flight, as gauges."""
        for shard, n in (result.get("held") or {}).items():
            self.metrics.buckets_active.labels(shard).set(n["active"])
            self.metrics.buckets_moving.labels(shard).set(n["moving"])

    def start(self) -> None:
        s = self.settings
        if not s.session_key:
            log.warning(
                "session_key_unset",
                hint="SMARTCACHE_SESSION_KEY (or _FILE) is unset: stored session ids are derived with the all-zero "
                "key, which is not secret (development only; production refuses it)",
            )
        try:
            self.metrics_port = self.metrics.serve(
                s.metrics_addr, s.metrics_port, live=self.live, ready=self.ready, token=s.metrics_token
            )
        except OSError as e:
            where = f"SMARTCACHE_METRICS_ADDR={s.metrics_addr} SMARTCACHE_METRICS_PORT={s.metrics_port}"
            raise StartError(f"{where}: {e.strerror or e}") from e
        self.pool.start()
        if self.settler is not None:
            self.settler.start()
        if self.curve is not None:
            self.curve.start()  # the ZAP handler answers before the client socket binds
        try:
            if self.events is not None and not self._events_on_broker:
                self.events.start()  # the PUB socket (CURVE too when on), then the reader follows the leader
            self.broker.start()  # with the publisher on its loop when the workers are there
            if self.events is not None:
                self.events.wait_bound()
        except zmq.ZMQError as e:
            if self.events is not None and self.events.error is e:
                raise StartError(f"SMARTCACHE_EVENTS_LISTEN={s.events_listen}: {e.strerror}") from e
            raise StartError(f"SMARTCACHE_LISTEN={s.listen}: {e.strerror}") from e
        log.info(
            "service_started",
            version=__version__,
            endpoint=self.broker.endpoint,
            metrics_port=self.metrics_port,
            workers=s.workers,
            worker_threads=s.worker_threads,
            queue_capacity=s.queue_capacity,
            tarantool=list(s.tarantool),
            discovery=f"{s.cluster} in etcd" if s.discovery else None,
            events=self.events.endpoint if self.events is not None else None,
            session_key_id=self.sessions.key_id,
            session_rekey=s.session_rekey,
        )

    def introspect(self) -> dict[str, Any]:
        """The service's own state for INFO (read from a worker, on the broker's loop or a worker thread:
        plain reads of counters)."""
        s, dispatcher = self.settings, self.broker.dispatcher
        messages: dict[str, dict[str, int]] = {}
        for metric in self.metrics.messages.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total") and sample.value:
                    messages.setdefault(sample.labels["type"], {})[sample.labels["outcome"]] = int(sample.value)
        return {
            "version": __version__,
            "uptime_s": int(time.monotonic() - self.started_at),
            "settings": plain(s.redacted()),
            "queue": {"depth": len(self.broker.queue), "capacity": s.queue_capacity, "stopping": self.broker.stopping},
            "workers": {
                "slots": s.workers,
                "busy": len(dispatcher.inflight),
                "threads": s.worker_threads,
                "busy_by_type": {
                    REGISTRY.types_by_id[t].name: n for t, n in list(self.broker.queue.running.items()) if n
                },
            },
            "messages": messages,
        }

    def live(self) -> Mapping[str, bool]:
        """/health/live: the broker loop runs (else restarting the process is the cure)."""
        return {"broker": self.broker.is_alive()}

    def ready(self) -> Mapping[str, bool]:
        """/health/ready: the broker runs and takes messages, every worker slot is announced, every
        worker's storage knows a leader, and storage agreed that the session key is the cluster's."""
        dispatcher = self.broker.dispatcher
        return {
            "broker": self.broker.is_alive(),
            "accepting": not self.broker.stopping,
            "workers": len(dispatcher.free) + len(dispatcher.inflight) >= self.settings.workers,
            "storage": all(w.storage is not None and w.storage.connected for w in self.pool.workers),
            "session_key": self.sessions.checked,
        }

    def reload_keys(self) -> None:
        """SIGHUP: read the allowed client keys again (adding and removing keys keeps other clients)."""
        if self.curve is not None:
            self.curve.keyring.reload()

    def stop(self) -> None:
        """Drain the broker, then stop the workers (deliberate order: replies need both)."""
        self.broker.stop()  # 1. no new work; queued and running messages finish or are refused
        self.broker.join(self.settings.drain_timeout_s + JOIN_MARGIN_S)
        if self.settler is not None:
            self.settler.stop()
        self.pool.stop()  # 2. workers are idle now; close their storage connections
        self.pool.join(JOIN_MARGIN_S)
        if self.events is not None:
            self.events.stop()  # 3. the reader and the PUB socket (on the broker's loop: stopped with it already)
            self.events.join(JOIN_MARGIN_S)
        if self.curve is not None:
            self.curve.stop()  # its ZAP socket lives in our context
        self.context.term()  # 4. every socket is closed; replies were flushed by the broker's linger
        self.metrics.close()  # 5. probes and scrapes last: they report the stop until the end
        log.info("service_stopped")


def _parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog="smartcache",
        description="The smartcache service in the foreground: a ZeroMQ endpoint for front servers, "
        "Tarantool for storage, Prometheus metrics and /health/live, /health/ready on the metrics port. "
        "SIGTERM or Ctrl-C stops it gracefully.",
        epilog="Configured by SMARTCACHE_* environment variables (SMARTCACHE_LISTEN, SMARTCACHE_TARANTOOL, "
        "SMARTCACHE_METRICS_PORT...; every one, with its default and range, in docs/configuration.md). "
        "--processes N is SMARTCACHE_PROCESSES=N. "
        "Exit codes: 0 stopped cleanly, 1 failed to start or crashed, 2 bad settings.",
    )


def tune_gc() -> None:
    """Once started: what start-up made lives as long as the process, so the cyclic collector stops
    scanning it in its full collections (``gc.freeze``). Measured with the bench's session scenario
    (docs/performance.md); a rarer young-generation collection (every 5,000 or 20,000 allocations
    instead of 700) measured slower, with a p99 up to 2.5 times higher."""
    gc.collect()
    gc.freeze()


def announce(path: Path, service: Service) -> None:
    """A child of ``--processes``, started: its PID and metrics port for the parent (written whole, then
    renamed, so the parent never reads half of it)."""
    doc = {"pid": os.getpid(), "metrics_port": service.metrics_port, "endpoint": service.broker.endpoint}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--processes",
        metavar="N",
        help="serve SMARTCACHE_LISTEN with N service processes behind one ZeroMQ proxy, one metrics and health "
        "view on SMARTCACHE_METRICS_PORT (default: SMARTCACHE_PROCESSES, else 1: one process, no proxy; "
        "not with CURVE); see docs/operations.md",
    )
    # Set by the --processes parent for its children only.
    parser.add_argument("--process-index", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--announce", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)  # --help and --version exit here, before anything starts
    logs.configure(process=args.process_index)
    env = dict(os.environ)
    if args.processes is not None:
        env["SMARTCACHE_PROCESSES"] = args.processes  # checked, and named when bad, as the variable is
    try:
        settings = Settings.from_env(env)
    except SettingsError as e:
        log.error("bad_settings", error=str(e))  # noqa: TRY400 - the message says it all
        return 2
    logs.configure(settings.log_level, process=args.process_index)
    log.info("settings", version=__version__, settings=settings.redacted())
    unknown = unknown_variables()
    if unknown:
        log.warning("unknown_settings", variables=unknown, hint="not read by the service: a typo?")
    stop, reload = threading.Event(), threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: reload.set())
    if settings.processes > 1:
        return processes.run(settings, env, stop=stop, reload=reload)
    service = Service(settings)
    try:
        service.start()
    except (StartError, zmq.ZMQError, OSError) as e:
        log.error("start_failed", error=str(e))  # noqa: TRY400 - the message says it all
        return 1
    if args.announce is not None:
        announce(args.announce, service)
    tune_gc()
    while not stop.wait(0.5):
        if reload.is_set():
            reload.clear()
            service.reload_keys()
        if not service.broker.is_alive():
            log.error("broker_died")
            return 1
    log.info("stop_requested")
    service.stop()
    return 0
