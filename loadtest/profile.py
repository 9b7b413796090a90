"""``python -m loadtest profile``: where the service's loop spends its time at W=16, sampled by py-spy.

A fresh stack (one Tarantool, wal_mode write, and the service), the session scenario at W=16,
and py-spy sampling the service's threads meanwhile (``--threads``, idle frames left out, so a
sample is a moment a thread was on the CPU). Printed: the share of the samples each thread had,
and for the busiest (the event loop) the functions with the most samples of their own ("self")
and with the most under them ("total"); the raw stacks go to ``var/profile-w16.txt``
(``--format raw``: one collapsed stack and its count per line, for flame-graph tools).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from loadtest import ceiling, runner
from loadtest.generator import Job
from loadtest.report import format_line
from loadtest.stack import stack

_THREAD = re.compile(r"^thread \((\w+)\)(?:: (.*))?$")  # py-spy's first frame: thread (tid): its name


def _py_spy() -> str:
    here = Path(sys.executable).parent / "py-spy"  # the venv's (a dev dependency)
    return str(here) if here.exists() else "py-spy"


def summarize(raw: str, top: int = 15) -> dict[str, Any]:
    """Collapsed stacks (``thread (tid): name;frame;frame count``) -> shares per thread and the loop's top functions."""
    per_thread: Counter[str] = Counter()
    stacks: list[tuple[str, list[str], int]] = []
    for line in filter(None, map(str.strip, raw.splitlines())):
        stack_text, _, count_text = line.rpartition(" ")
        frames = stack_text.split(";")
        m = _THREAD.match(frames[0])
        thread = f"{m.group(2) or 'thread'} ({m.group(1)})" if m else "?"
        n = int(count_text)
        per_thread[thread] += n
        stacks.append((thread, frames[1:] if m else frames, n))
    total = sum(per_thread.values()) or 1
    loop = per_thread.most_common(1)[0][0] if per_thread else "?"
    own: Counter[str] = Counter()
    under: Counter[str] = Counter()
    for thread, frames, n in stacks:
        if thread != loop or not frames:
            continue
        own[_short(frames[-1])] += n
        for f in {_short(f) for f in frames}:
            under[f] += n
    loop_n = per_thread[loop] or 1
    return {
        "samples": total,
        "thread_share": {t: round(n / total, 3) for t, n in per_thread.most_common()},
        "loop_self": [(f, round(n / loop_n, 3)) for f, n in own.most_common(top)],
        "loop_total": [(f, round(n / loop_n, 3)) for f, n in under.most_common(top)],
    }


def _short(frame: str) -> str:
    """``func (path/to/module.py:12)`` -> ``func (module.py)``: one name per function, whatever the line."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = path.split("/")
    return f"{name} ({'/'.join(parts[-2:]) if len(parts) > 1 else path})"


def run(
    inflight: int = 16, duration_s: float = 15.0, rate: int = 250, out: str = "var/profile-w16.txt", target: str = ""
) -> int:
    """target: "" the service; "sketch drained" the bare path on the same kind of stack, for comparison."""
    with stack(tarantool_env={"SC_WAL_MODE": "write"}) as (master, service), contextlib.ExitStack() as more:
        endpoint, pid = service.endpoint, service.proc.pid
        if target:
            drained = "drained" in target
            sketch = more.enter_context(ceiling.running("sketch", tarantool=master.address, drained=drained))
            endpoint, pid = sketch.endpoint, sketch.pid
        return _record(endpoint, pid, inflight, duration_s, rate=rate, out=out)


def _record(endpoint: str, pid: int, inflight: int, duration_s: float, *, rate: int, out: str) -> int:
    runner.run(Job(endpoint=endpoint, scenario="session", duration_s=2, inflight=inflight), 2, progress=False)
    job = Job(endpoint=endpoint, scenario="session", duration_s=duration_s + 2, inflight=inflight)
    result: dict[str, Any] = {}
    load = threading.Thread(target=lambda: result.update(runner.run(job, 2, label=f"W={inflight}", progress=False)))
    load.start()
    cmd = [_py_spy(), "record", "--pid", str(pid), "--threads", "--rate", str(rate), "--nonblocking"]
    spy = subprocess.run(
        [*cmd, "--duration", str(int(duration_s)), "--format", "raw", "--output", out],
        capture_output=True,
        text=True,
        check=False,
    )
    load.join()
    if spy.returncode != 0:
        print(f"py-spy failed ({spy.returncode}): {spy.stderr.strip()[-500:]}")
        return 1
    print(format_line(result))
    s = summarize(Path(out).read_text())
    print(f"\n{s['samples']} samples at {rate}/s while on the CPU; share of them by thread:")
    for t, share in s["thread_share"].items():
        print(f"  {share:6.1%}  {t}")
    print("\nthe loop's thread, by the function on top of the stack (self):")
    for f, share in s["loop_self"]:
        print(f"  {share:6.1%}  {f}")
    print("\nthe loop's thread, by the function anywhere on the stack (total):")
    for f, share in s["loop_total"]:
        print(f"  {share:6.1%}  {f}")
    print(f"\nraw stacks: {out}")
    return 0
