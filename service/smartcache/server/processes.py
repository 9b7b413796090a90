"""``smartcache --processes N``: N service processes behind one endpoint, more than one core per host.

One service process uses about one core (its broker loop holds the GIL). The parent binds the public
endpoint (``SMARTCACHE_LISTEN``) with a ROUTER and runs ``zmq.proxy`` between it and a DEALER in C, in
a thread that holds no GIL; the DEALER is bound on an ``ipc://`` path in a private directory (mode
0700, removed at exit), and each child's ROUTER connects to it. The children are the normal service
(:class:`~smartcache.server.app.Service`), each a fresh ``python -m smartcache.server`` (never a fork
of a running ZeroMQ context), started with the parent's settings except: the proxy's ipc endpoint
(connected to, not bound), ``SMARTCACHE_ROUTING_HOPS=2`` (a message reaches it as ``[hop, client,
(empty), header, body]``, and intake keys everything on the client's frame), metrics on 127.0.0.1 on
a free port, the events publisher in process 0 only (one PUB port per host), and an explicit
``SMARTCACHE_INSTANCE_ID`` with ``-p<index>`` added (prewarm lease owners stay apart).

The DEALER hands messages round-robin to the children that are connected; each answers its own,
through the proxy, exactly as a single process does. The parent binds rather than connects because
of what ZeroMQ does when a child's connection ends. On a bound socket the pipe to that child goes
with its connection: no request is handed to a child that died once the kernel has closed its socket
(what was handed to it in the moment it died, until its last thread ended, is lost with what it was
executing), and the answers the pipe holds are still read (the DEALER's LINGER is above 0). A
connecting DEALER does worse either way: with ``IMMEDIATE`` it drops the answers of a child that
closed its socket before the proxy read them (one stop in four under load), and without it keeps
handing requests to a dead child's pipe until the restart, where they are dropped.

CURVE is refused with ``--processes`` above 1 (config.py): a proxy in C cannot carry each client's
key, which decides what it may send (security.py), to the child, and a Python proxy would cost the
core we came for. The proxy's thread, and how it settles at a stop, are proxy.py.

The children are supervised by the one supervisor make run uses too (smartcache.supervision), by a policy of their own:
a child that dies is logged (``process_died``) and started again after a delay that doubles from
``RESTART_DELAY_S`` to ``MAX_RESTART_DELAY_S`` while it keeps dying young (up for less than
``STABLE_AFTER_S``), never given up; the others keep serving meanwhile. Restarting rather than
stopping the parent: one bad process must not take the host's endpoint down. Children get
``PR_SET_PDEATHSIG`` (SIGTERM): a parent killed by -9 leaves none behind. The kernel sends it when
the *thread* that forked the child ends, so every child is started from the main thread. The
parent takes SIGTERM, SIGINT, SIGHUP (passed on to every child) and SIGCHLD with ``sigtimedwait``,
blocked before its first thread starts, never in a handler (supervision/signals.py says why).

Stop (SIGTERM, SIGINT), in this order: every child gets SIGTERM and drains as one process does; the
parent waits for them up to their drain timeout and a margin (then SIGKILL, logged); then the proxy
stops once its counters (``STATISTICS``) show every answer the children sent forwarded to its client
(its frontend lingers to flush them); the directory goes; the HTTP server last.

The parent's metrics port serves the union of the children's ``/metrics`` (metrics_union.py) and
``/health/live``, ``/health/ready`` (ready when every child is, with each one's answer).
"""

from __future__ import annotations

import http.client
import json
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
import zmq
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.metrics_core import Metric

from smartcache import __version__
from smartcache.server.broker.broker import FLUSH_LINGER_MS
from smartcache.server.config import Settings
from smartcache.server.deadlines import JOIN_MARGIN_S
from smartcache.server.metrics import PREFIX as METRICS_PREFIX
from smartcache.server.metrics import probe_answer, serve_http
from smartcache.server.metrics_union import PROCESS_LABEL, exposition, union
from smartcache.server.parsers import zmq_endpoint
from smartcache.server.proxy import SETTLE_TIMEOUT_S, Proxy
from smartcache.settings import PREFIX, SettingsError
from smartcache.supervision import Child, Event, RestartPolicy, Signals, Supervisor, stop_together

