"""CPU per request, thread by thread, from ``/proc/<pid>/task/<tid>/stat``: where each microsecond goes.

A snapshot is every thread's utime + stime; two snapshots and the requests answered between
them give microseconds per request for each named thread. Python does not name its threads
for the kernel (they are all ``python``): the busiest one is the event loop's, reported as
``loop``, the rest together as ``other python``. Tarantool names its own (``tarantool`` is
the transaction thread, ``wal``, ``iproto``, ``coio``); libzmq's are ``ZMQbg/IO/n`` and
``ZMQbg/Reaper``.
"""

from __future__ import annotations

from pathlib import Path

from loadtest.stack import CLK_TCK

Snapshot = dict[int, tuple[str, float]]  # tid -> (thread name, CPU seconds so far)


def snapshot(pid: int) -> Snapshot:
    """Every live thread of a process; a thread that ended since is simply absent."""
    out: Snapshot = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(task.name)] = (comm, (int(fields[11]) + int(fields[12])) / CLK_TCK)
    return out


def per_request(before: Snapshot, after: Snapshot, requests: int) -> dict[str, float]:
    """Microseconds of CPU per request by thread name, the busiest ``python`` thread as ``loop``."""
    spent: dict[int, tuple[str, float]] = {
        tid: (name, seconds - before.get(tid, (name, 0.0))[1]) for tid, (name, seconds) in after.items()
    }
    python = sorted((s for name, s in spent.values() if name == "python"), reverse=True)
    groups: dict[str, float] = {}
    if python:
        groups["loop"] = python[0]
        if len(python) > 1:
            groups["other python"] = sum(python[1:])
    for name, seconds in spent.values():
        if name != "python":
            key = "ZMQbg/IO" if name.startswith("ZMQbg/IO") else name
            groups[key] = groups.get(key, 0.0) + seconds
    n = max(1, requests)
    return {k: round(v / n * 1e6, 1) for k, v in groups.items() if v > 0}


def total(per: dict[str, float]) -> float:
    return round(sum(per.values()), 1)
