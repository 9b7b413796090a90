"""Asks every instance every 50 ms whether it accepts writes: "never two writable" is measured.

A round asks the three instances at the same moment (one thread each, over the
observer's link, which faults never cut) and waits at most ``ASK_TIMEOUT_S``
for each; a frozen or dead instance is "no answer" for that round. When two or
more say writable, those are asked again at once and only a repeat counts: an
old leader that fenced between two questions and its successor cannot both look
writable twice in a row (the successor is elected only after the old lease
ran out, at least the lease margin later). ``max_writable`` is the largest
confirmed count; unconfirmed doubles are kept as ``suspects``.

Each round also keeps, per instance, its role, term, and whether a follower's
upstream replication is in state ``follow`` (for "replication never stops").

The instances asked are the cluster's at the start of each round, so one that a
row adds while the load runs (``Cluster.add_node``) is asked from its next round
on; a round's ``seen`` has the instances there were then.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import tarantool

from tests.faults.cluster import Cluster
from tests.faults.history import History

INTERVAL_S = 0.05
#: threads asking at once: one per instance, more than the suite ever runs (three, four while a row adds one)
ASKERS = 8


@dataclass
class Seen:
    role: str | None  # None: no answer
    writable: bool = False
    term: int = 0
    upstream_ok: bool | None = None  # followers only: every upstream follows
    fenced: bool = False
    wal_broken: Any = None


@dataclass
class Round:
    t: float
    seen: dict[str, Seen]

    def writable(self) -> list[str]:
        return [n for n, s in self.seen.items() if s.writable]


@dataclass
class Sampler:
    cluster: Cluster
    history: History
    rounds: list[Round] = field(default_factory=list)
    max_writable: int = 0
    violations: list[dict[str, Any]] = field(default_factory=list)
    suspects: int = 0
    _conns: dict[str, tarantool.Connection] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _role(self, name: str) -> dict[str, Any] | None:
        """sc.role on the sampler's own connection to this instance (one question at a time per instance)."""
        try:
            conn = self._conns.get(name)
            if conn is None:
                conn = self._conns[name] = self.cluster.open_conn(name)
            return conn.call("sc.role", [None]).data[0]  # type: ignore[no-any-return]
        except (tarantool.error.Error, OSError, tarantool.error.NetworkWarning):
            self._drop(name)
            return None

    def _drop(self, name: str) -> None:
        conn = self._conns.pop(name, None)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _ask(self, name: str) -> Seen:
        r = self._role(name)
        if r is None:
            return Seen(None)
        upstream = None
        if r["role"] == "follower":
            ups = [p.get("upstream_status") for p in r.get("replication") or [] if p.get("uuid") != r["instance_uuid"]]
            ups = [u for u in ups if u is not None]
            upstream = bool(ups) and all(u == "follow" for u in ups)
        return Seen(r["role"], bool(r["writable"]), int(r["term"] or 0), upstream, bool(r["fenced"]), r["wal_broken"])

    def _run(self) -> None:
        asked: set[str] = set()
        with ThreadPoolExecutor(ASKERS, thread_name_prefix="sampler") as pool:
            while not self._stop.is_set():
                started = time.monotonic()
                t = self.history.now()
                names = list(self.cluster.nodes)
                asked.update(names)
                seen = dict(zip(names, pool.map(self._ask, names), strict=True))
                rnd = Round(t, seen)
                writable = rnd.writable()
                count = len(writable)
                if count >= 2:
                    again = dict(zip(writable, pool.map(self._ask, writable), strict=True))
                    confirmed = [n for n, s in again.items() if s.writable]
                    if len(confirmed) >= 2:
                        self.violations.append(
                            {"t": round(t, 3), "writable": confirmed, "terms": [again[n].term for n in confirmed]}
                        )
                    else:
                        self.suspects += 1
                    count = len(confirmed)
                self.max_writable = max(self.max_writable, count)
                self.rounds.append(rnd)
                self._stop.wait(max(0.0, INTERVAL_S - (time.monotonic() - started)))
        for name in asked:
            self._drop(name)

    def start(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    # -- what the rounds say --------------------------------------------------------

    def between(self, t0: float, t1: float) -> list[Round]:
        return [r for r in self.rounds if t0 <= r.t <= t1]

    def first(self, pred: Any, after: float = 0.0) -> float | None:
        """Time of the first round after `after` for which pred(round) is true."""
        return next((r.t for r in self.rounds if r.t >= after and pred(r)), None)

    def no_writable_s(self, t0: float, t1: float) -> float:
        """How long (by rounds) no instance was writable between t0 and t1."""
        rs = self.between(t0, t1)
        total = 0.0
        for a, b in itertools.pairwise(rs):
            if not a.writable():
                total += b.t - a.t
        return total