log = structlog.get_logger("processes")

#: a child that has not announced itself (bound, metrics served) by then fails the start
CHILD_START_TIMEOUT_S = 60.0
RESTART_DELAY_S = 0.5
MAX_RESTART_DELAY_S = 10.0
#: a child up this long before it died is restarted after RESTART_DELAY_S again
STABLE_AFTER_S = 30.0
#: never given up: one bad process must not take the host's endpoint down
RESTART = RestartPolicy(
    delay_s=RESTART_DELAY_S, max_delay_s=MAX_RESTART_DELAY_S, stable_after_s=STABLE_AFTER_S, max_deaths=None
)
#: beyond the children's own drain timeout and join margin, before they are killed at a stop
STOP_MARGIN_S = 5.0
SUPERVISE_EVERY_S = 0.2
#: one scrape or probe of a child
CHILD_HTTP_TIMEOUT_S = 2.0
#: the routing frames a child sees: the proxy's hop, then the client's identity
CHILD_ROUTING_HOPS = 2


class StartError(Exception):
    """A child did not start, or the endpoint could not be bound; the message says which."""


@dataclass
class ServiceProcess(Child):
    """One service process: a supervised child, where it listens and how it announced itself."""

    index: int = 0
    announce: Path = field(default_factory=Path)
    metrics_port: int = 0
    restarts: int = 0

    @classmethod
    def create(cls, index: int, announce: Path, env: dict[str, str]) -> ServiceProcess:
        argv = [sys.executable, "-m", "smartcache.server", "--process-index", str(index), "--announce", str(announce)]
        # its whole environment given; its own process group: a Ctrl-C reaches the parent only, which stops the
        # children in order; its output is the parent's
        return cls(name=f"process-{index}", argv=argv, env=env, replace_env=True, new_session=False, index=index,
                   announce=announce)  # fmt: skip

    def start(self) -> None:
        self.announce.unlink(missing_ok=True)
        self.metrics_port = 0
        super().start()

    def announced(self) -> bool:
        """Whether it is up: bound, with its metrics port written to its announce file."""
        if self.metrics_port:
            return True
        if self.proc is None or not self.announce.exists():
            return False
        doc = json.loads(self.announce.read_text())
        if doc.get("pid") != self.proc.pid:  # the last one's, before a restart removed it
            return False
        self.metrics_port = int(doc["metrics_port"])
        return True

    def get(self, path: str, token: str = "") -> tuple[int, bytes]:
        """GET one path of its HTTP server: (status, body); (0, b"") when it does not answer."""
        if not self.metrics_port:
            return 0, b""
        conn = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=CHILD_HTTP_TIMEOUT_S)
        try:
            conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
            response = conn.getresponse()
            return response.status, response.read()
        except OSError:
            return 0, b""
        finally:
            conn.close()


