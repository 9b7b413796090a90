"""Merge per-process results into one report: throughput, percentiles, outcomes."""

from __future__ import annotations

import math
from typing import Any

from loadtest.generator import Result

OK_LIKE = {
    "OK",
    "NOT_FOUND",
    "CONFLICT",
    "ALREADY_EXISTS",
    "FRESH",
    "BUSY",
    "TIMEOUT",
    "BAD_REQUEST",
    "BACKEND_ERROR",
    "BACKEND_BAD_REPLY",
}
REFUSALS = {"QUEUE_FULL", "EXPIRED", "SHUTTING_DOWN"}


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return math.nan
    k = min(len(sorted_values) - 1, max(0, math.ceil(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


def summarize(values: list[float]) -> dict[str, float]:
    v = sorted(values)
    return {f"p{p:g}_ms": round(percentile(v, p) * 1000, 3) for p in (50, 90, 99, 99.9)} | {
        "max_ms": round(v[-1] * 1000, 3) if v else math.nan
    }


def merge(results: list[Result], *, label: str = "") -> dict[str, Any]:
    started = min(r.started for r in results)
    ended = max(r.ended for r in results)
    counts: dict[str, int] = {}
    answered: list[float] = []
    refused: list[float] = []
    for r in results:
        for outcome, lat in r.latencies.items():
            counts[outcome] = counts.get(outcome, 0) + len(lat)
            (refused if outcome in REFUSALS else answered).extend(lat)
    elapsed = max(ended - started, 1e-9)
    return {
        "label": label,
        "elapsed_s": round(elapsed, 3),
        "sent": sum(r.sent for r in results),
        "no_reply_sent": sum(r.no_reply for r in results),
        "replies": sum(counts.values()),
        "lost": sum(r.lost for r in results),
        "throughput_rps": round(len(answered) / elapsed, 1),
        "refusals_rps": round(len(refused) / elapsed, 1),
        "latency": summarize(answered),
        "refusal_latency": summarize(refused) if refused else None,
        "outcomes": dict(sorted(counts.items())),
        "generator_cpu_s": round(sum(r.cpu_s for r in results), 3),
    }


def format_line(rep: dict[str, Any]) -> str:
    lat = rep["latency"]
    line = (
        f"{rep['label']:<28} {rep['throughput_rps']:>9.0f}/s  p50 {lat['p50_ms']:>7.2f}  p90 {lat['p90_ms']:>7.2f}"
        f"  p99 {lat['p99_ms']:>7.2f}  p99.9 {lat['p99.9_ms']:>7.2f}  max {lat['max_ms']:>8.2f} ms"
    )
    if rep["refusal_latency"]:
        line += f"  refused {rep['refusals_rps']:.0f}/s p99 {rep['refusal_latency']['p99_ms']:.2f} ms"
    if rep["lost"]:
        line += f"  LOST {rep['lost']}"
    return line
