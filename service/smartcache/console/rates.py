"""Rates over the last 15 minutes, from what each service already measures: its Prometheus ``/metrics``.

Every ``scrape_s`` (3 s) the console scrapes each service and keeps, per
service, a bounded ring (``deque(maxlen=window / scrape)``, 300 samples for 15
min) of the few sums it charts. The series are derived between consecutive
samples, as Prometheus' ``rate`` and ``histogram_quantile`` would:

* requests/s: ``smartcache_messages_total`` summed over types and outcomes;
* errors/s by kind: the same for every outcome other than ``ok`` (kind = outcome);
* p99 latency (ms): from the buckets of ``smartcache_request_duration_seconds`` summed over types,
  interpolated inside the bucket the 99th percentile falls in;
* failovers: ``smartcache_storage_leader_changes_total``, the leader changes the service saw.

A counter that goes down (the service restarted) counts from zero again. No
series label is a client or a session.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from smartcache.console.settings import Service

OK_OUTCOMES = frozenset({"ok", "OK"})


@dataclass(frozen=True)
class Sample:
    """The sums of one scrape."""

    t: float  # wall clock, seconds
    requests: float
    by_outcome: dict[str, float]
    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), ascending
    leader_changes: float
    rejections: dict[str, float] = field(default_factory=dict)  # queue refusals by reason, totals
    bulkhead_limits: dict[str, float] = field(default_factory=dict)  # most busy slots per type


def parse(text: str, t: float) -> Sample:
    """One scrape's text, summed."""
    requests, leader_changes = 0.0, 0.0
    by_outcome: dict[str, float] = {}
    buckets: dict[float, float] = {}
    rejections: dict[str, float] = {}
    limits: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "smartcache_messages_total":
                requests += s.value
                outcome = s.labels.get("outcome", "")
                by_outcome[outcome] = by_outcome.get(outcome, 0.0) + s.value
            elif s.name == "smartcache_request_duration_seconds_bucket":
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
            elif s.name == "smartcache_storage_leader_changes_total":
                leader_changes += s.value
            elif s.name == "smartcache_queue_rejections_total":
                rejections[s.labels.get("reason", "")] = s.value
            elif s.name == "smartcache_bulkhead_limit":
                limits[s.labels.get("type", "")] = s.value
    return Sample(t, requests, by_outcome, tuple(sorted(buckets.items())), leader_changes, rejections, limits)


def _delta(new: float, old: float) -> float:
    return new - old if new >= old else new  # a reset: counted from zero


def quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """histogram_quantile over cumulative (upper bound, count) pairs; None without observations."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower  # beyond the last finite bound: its bound, as Prometheus answers
            inside = count - below
            return lower + (upper - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = upper, count
    return lower


def series(samples: Sequence[Sample]) -> dict[str, Any]:
    """The charted series of one service: one point per pair of consecutive samples."""
    out: dict[str, Any] = {"t": [], "requests_per_s": [], "errors_per_s": {}, "p99_ms": [], "failovers": []}
    kinds = sorted({k for s in samples for k in s.by_outcome if k not in OK_OUTCOMES})
    errors: dict[str, list[float]] = {k: [] for k in kinds}
    for old, new in itertools.pairwise(samples):
        dt = new.t - old.t
        if dt <= 0:
            continue
        out["t"].append(round(new.t, 3))
        out["requests_per_s"].append(round(_delta(new.requests, old.requests) / dt, 3))
        for k in kinds:
            errors[k].append(round(_delta(new.by_outcome.get(k, 0.0), old.by_outcome.get(k, 0.0)) / dt, 3))
        olds = dict(old.buckets)
        diff = [(le, _delta(c, olds.get(le, 0.0))) for le, c in new.buckets]
        p99 = quantile(0.99, diff)
        out["p99_ms"].append(None if p99 is None else round(p99 * 1000, 3))
        out["failovers"].append(_delta(new.leader_changes, old.leader_changes))
    out["errors_per_s"] = errors
    return out


@dataclass
class Scraper:
    """Scrapes one service's /metrics into its ring; its state is a part of the page like the others."""

    service: Service
    every_s: float
    window_s: float
    timeout_s: float
    token: str = field(default="", repr=False)
    ring: deque[Sample] = field(init=False)
    error: str | None = field(default="not scraped yet", init=False)
    scraped_at: float | None = field(default=None, init=False)
    started_at: float = field(default_factory=time.monotonic, init=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.ring = deque(maxlen=max(2, int(self.window_s / self.every_s) + 1))

    def start(self, session: aiohttp.ClientSession) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(session), name=f"scrape-{self.service.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def scrape(self, session: aiohttp.ClientSession) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            async with session.get(self.service.metrics_url + "/metrics", headers=headers, timeout=timeout) as r:
                if r.status != 200:
                    self.error = f"/metrics answered HTTP {r.status}"
                    return
                text = await r.text()
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            self.error = f"/metrics: {type(e).__name__}: {e}"[:300] if str(e) else f"/metrics: {type(e).__name__}"
            return
        self.ring.append(parse(text, time.time()))
        self.error, self.scraped_at = None, time.monotonic()

    async def _run(self, session: aiohttp.ClientSession) -> None:
        while True:
            started = time.monotonic()
            await self.scrape(session)
            await asyncio.sleep(max(0.05, self.every_s - (time.monotonic() - started)))

    def view(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.service.name, "ok": self.error is None, **series(list(self.ring))}
        if self.ring:
            out["rejections"] = self.ring[-1].rejections
        if self.error is not None:
            since = self.scraped_at if self.scraped_at is not None else self.started_at
            out.update(error=self.error, no_answer_for_s=round(time.monotonic() - since, 1))
        return out
