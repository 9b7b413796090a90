"""The progress line of ``cluster rebalance`` and ``cluster drain`` on stderr: done/total, rates, time left."""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from smartcache.ops.moves import Moved

#: how often the line is redrawn (and once more at the end)
REDRAW_S = 1.0
BAR_WIDTH = 30


class Progress:
    """A progress line on stderr: done/total, buckets/s and rows/s, time left (run_moves' progress)."""

    def __init__(self, total: int, out: Any = None) -> None:
        self.total, self.done, self.rows, self.failed = total, 0, 0, 0
        self.started = time.monotonic()
        self.out = out if out is not None else sys.stderr
        self.lock = threading.Lock()
        self._shown = 0.0

    def add(self, moved: Moved | None) -> None:
        with self.lock:
            self.done += 1
            if moved is None:
                self.failed += 1
            else:
                self.rows += moved.rows
            now = time.monotonic()
            if now - self._shown >= REDRAW_S or self.done == self.total:
                self._shown = now
                self.out.write(self.line() + ("\n" if self.done == self.total else "\r"))
                self.out.flush()

    def line(self) -> str:
        took = max(time.monotonic() - self.started, 1e-6)
        rate = self.done / took
        left = (self.total - self.done) / rate if rate > 0 else 0.0
        filled = int(BAR_WIDTH * self.done / max(self.total, 1))
        return (f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self.done}/{self.total} buckets, "
                f"{rate:.1f} buckets/s, {self.rows / took:.0f} rows/s, {left:.0f} s left"
                + (f", {self.failed} given up" if self.failed else ""))  # fmt: skip
