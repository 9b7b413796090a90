"""The ``--processes`` parent's proxy: the public ROUTER, the DEALER its children connect to, zmq.proxy between.

``zmq.proxy_steerable`` runs in C in a thread of its own (no GIL held): one service process uses about
one core, and a proxy in Python would cost the core the children are there for. The parent binds
both ends and the children connect (processes.py says why binding is what keeps a dead child's
pipe from taking requests); the control socket counts what passed (``STATISTICS``), so that at a
stop the proxy ends only once every answer the children sent is forwarded.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import structlog
import zmq

from smartcache.server.broker.broker import FLUSH_LINGER_MS, FRONTEND_RCVHWM, FRONTEND_SNDHWM, OVERSIZE_MARGIN_BYTES
from smartcache.server.socketthread import SocketThread

log = structlog.get_logger("processes")

#: requests queued in the parent for one child before the round-robin passes it by (bounded memory)
BACKEND_SNDHWM = 16
#: how long a word to the proxy's control socket waits for its answer
CONTROL_ANSWER_MS = 2000
#: at a stop, the proxy's counters unchanged this long with every answer forwarded: it is settled
SETTLED_FOR_S = 0.3
SETTLE_POLL_S = 0.05
SETTLE_TIMEOUT_S = 5.0
#: zmq.proxy_steerable's STATISTICS: (frontend, backend) x (messages in, bytes in, messages out, bytes out)
STAT_FRONTEND_MSG_OUT = 2
STAT_BACKEND_MSG_IN = 4


class Proxy(SocketThread):
    """The proxy thread: the DEALER the children connect to, the public ROUTER, ``zmq.proxy_steerable`` between.

    ``start`` binds the DEALER (the children connect to it as they start); ``open`` binds the public
    endpoint once they are up; ``drain_and_stop`` ends it after every answer the children sent is out.
    """

    def __init__(self, *, context: zmq.Context[Any], listen: str, backend: str, max_body_bytes: int) -> None:
        super().__init__(context=context, name="proxy", run=self._run)
        self._listen = listen
        self._backend = backend
        self._max_msg_bytes = max_body_bytes + OVERSIZE_MARGIN_BYTES
        self._open = threading.Event()  # set by open (or stop): bind the public endpoint (or give up)
        self._opened = threading.Event()  # set on the thread: it is bound, or error says why not
        self._abandon = False
        #: the one socket that talks to the proxy's control PAIR: a PAIR takes one peer, and a second one
        #: connected before the first one's pipe is gone is refused, its words lost (seen: TERMINATE)
        self._client: zmq.Socket[Any] | None = None
        self._client_lock = threading.Lock()
        self.endpoint = ""

    def open(self) -> None:
        """After ``start``: bind the public endpoint and start proxying (raises if it could not be bound)."""
        self._open.set()
        self._opened.wait()
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """End the proxy now (safe from any thread); before ``open``, end the thread that waits for it."""
        if not self._open.is_set():
            self._abandon = True
            self._open.set()
            return
        if self._opened.is_set() and self.error is None:
            try:
                self._ask(b"TERMINATE")
            except TimeoutError as e:  # the context's end stops it (proxy_crashed)
                log.error("proxy_not_stopped", error=str(e))  # noqa: TRY400 - the message says it all
        if self._client is not None:
            self._client.close(linger=CONTROL_ANSWER_MS)

    def statistics(self) -> tuple[int, ...]:
        """The proxy's counters: frontend and backend messages and bytes in and out (eight numbers)."""
        return tuple(int.from_bytes(f, sys.byteorder) for f in self._ask(b"STATISTICS", answer=True))

    def _ask(self, word: bytes, *, answer: bool = False) -> list[bytes]:
        """One word to the proxy; its answer when there is one. TimeoutError when it does not take it."""
        with self._client_lock:
            if self._client is None:
                self._client = self._ctx.socket(zmq.PAIR)
                self._client.setsockopt(zmq.SNDTIMEO, CONTROL_ANSWER_MS)
                self._client.connect(self._control_endpoint)
            try:
                self._client.send(word)
            except zmq.Again as e:
                raise TimeoutError(f"the proxy did not take {word.decode()} in {CONTROL_ANSWER_MS} ms") from e
            if not answer:
                return []
            if not self._client.poll(CONTROL_ANSWER_MS):
                raise TimeoutError(f"the proxy did not answer {word.decode()} in {CONTROL_ANSWER_MS} ms")
            return self._client.recv_multipart()

    def drain_and_stop(self, timeout_s: float) -> bool:
        """After the children stopped: wait until every answer they sent is forwarded, then stop.

        Settled when the messages the backend received equal those the frontend sent, unchanged for
        ``SETTLED_FOR_S`` (what a child wrote before it exited may still be on its way through the
        socket). False when that did not happen within timeout_s (stopped anyway).
        """
        deadline = time.monotonic() + timeout_s
        settled = False
        last: tuple[int, int] | None = None
        since = time.monotonic()
        while self.is_alive() and self._opened.is_set() and self.error is None:
            try:
                stats = self.statistics()
            except TimeoutError as e:
                log.error("proxy_not_settled", error=str(e))  # noqa: TRY400 - the message says it all
                break
            now = (stats[STAT_BACKEND_MSG_IN], stats[STAT_FRONTEND_MSG_OUT])
            if now != last or now[0] != now[1]:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= SETTLED_FOR_S:
                settled = True
                break
            if time.monotonic() > deadline:
                log.error("proxy_not_settled", answers_in=now[0], answers_out=now[1])
                break
            time.sleep(SETTLE_POLL_S)
        self.stop()
        return settled

    def _run(self) -> None:
        ctx = self._ctx
        frontend, backend, control = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER), ctx.socket(zmq.PAIR)
        sockets = (frontend, backend, control)
        try:
            # The parent binds, the children connect: a bound socket has a pipe to a child only while that
            # child is connected (a dead one gets no more requests once its connection closes), and a pipe
            # whose child went away still hands over the answers it holds (LINGER above 0 on the DEALER).
            backend.setsockopt(zmq.RCVHWM, 0)  # answers are never dropped between a child and the proxy
            backend.setsockopt(zmq.SNDHWM, BACKEND_SNDHWM)
            backend.setsockopt(zmq.LINGER, FLUSH_LINGER_MS)
            control.bind(self._control_endpoint)
            backend.bind(self._backend)
        except zmq.ZMQError as e:
            for sock in sockets:
                sock.close(linger=0)
            self.error = e
            self.bound()
            return
        self.bound()  # start returns: the children may connect
        self._open.wait()
        try:
            if self._abandon:
                raise zmq.ZMQError(zmq.ETERM, "stopped before it was opened")
            # As the single process's client socket (broker.py), but never ROUTER_MANDATORY: an answer to a
            # client gone must not stop the proxy; it is dropped.
            frontend.setsockopt(zmq.SNDHWM, FRONTEND_SNDHWM)
            frontend.setsockopt(zmq.RCVHWM, FRONTEND_RCVHWM)
            frontend.setsockopt(zmq.MAXMSGSIZE, self._max_msg_bytes)
            frontend.setsockopt(zmq.LINGER, FLUSH_LINGER_MS)
            frontend.bind(self._listen)
            self.endpoint = frontend.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as e:
            for sock in sockets:
                sock.close(linger=0)
            self.error = e
            self._opened.set()
            return
        self._opened.set()
        log.info("proxy_listening", endpoint=self.endpoint, backend=self._backend)
        try:
            zmq.proxy_steerable(frontend, backend, None, control)
        except zmq.ZMQError as e:
            log.error("proxy_crashed", error=str(e))  # noqa: TRY400 - the message says it all
        finally:
            control.close(linger=0)
            backend.close()
            frontend.close()  # lingers FLUSH_LINGER_MS: the last answers leave
            log.info("proxy_stopped")
