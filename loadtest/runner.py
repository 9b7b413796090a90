"""Run a job over several processes (so the generator is not GIL-bound) and merge the results."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import queue
import sys
import time
from dataclasses import replace
from typing import Any

from loadtest.generator import Job, run_job
from loadtest.report import merge


def run(job: Job, processes: int, *, label: str = "", progress: bool = True) -> dict[str, Any]:
    """Split job over processes (in-flight and rate are per whole run), return the merged report."""
    ctx = mp.get_context("fork")
    results: Any = ctx.Queue()
    prog: Any = ctx.Queue()
    per = [
        replace(
            job,
            inflight=max(1, job.inflight // processes) + (1 if i < job.inflight % processes else 0)
            if job.inflight >= processes
            else (1 if i < job.inflight else 0),
            rate=job.rate / processes,
            seed=(job.seed or 0) * 1000 + i,
        )
        for i in range(processes)
    ]
    per = [p for p in per if p.inflight > 0 or p.rate > 0]
    procs = [ctx.Process(target=run_job, args=(p, results, prog), daemon=True) for p in per]
    for p in procs:
        p.start()
    done: list[Any] = []
    replies: dict[int, int] = {}  # pid -> replies so far
    started = time.monotonic()
    while len(done) < len(procs):
        with contextlib.suppress(queue.Empty):
            done.append(results.get(timeout=1.0))
        while True:
            try:
                pid, count = prog.get_nowait()
            except queue.Empty:
                break
            replies[pid] = count
        if progress:
            elapsed = time.monotonic() - started
            total = sum(replies.values())
            print(
                f"\r  {label}: {elapsed:5.1f}s of {job.duration_s:.0f}s, {total} replies, "
                f"~{total / max(elapsed, 1e-9):.0f}/s   ",
                end="",
                file=sys.stderr,
                flush=True,
            )
    for p in procs:
        p.join(10)
    if progress:
        print("\r", end="", file=sys.stderr)
    return merge(done, label=label)
