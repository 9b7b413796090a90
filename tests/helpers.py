"""Shared test helpers: wait for a condition, read one metric."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

T = TypeVar("T")


def eventually(predicate: Callable[[], T], timeout_s: float = 10.0, interval_s: float = 0.02, what: str = "") -> T:
    """Poll until predicate() is truthy; returns its value, or fails the test at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not true within {timeout_s} s: {what or predicate}")
        time.sleep(interval_s)


def metric(url: str, name: str, labels: Mapping[str, str] | None = None) -> float:
    """One sample from a Prometheus endpoint: the sum over series matching the labels given (0 if none)."""
    text = httpx.get(url, timeout=5).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in (labels or {}).items()):
                total += sample.value
    return total
