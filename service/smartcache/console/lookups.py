"""Session lookups and the event tail, through the client library, as a front server would ask.

Sessions: by client id, ``SESSION_LIST`` (metadata; it never carries data), and
only when the data is revealed ``SESSION_GET`` for each of at most ``MAX_LISTED``
sessions; by session id, ``SESSION_GET``. ``SESSION_GET`` refreshes the session's
sliding expiry, as every read through the service does (the Tarantool operator
HTTP reads without refreshing, but needs each instance's HTTP port and its own
token): a masked lookup by client id, the usual one, reads nothing and changes
nothing. Data is masked (``"••••"``, with its size in msgpack bytes when it was
read) unless the caller asked to reveal it and gave the operator token (app.py
decides). Nothing
here logs: session data and ids never reach the console's log.

Events: one thread follows the log with ``Client.subscribe`` from the last
``EVENTS_KEPT`` events before the head, into a bounded deque; payloads are
shown by size only (they may carry session data).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
import uuid
from typing import Any

import msgpack

from smartcache.client import Client
from smartcache.wire.errors import CursorTooOld, RequestError

MAX_LISTED = 20
EVENTS_KEPT = 50
MASK = "••••"
#: how long the event tail waits before it subscribes again after an error
RESUBSCRIBE_S = 2.0


def masked(data: Any) -> dict[str, Any]:
    """What the page shows of a value it may not reveal: the mask and the value's size."""
    return {"masked": MASK, "bytes": len(msgpack.packb(data, use_bin_type=True))}


def _text(value: Any) -> Any:
    """Session ids as UUID text; other bytes as hex."""
    if isinstance(value, bytes):
        return str(uuid.UUID(bytes=value)) if len(value) == 16 else value.hex()
    return value


def _one(c: Client, sid: uuid.UUID, reveal: bool) -> dict[str, Any] | None:
    reply = c.session_get(sid)
    if not reply.ok:
        return None
    body = dict(reply.body)
    data = body.pop("data", None)
    body = {k: _text(v) for k, v in body.items() if k != "status"}
    return {"session_id": str(sid), **body, "data": data if reveal else masked(data)}


def sessions(
    endpoint: str,
    timeout_s: float,
    *,
    client_id: str | None = None,
    session_id: str | None = None,
    reveal: bool = False,
) -> dict[str, Any]:
    """A client's sessions or one session, data masked unless reveal; raises ValueError on a bad id."""
    with Client(endpoint, timeout_s=timeout_s) as c:
        if session_id is not None:
            found = _one(c, uuid.UUID(session_id), reveal)
            return {"sessions": [found] if found else [], "session_id": session_id}
        assert client_id is not None
        reply = c.session_list(client_id)
        if not reply.ok:
            return {"error": str(reply.status), "sessions": []}
        out = []
        listed = reply.body.get("sessions") or []
        for listed_meta in listed[:MAX_LISTED]:
            meta = {k: _text(v) for k, v in listed_meta.items()}
            if not reveal:  # not read: its expiry is left as it is
                out.append({**meta, "data": {"masked": MASK}})
                continue
            one = _one(c, uuid.UUID(meta["session_id"]), reveal)
            out.append({**meta, "data": one["data"] if one else None})
        return {"client_id": client_id, "sessions": out, "count": len(listed), "shown": len(out)}


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
