"""One bucket's move, a move given up, and many moves at once (rebalance, drain).

The steps, in the order that keeps a bucket active on at most one shard (the package's
docstring): send_start, recv_start, the rows, send_done, recv_done, the map, gc. A failure
before send_done gives the move up (:func:`give_up`); after it the move only goes forward,
and what a driver could not finish is the settler's.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from smartcache.ops import instances
from smartcache.ops.access import Access
from smartcache.ops.moves.bucketmap import assign, owners, read_map
from smartcache.ops.moves.errors import MoveError, ok
from smartcache.ops.moves.link import Link, Links

#: the sharded spaces, in the order a bucket's rows are copied (a session before its cache entries: storage
#: checks a cache entry's bucket by its session)
SPACES = (
    "sessions", "rotations", "cache", "device", "prewarm", "counters", "registers", "sequences",
    "semaphore_holders", "latches", "queue_tasks",
)  # fmt: skip
#: rows per chunk of a copy (storage takes up to 2,000)
CHUNK = 1000


@dataclass
class Moved:
    """What one move did and how long calls of the bucket were paused."""

    bucket: int
    source: str
    destination: str
    rows: int = 0
    paused_ms: float = 0.0
    chunks: int = 0
    steps: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"bucket": self.bucket, "from": self.source, "to": self.destination, "rows": self.rows,
                "paused_ms": round(self.paused_ms, 1), "chunks": self.chunks}  # fmt: skip


class Progress(Protocol):
    """What run_moves tells as each move ends (None: given up); the CLI draws a progress line from it."""

    def add(self, moved: Moved | None) -> None: ...


def move(access: Access, links: Links, bucket: int, destination: str) -> Moved:
    """Move bucket to destination, from the shard the map names; MoveError when the move was given up (the bucket
    active where it was) or, past the source's send_done, left for the settler to finish."""
    doc, _ = read_map(access)
    if not 0 <= bucket < int(doc["buckets"]):
        raise MoveError(f"bucket must be 0..{int(doc['buckets']) - 1}, not {bucket}")
    source = owners(doc)[bucket]
    if source == destination:
        raise MoveError(f"bucket {bucket} is on {destination} already")
    if destination not in doc["shards"]:
        raise MoveError(f"no shard {destination!r} in the map (cluster shard add first)")
    src, dst = links[source], links[destination]
    state = ok(src.call("bucket_state", bucket), f"bucket {bucket} on {source}")
    if state.get("state") != "active":
        raise MoveError(f"bucket {bucket} is {state.get('state')} on {source}, not active: settle it first")
    out = Moved(bucket, source, destination)
    started = time.monotonic()
    gen = int(ok(src.call("bucket_send_start", bucket, destination, state["generation"]), "send_start")["generation"])
    try:
        ok(
            dst.call("bucket_recv_start", bucket, source, gen, state.get("numbers") or {}),
            f"recv_start on {destination}",
        )
        _copy(src, dst, out, gen)
        ok(src.call("bucket_send_done", bucket, gen), "send_done")
    except Exception as e:  # any failure before the source is sent: give the move up (or find it sent after all)
        if give_up(links, bucket, source, destination, gen) != "forward":
            raise MoveError(f"bucket {bucket} {source} -> {destination} given up: {type(e).__name__}: {e}") from e
    # Past send_done the move only goes forward (a failure here is the settler's to finish).
    try:
        ok(dst.call("bucket_recv_done", bucket, gen), "recv_done")
    except MoveError as e:
        raise MoveError(f"bucket {bucket} {source} -> {destination}: sent, left for the settler: {e}") from e
    out.paused_ms = (time.monotonic() - started) * 1000
    assign(access, {bucket: destination}, was={bucket: source})
    try:
        ok(src.call("bucket_gc", bucket, gen), "gc")
    except MoveError as e:  # moved all the same: the garbage is the settler's
        out.steps.append(f"gc left for the settler: {e}")
    return out