class Processes:
    """The parent: children, proxy, one metrics and health view. ``start``, ``supervise``, ``stop``."""

    def __init__(self, *, settings: Settings, env: Mapping[str, str]) -> None:
        """env: the environment the parent was started with; children get it with their own changes."""
        self.settings = settings
        self._env = dict(env)
        self.dir = Path(tempfile.mkdtemp(prefix="smartcache-processes-"))  # mode 0700
        #: where the proxy's DEALER listens and every child connects
        self.backend = zmq_endpoint(f"ipc://{self.dir}/proxy.sock")
        self.children = [
            ServiceProcess.create(i, self.dir / f"{i}.json", child_env(self._env, settings, i, self.backend))
            for i in range(settings.processes)
        ]
        self.supervisor = Supervisor(report=self._report, policy=RESTART)
        for c in self.children:
            self.supervisor.add(c)
        self.context: zmq.Context[Any] = zmq.Context()
        self.proxy = Proxy(
            context=self.context,
            listen=settings.listen,
            backend=self.backend,
            max_body_bytes=settings.max_body_bytes,
        )
        self.stopping = False
        self._http: ThreadingWSGIServer | None = None
        self.metrics_port = 0
        r = self.registry = CollectorRegistry()
        p = METRICS_PREFIX
        Gauge(f"{p}_processes", "Service processes behind the endpoint (--processes).", registry=r).set(
            settings.processes
        )
        self._up = Gauge(
            f"{p}_process_up", "1 when the process answered this scrape, by process.", [PROCESS_LABEL], registry=r
        )
        self._restarts = Counter(
            f"{p}_process_restarts_total", "Processes started again after they died.", [PROCESS_LABEL], registry=r
        )
        for c in self.children:
            self._restarts.labels(str(c.index))

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        """The children's endpoint, the children (each connected and announced), the public one, HTTP."""
        s = self.settings
        try:
            self.proxy.start()
        except zmq.ZMQError as e:
            raise StartError(f"the processes' endpoint {self.backend}: {e.strerror}") from e
        for c in self.children:  # from the main thread (PR_SET_PDEATHSIG)
            c.start()
        deadline = time.monotonic() + CHILD_START_TIMEOUT_S
        for c in self.children:
            while not c.announced():
                if not c.alive():
                    raise StartError(
                        f"process {c.index} exited with {c.returncode} before it started (its log says why)"
                    )
                if time.monotonic() > deadline:
                    raise StartError(f"process {c.index} did not start within {CHILD_START_TIMEOUT_S:g} s")
                time.sleep(0.02)
        try:
            self.proxy.open()
        except zmq.ZMQError as e:
            raise StartError(f"{PREFIX}LISTEN={s.listen}: {e.strerror}") from e
        try:
            self._http = serve_http(
                s.metrics_addr,
                s.metrics_port,
                metrics_app=self._metrics_app,
                probes={"/health/live": self.live, "/health/ready": self.ready},
                token=s.metrics_token,
            )
        except OSError as e:
            where = f"{PREFIX}METRICS_ADDR={s.metrics_addr} {PREFIX}METRICS_PORT={s.metrics_port}"
            raise StartError(f"{where}: {e.strerror or e}") from e
        self.metrics_port = int(self._http.server_port)
        log.info(
            "processes_started",
            version=__version__,
            endpoint=self.proxy.endpoint,
            metrics_port=self.metrics_port,
            processes={str(c.index): c.proc.pid for c in self.children if c.proc is not None},
        )

    def supervise(self) -> None:
        """One pass (main thread only: see PR_SET_PDEATHSIG above): log the dead, start them again when due."""
        self.supervisor.step()
        for c in self.children:
            c.announced()  # a restarted one's metrics port, once it is up

    def _report(self, e: Event) -> None:
        c = e.child
        assert isinstance(c, ServiceProcess)
        if e.kind == "died":
            log.error(
                "process_died",
                process=c.index,
                pid=e.pid,
                returncode=e.returncode,
                up_s=round(e.up_s, 3),
                restart_in_s=e.restart_in_s,
            )
        elif e.kind == "restarted":
            c.restarts += 1
            self._restarts.labels(str(c.index)).inc()
            log.info("process_restarted", process=c.index, pid=e.pid)

    def signal_all(self, sig: int) -> None:
        """Send a signal to every child that runs, by its PID."""
        for c in self.children:
            c.send_signal(sig)

    def stop(self) -> None:
        """Drain the children, then the proxy (deliberate order: their last answers pass through it)."""
        self.stopping = True
        # 1. each child drains (SIGTERM): what it holds is answered
        stop_together(self.children, self.settings.drain_timeout_s + 2 * JOIN_MARGIN_S + STOP_MARGIN_S, self._killed)
        if self.proxy.is_alive():  # 2. the proxy, once their last answers are through; its frontend lingers
            self.proxy.drain_and_stop(SETTLE_TIMEOUT_S)
            self.proxy.join(FLUSH_LINGER_MS / 1000 + JOIN_MARGIN_S)
        self.context.term()
        shutil.rmtree(self.dir, ignore_errors=True)  # 3. the ipc sockets and announce files
        if self._http is not None:  # 4. probes and scrapes last: they report the stop until the end
            self._http.shutdown()
            self._http.server_close()
        log.info("processes_stopped")

    @staticmethod
    def _killed(c: Child) -> None:
        log.error("process_killed", process=getattr(c, "index", None), pid=c.pid, reason="did not stop in time")

    # -- the one view of the host ---------------------------------------------

    def live(self) -> tuple[int, bytes]:
        """/health/live: the proxy runs (a child that died is restarted already; each one's answer is shown)."""
        return probe_answer({"proxy": self.proxy.is_alive()}, detail=self._probe_children("/health/live"))

    def ready(self) -> tuple[int, bytes]:
        """/health/ready: the proxy runs, the parent is not stopping, and every child is ready."""
        detail = self._probe_children("/health/ready")
        checks = {"proxy": self.proxy.is_alive(), "accepting": not self.stopping}
        checks.update({f"process_{i}": d.get("status") == "pass" for i, d in detail.items()})
        return probe_answer(checks, detail=detail)

    def _probe_children(self, path: str) -> dict[str, Any]:
        detail: dict[str, Any] = {}
        for c in self.children:
            _, body = c.get(path)
            doc = json.loads(body) if body else {"status": "fail", "failing": ["not answering"]}
            doc["pid"] = c.proc.pid if c.proc is not None else None
            detail[str(c.index)] = doc
        return detail

    def _metrics_app(self, _environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        body = exposition(self._families())
        start_response("200 OK", [("Content-Type", "text/plain; version=0.0.4; charset=utf-8")])
        return [body]

    def _families(self) -> Iterator[Metric]:
        texts: dict[str, str] = {}
        for c in self.children:
            status, body = c.get("/metrics", self.settings.metrics_token)
            up = status == 200
            self._up.labels(str(c.index)).set(1 if up else 0)
            if up:
                texts[str(c.index)] = body.decode()
        yield from union(texts)
        yield from self.registry.collect()


def child_env(env: Mapping[str, str], settings: Settings, index: int, endpoint: str) -> dict[str, str]:
    """A child's environment: the parent's, with its own endpoint, hops, metrics port and publisher."""
    out = dict(env)
    out.update(
        {
            f"{PREFIX}LISTEN": endpoint,
            f"{PREFIX}ROUTING_HOPS": str(CHILD_ROUTING_HOPS),
            f"{PREFIX}PROCESSES": "1",
            f"{PREFIX}METRICS_ADDR": "127.0.0.1",
            f"{PREFIX}METRICS_PORT": "0",
        }
    )
    if index > 0:
        out[f"{PREFIX}EVENTS_LISTEN"] = "none"  # one PUB port per host: process 0's
    if env.get(f"{PREFIX}INSTANCE_ID", "").strip():
        out[f"{PREFIX}INSTANCE_ID"] = f"{settings.instance_id}-p{index}"
    return out


def run(settings: Settings, env: Mapping[str, str], *, stop: threading.Event, reload: threading.Event) -> int:
    """The parent in the foreground until SIGTERM or SIGINT (or stop set): 0 after a stop, 1 when it cannot start
    or the proxy dies. SIGHUP (or reload set) is passed on to every child."""
    # Before any thread starts (the proxy's, the HTTP server's, ZeroMQ's): they inherit the mask, and the signals
    # wait for the loop's sigtimedwait. stop and reload are set by app.py's handlers only for a signal that came
    # before this line; the loop never waits on them (a handler running inside that wait hung make run once).
    signals = Signals(reload=True).block()
    try:
        parent = Processes(settings=settings, env=env)
    except (SettingsError, OSError) as e:  # the private directory: not made, or its ipc paths too long
        log.error("start_failed", error=str(e))  # noqa: TRY400 - the message says it all
        return 1
    try:
        parent.start()
    except (StartError, OSError) as e:
        log.error("start_failed", error=str(e))  # noqa: TRY400 - the message says it all
        parent.stop()
        return 1
    while not signals.wait(SUPERVISE_EVERY_S) and not stop.is_set():  # a SIGCHLD wakes it at once
        if signals.take_reloads() or reload.is_set():
            reload.clear()
            parent.signal_all(signal.SIGHUP)
        parent.supervise()
        if not parent.proxy.is_alive():
            log.error("proxy_died")
            parent.stop()
            return 1
    log.info("stop_requested")
    parent.stop()
    return 0
