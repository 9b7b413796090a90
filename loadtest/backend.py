"""A simulated core backend: the bank's product service, as a real HTTP server.

``GET /clients/{client_id}/products/{data_type}`` answers a JSON product list
after a configurable delay, failing (HTTP 500) or answering garbage at
configurable rates. Counters per client and data type let tests count
backend calls.

Control routes (JSON):

* ``GET /_stats``             {"calls": N, "by_key": {"client/type": n}, "config": {...}}
* ``POST /_reset``            zero the counters
* ``POST /_config``           change latency_ms, jitter_ms, error_rate, bad_reply_rate at run time

``python -m loadtest.backend --port 8090 --latency-ms 200``

It logs like the service (smartcache.server.logs: JSON lines, or colours on a terminal):
start, configuration changes, HTTP errors and stop; no line per request.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog

from smartcache.server import logs

PRODUCTS = re.compile(r"^/clients/([^/]+)/products/(-?\d+)$")
log = structlog.get_logger("backend")


class BackendState:
    def __init__(
        self,
        *,
        latency_ms: float = 200.0,
        jitter_ms: float = 0.0,
        error_rate: float = 0.0,
        bad_reply_rate: float = 0.0,
        seed: int = 1,
    ) -> None:
        self.config = {
            "latency_ms": latency_ms,
            "jitter_ms": jitter_ms,
            "error_rate": error_rate,
            "bad_reply_rate": bad_reply_rate,
        }
        self.lock = threading.Lock()
        self.calls: dict[str, int] = {}
        self.rng = random.Random(seed)

    def count(self, key: str) -> None:
        with self.lock:
            self.calls[key] = self.calls.get(key, 0) + 1

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {"calls": sum(self.calls.values()), "by_key": dict(self.calls), "config": dict(self.config)}

    def delay_s(self) -> float:
        c = self.config
        with self.lock:
            jitter = self.rng.uniform(-c["jitter_ms"], c["jitter_ms"]) if c["jitter_ms"] else 0.0
        return max(0.0, c["latency_ms"] + jitter) / 1000

    def roll(self, rate_name: str) -> bool:
        with self.lock:
            return self.rng.random() < self.config[rate_name]


def make_handler(state: BackendState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive
        disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stalls

        def log_message(self, format: str, *args: Any) -> None:
            pass  # no line per request

        def log_error(self, format: str, *args: Any) -> None:
            log.warning("backend_http_error", client=self.client_address[0], error=format % args)

        def _reply(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/_stats":
                self._reply(200, json.dumps(state.stats()).encode())
                return
            m = PRODUCTS.match(self.path)
            if m is None:
                self._reply(404, b'{"error": "no such route"}')
                return
            client_id, data_type = m.group(1), int(m.group(2))
            state.count(f"{client_id}/{data_type}")
            time.sleep(state.delay_s())
            if state.roll("error_rate"):
                self._reply(500, b'{"error": "simulated backend failure"}')
            elif state.roll("bad_reply_rate"):
                self._reply(200, b"<html>not json</html>", "text/html")
            else:
                items = [
                    {"id": f"{client_id}-{data_type}-{i}", "balance": 1000 * i, "currency": "RUB"} for i in range(3)
                ]
                body = {"client_id": client_id, "data_type": data_type, "items": items}
                self._reply(200, json.dumps(body).encode())

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b"{}"
            if self.path == "/_reset":
                with state.lock:
                    state.calls.clear()
                self._reply(200, b"{}")
            elif self.path == "/_config":
                try:
                    update = json.loads(raw)
                    unknown = set(update) - set(state.config)
                    if unknown:
                        raise ValueError(f"unknown settings {sorted(unknown)}")
                    state.config.update({k: float(v) for k, v in update.items()})
                except (ValueError, TypeError) as e:
                    self._reply(400, json.dumps({"error": str(e)}).encode())
                    return
                log.info("backend_config_changed", **state.config)
                self._reply(200, json.dumps(state.config).encode())
            else:
                self._reply(404, b'{"error": "no such route"}')

    return Handler


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # the stdlib's 5 refuses bursts of new keep-alive connections
    daemon_threads = True


class Backend:
    """The server in a thread (tests) or in the foreground (``main``)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, **config: Any) -> None:
        self.state = BackendState(**config)
        self.server = _Server((host, port), make_handler(self.state))
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.url = f"http://{host}:{self.port}"
        self._thread: threading.Thread | None = None

    def start(self) -> Backend:
        self._thread = threading.Thread(target=self.server.serve_forever, name="backend", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def main() -> None:
    p = argparse.ArgumentParser(description="Simulated core backend (product service).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8090)
    p.add_argument("--latency-ms", type=float, default=200.0)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--error-rate", type=float, default=0.0)
    p.add_argument("--bad-reply-rate", type=float, default=0.0)
    p.add_argument("--log-level", choices=tuple(logs.LEVELS), default="info")
    a = p.parse_args()
    logs.configure(a.log_level)
    b = Backend(
        a.host,
        a.port,
        latency_ms=a.latency_ms,
        jitter_ms=a.jitter_ms,
        error_rate=a.error_rate,
        bad_reply_rate=a.bad_reply_rate,
    )
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=b.server.shutdown).start())
    log.info("backend_listening", url=b.url, **b.state.config)
    try:
        b.server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        b.server.server_close()
        log.info("backend_stopped", calls=b.state.stats()["calls"])


if __name__ == "__main__":
    main()
