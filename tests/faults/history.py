"""A history of operations, as Jepsen records one: each operation's invoke and complete time and outcome.

Outcomes: ``ok`` (acknowledged: the reply said it was done), ``fail`` (it
certainly was not applied: every attempt was refused with an error whose
"Executed?" is *no*, or storage answered a status that means nothing changed,
such as CONFLICT), ``unknown`` (some attempt may have been applied and none
answered definitely: OUTCOME_UNKNOWN, INTERNAL, or no reply in time).

An operation may take several attempts under one idempotency key (what the
client library does with retries): storage applies it at most once, so a later
definite answer (a replay of the first) settles an earlier unknown attempt.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

OK, FAIL, UNKNOWN = "ok", "fail", "unknown"


@dataclass
class Attempt:
    sent: float
    answered: float
    #: "OK", a status name (CONFLICT...), or a transport error (STORAGE_UNAVAILABLE...), or "TIMEOUT"
    answer: str
    message: str = ""


@dataclass
class Op:
    process: str
    service: str
    workload: str  # set | register | counter | cache | read
    key: str
    value: Any
    invoked: float
    completed: float = 0.0
    outcome: str = UNKNOWN
    #: what the reply said when ok (register: the new rev; counter: the new value)
    result: Any = None
    error: str = ""
    attempts: list[Attempt] = field(default_factory=list)
    #: what else the checker may use (register: "prev", the last op in the log this update read)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def write(self) -> bool:
        return self.workload != "read"


class History:
    """Operations of one scenario, appended from many threads; times are seconds since ``t0``."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.ops: list[Op] = []
        #: what the scenario did, and when: (time, event, details)
        self.events: list[tuple[float, str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def add(self, op: Op) -> None:
        with self._lock:
            self.ops.append(op)

    def mark(self, event: str, **details: Any) -> float:
        t = self.now()
        with self._lock:
            self.events.append((t, event, details))
        return t

    def event_time(self, event: str) -> float | None:
        """When the first event of this name happened (None: never)."""
        return next((t for t, e, _ in self.events if e == event), None)

    def snapshot(self) -> list[Op]:
        with self._lock:
            return list(self.ops)

    def write_jsonl(self, path: Path) -> None:
        """One line per event and per operation, in time order (for reading a failed scenario)."""
        rows: list[tuple[float, dict[str, Any]]] = [(t, {"event": e, "t": round(t, 4), **d}) for t, e, d in self.events]
        rows += [(op.invoked, {"op": asdict(op)}) for op in self.snapshot()]
        rows.sort(key=lambda r: r[0])
        with path.open("w") as f:
            for _, row in rows:
                f.write(json.dumps(row, default=str) + "\n")
