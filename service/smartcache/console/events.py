"""The event tail: the last events of the log, followed through the client library as a front server would.

One thread follows the log with ``Client.subscribe`` from the last ``EVENTS_KEPT`` events before
the head, into a bounded deque; payloads are shown by size only (they may carry session data),
keys as the events carry them (a session's handle: never its id, issue 37). Nothing here logs.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from typing import Any

from smartcache.client import Client
from smartcache.console.sessions import masked
from smartcache.wire.errors import CursorTooOld, RequestError

EVENTS_KEPT = 50
#: how long the event tail waits before it subscribes again after an error
RESUBSCRIBE_S = 2.0


class EventTail(threading.Thread):
    """The last events of the log (topic, key, sequence, time, payload size), newest last."""

    def __init__(self, *, endpoint: str, publishers: str, timeout_s: float, kept: int = EVENTS_KEPT) -> None:
        super().__init__(name="console-events", daemon=True)
        self.endpoint = endpoint
        self.publishers = publishers
        self.timeout_s = timeout_s
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=kept)
        self.kept = kept
        self.error: str | None = "not subscribed yet"
        self.stopping = threading.Event()
        self._from: int | None = None  # where to start when nothing is kept yet (retention dropped the rest)

    def stop(self) -> None:
        self.stopping.set()

    def _follow(self) -> None:
        with Client(self.endpoint, timeout_s=self.timeout_s) as c:
            after = self.events[-1]["seq"] + 1 if self.events else self._from
            if after is None:
                head = c.call("EVENTS_READ", {})
                after = max(1, int(head.body.get("head_seq") or 0) - self.kept + 1)
            with c.subscribe((), after, publishers=self.publishers, retry_s=self.timeout_s) as sub:
                self.error = None
                while not self.stopping.is_set():
                    e = sub.poll(0.5)
                    if e is None:
                        continue
                    self.events.append(
                        {
                            "seq": e.seq,
                            "topic": e.topic,
                            "key": e.key,
                            "time_ms": e.time_ms,
                            "shard": e.shard or None,
                            "payload": masked(e.payload),
                        }
                    )

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self._follow()
            except CursorTooOld as e:  # the kept events fell out of retention: from the oldest one left
                self.events.clear()
                self._from, self.error = e.oldest_seq, f"CURSOR_TOO_OLD: {e}"
                continue
            except (RequestError, OSError, ValueError) as e:
                self.error = f"{type(e).__name__}: {e}"[:300]
            except Exception as e:  # anything else the stream raised: shown, subscribed again
                self.error = f"{type(e).__name__}: {e}"[:300]
            with contextlib.suppress(Exception):
                self.stopping.wait(RESUBSCRIBE_S)

    def view(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": self.error is None, "events": list(self.events)[::-1], "at": time.time()}
        if self.error is not None:
            out["error"] = self.error
        return out
