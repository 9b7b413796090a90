"""One load-generating process: a DEALER socket, many requests in flight, no asyncio.

Closed loop: ``inflight`` requests outstanding at all times; each reply sends
the slot's next request. Open loop: requests leave at a fixed rate whatever
the replies do, and latency is measured from the *intended* send time, so a
stalled service shows in the tail (no coordinated omission).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import zmq

from loadtest.scenarios import Request, make
from smartcache.client import CurveKeys
from smartcache.server.zmqio import recv_frames, send_frames
from smartcache.wire import (
    FLAG_NO_REPLY,
    REGISTRY,
    Header,
    decode_body,
    decode_header,
    encode_body,
    encode_header,
)

PROGRESS_EVERY_S = 1.0
DRAIN_S = 3.0
NO_REPLY_TYPES = {"APP_START"}


@dataclass
class Result:
    """What one process saw; merged by the parent."""

    sent: int = 0
    no_reply: int = 0
    #: outcome name (status or transport error) -> latencies in seconds
    latencies: dict[str, list[float]] = field(default_factory=dict)
    lost: int = 0
    started: float = 0.0
    ended: float = 0.0
    #: this process's CPU seconds (all its threads: the loop and libzmq's) from start to the end of the load
    cpu_s: float = 0.0

    def add(self, outcome: str, seconds: float) -> None:
        self.latencies.setdefault(outcome, []).append(seconds)


@dataclass
class Job:
    endpoint: str
    scenario: str
    duration_s: float
    inflight: int = 16
    rate: float = 0.0  # > 0: open loop at this many requests per second
    lifetime_ms: int = 0
    seed: int | None = None
    #: talk CURVE to a service that requires it
    curve: CurveKeys | None = None


class Generator:
    def __init__(self, job: Job, progress: Any = None) -> None:
        self.job = job
        self.scenario = make(job.scenario, job.seed)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        if job.curve is not None:
            job.curve.apply(self.sock)
        self.sock.connect(job.endpoint)
        self.progress = progress
        self.result = Result()
        self.rid = 0
        #: request id -> (latency origin time, slot)
        self.pending: dict[int, tuple[float, int]] = {}

    def _send(self, req: Request, slot: int, origin: float) -> bool:
        """Send; returns False for a no-reply type (nothing will come back)."""
        type_name, body, session = req
        self.rid += 1
        no_reply = type_name in NO_REPLY_TYPES
        h = Header.request(
            REGISTRY.types[type_name].id,
            request_id=self.rid,
            session_id=session,
            lifetime_ms=self.job.lifetime_ms,
            flags=FLAG_NO_REPLY if no_reply else 0,
        )
        send_frames(self.sock, [encode_header(h), encode_body(body)])
        self.result.sent += 1
        if no_reply:
            self.result.no_reply += 1
            return False
        self.pending[self.rid] = (origin, slot)
        return True

    def _receive(self, now: float) -> tuple[int, str, bytes] | None:
        frames = recv_frames(self.sock)
        h = decode_header(frames[0], check_type=False)
        entry = self.pending.pop(h.request_id, None)
        if entry is None:
            return None
        origin, slot = entry
        if h.transport_error:
            outcome = REGISTRY.transport_error_names.get(h.transport_error, "UNKNOWN")
        else:
            outcome = REGISTRY.status_names.get(decode_body(frames[1]).get("status", -1), "UNKNOWN")
        self.result.add(outcome, now - origin)
        return slot, outcome, h.session_id

    def _next_for(self, slot: int, status: str, session: bytes, now: float) -> None:
        req = self.scenario.next(slot, status, session)
        while not self._send(req, slot, now):
            req = self.scenario.next(slot, "OK", b"\0" * 16)

    def run(self) -> Result:
        r = self.result
        r.started = time.monotonic()
        cpu0 = time.process_time()
        end = r.started + self.job.duration_s
        if self.job.rate > 0:
            self._open_loop(end)
        else:
            self._closed_loop(end)
        r.ended = min(time.monotonic(), end) if self.job.rate > 0 else time.monotonic()
        r.cpu_s = time.process_time() - cpu0
        self._drain()
        self.sock.close()
        self.ctx.term()
        return r

    def _closed_loop(self, end: float) -> None:
        now = time.monotonic()
        for slot in range(self.job.inflight):
            req = self.scenario.first(slot)
            while not self._send(req, slot, now):
                req = self.scenario.next(slot, "OK", b"\0" * 16)
        next_progress = now + PROGRESS_EVERY_S
        sock = self.sock
        while True:
            if not sock.poll(100):
                now = time.monotonic()
                if now >= end:
                    return
                continue
            while sock.get(zmq.EVENTS) & zmq.POLLIN:
                now = time.monotonic()
                got = self._receive(now)
                if got is not None and now < end:
                    self._next_for(got[0], got[1], got[2], now)
            if now >= next_progress:
                self._report_progress()
                next_progress = now + PROGRESS_EVERY_S
            if now >= end:
                return

    def _open_loop(self, end: float) -> None:
        interval = 1.0 / self.job.rate
        intended = time.monotonic()
        next_progress = intended + PROGRESS_EVERY_S
        slot = 0
        sock = self.sock
        while intended < end:
            now = time.monotonic()
            while intended <= now and intended < end:  # catch up: latency counts from the intended time
                slot += 1
                self._send(self.scenario.next(slot % 1024, "OK", b"\0" * 16), slot, intended)
                intended += interval
            wait_ms = max(0, int((intended - time.monotonic()) * 1000))
            if sock.poll(wait_ms):
                while sock.get(zmq.EVENTS) & zmq.POLLIN:
                    got = self._receive(time.monotonic())
                    if got is not None and got[2] != b"\0" * 16:
                        self.scenario.next(got[0] % 1024, got[1], got[2])
            if now >= next_progress:
                self._report_progress()
                next_progress = now + PROGRESS_EVERY_S

    def _drain(self) -> None:
        """Collect replies to what is still in flight, then count the rest as lost."""
        deadline = time.monotonic() + DRAIN_S
        while self.pending and time.monotonic() < deadline:
            if self.sock.poll(50):
                while self.sock.get(zmq.EVENTS) & zmq.POLLIN:
                    self._receive(time.monotonic())
        self.result.lost = len(self.pending)

    def _report_progress(self) -> None:
        if self.progress is not None:
            done = sum(len(v) for v in self.result.latencies.values())
            self.progress.put((os.getpid(), done))


def run_job(job: Job, results: Any, progress: Any) -> None:
    """multiprocessing target."""
    results.put(Generator(job, progress).run())
