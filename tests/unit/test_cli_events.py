"""`smartcache-cli events tail --idle N` waits at most N seconds for anything, the first read of the log
included: it passes N as the subscription's retry budget (with the service down, the first read used to
retry for the subscription's default 30 s, whatever --idle said)."""

from __future__ import annotations

import argparse
import re
from typing import Any

import pytest

from smartcache.cli import events, exits
from smartcache.client.clients import SUBSCRIBE_RETRY_S

POLLS: list[float] = []


class _Sub:
    def __enter__(self) -> _Sub:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def poll(self, timeout_s: float) -> None:
        POLLS.append(timeout_s)


class _Client:
    def __init__(self) -> None:
        self.subscribed: dict[str, Any] = {}

    def subscribe(self, topics: Any, from_seq: Any, *, publishers: str, retry_s: float) -> _Sub:
        self.subscribed = {"publishers": publishers, "retry_s": retry_s}
        return _Sub()


def _args(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"topic": [], "from_seq": None, "publishers": "tcp://x:1", "count": None, **kw})


def test_idle_bounds_the_subscriptions_retries_and_its_polls() -> None:
    c = _Client()
    assert events.run(c, _args(idle=2.0), lambda doc: None) == exits.OK  # type: ignore[arg-type]
    assert c.subscribed["retry_s"] == 2.0
    assert POLLS[-1] == 2.0


def test_without_idle_the_subscription_keeps_its_default_retries() -> None:
    c = _Client()
    args = _args(idle=None, count=0)
    assert events.run(c, args, lambda doc: None) == exits.OK  # type: ignore[arg-type]
    assert c.subscribed["retry_s"] == SUBSCRIBE_RETRY_S


def test_from_takes_one_sequence_or_one_per_shard_and_refuses_anything_else() -> None:
    assert events.from_sequence("42") == 42
    assert events.from_sequence("s1=10, s2=7") == {"s1": 10, "s2": 7}
    for bad in ("x", "s1=", "s1=a,s2=2"):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(repr(bad))):
            events.from_sequence(bad)


def test_one_sequence_for_a_sharded_cluster_s_logs_is_a_usage_error() -> None:
    class _Sharded(_Client):
        def subscribe(self, topics: Any, from_seq: Any, *, publishers: str, retry_s: float) -> _Sub:
            raise ValueError("a sharded cluster's logs need one sequence per shard: s1=N,s2=M")

    said: list[dict[str, Any]] = []
    assert events.run(_Sharded(), _args(idle=1.0, from_seq=5), said.append) == exits.USAGE  # type: ignore[arg-type]
    assert said[0]["error"] == "BAD_ARGUMENT"