def _copy(src: Link, dst: Link, out: Moved, gen: int) -> None:
    """The bucket's rows, space by space, page by page (each chunk one synchronous transaction on the
    destination); counted in out."""
    for space in SPACES:
        after = None
        while True:
            page = ok(src.call("bucket_rows", out.bucket, gen, space, after, CHUNK), f"rows of {space}")
            if page["rows"]:
                ok(dst.call("bucket_recv", out.bucket, gen, space, page["rows"]), f"recv of {space}")
                out.rows += len(page["rows"])
                out.chunks += 1
            if page["done"]:
                break
            after = page["last"]


def give_up(links: Links, bucket: int, source: str, destination: str, generation: int) -> str:
    """Give a move at generation up: the source active again (at generation + 1), and only then the destination's
    copy deleted. Returns "given up"; "forward" when the source turned out to be sent at that generation (the
    destination is made active instead); "unknown" when the source could not say (the destination is left alone:
    the settler decides once it can ask both)."""
    try:
        r = links[source].call("bucket_send_abort", bucket, generation)
    except (MoveError, *instances.CONNECTION_ERRORS):
        return "unknown"
    if r.get("status") == "OK":
        with contextlib.suppress(MoveError, *instances.CONNECTION_ERRORS):
            links[destination].call("bucket_recv_abort", bucket, generation)
        return "given up"
    if r.get("state") in ("sent", "garbage") and r.get("generation") == generation:
        with contextlib.suppress(MoveError, *instances.CONNECTION_ERRORS):
            if links[destination].call("bucket_recv_done", bucket, generation).get("status") == "OK":
                return "forward"
    return "unknown"


class _Batch:
    """run_moves' shared state: the moves left to do, what each did."""

    def __init__(self, moves: Sequence[tuple[int, str]], progress: Progress | None) -> None:
        self.todo = list(moves)
        self.results: list[Moved] = []
        self.errors: list[str] = []
        self.progress = progress
        self.lock = threading.Lock()

    def next(self) -> tuple[int, str] | None:
        with self.lock:
            return self.todo.pop(0) if self.todo else None

    def done(self, moved: Moved | None, error: str = "") -> None:
        with self.lock:
            if moved is None:
                self.errors.append(error)
            else:
                self.results.append(moved)
        if self.progress is not None:
            self.progress.add(moved)


def _worker(access: Access, batch: _Batch, pause_s: float) -> None:
    """One worker of run_moves: moves until none is left, on connections of its own."""
    links = Links(access)
    try:
        while (item := batch.next()) is not None:
            try:
                moved = move(access, links, *item)
            except Exception as e:  # reported with the others; the next move goes on
                batch.done(None, str(e))
                continue
            batch.done(moved)
            if pause_s > 0:
                time.sleep(pause_s)
    finally:
        links.close()


def run_moves(
    access: Access,
    moves: Sequence[tuple[int, str]],
    *,
    parallel: int = 2,
    pause_s: float = 0.0,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Do the moves, at most parallel at once (each worker its own connections), pause_s between one worker's
    moves (throttling, so the front tier keeps its latency). Returns the totals and the pause per bucket."""
    batch = _Batch(moves, progress)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        workers = max(1, min(parallel, len(batch.todo)))
        for f in [pool.submit(_worker, access, batch, pause_s) for _ in range(workers)]:
            f.result()
    return _totals(batch, time.monotonic() - started)


def _totals(batch: _Batch, took: float) -> dict[str, Any]:
    """run_moves' answer: counts, rates and the pause per bucket (p50, p99, max)."""
    results, errors = batch.results, batch.errors
    pauses = sorted(m.paused_ms for m in results)

    def pct(p: float) -> float:
        return round(pauses[min(len(pauses) - 1, int(p * len(pauses)))], 1) if pauses else 0.0

    rows = sum(m.rows for m in results)
    return {
        "status": "OK" if not errors else "INCOMPLETE",
        "moved": len(results),
        "given_up": len(errors),
        "errors": errors[:20],
        "rows": rows,
        "seconds": round(took, 1),
        "buckets_per_s": round(len(results) / took, 2) if took > 0 else None,
        "rows_per_s": round(rows / took) if took > 0 else None,
        "paused_ms": {"p50": pct(0.5), "p99": pct(0.99), "max": pauses[-1] if pauses else 0.0},
    }
