"""The coloured tail of all the stack's logs, on a terminal: one line each, structlog's console renderer.

Each child's log is followed from its ``run_started`` marker; our JSON lines, Tarantool's and etcd's
are rendered alike, the routine lines logged above their weight shown for what they are
(loglines.py), anything else shown as is. make run's own lines and its banner are printed between
two polls, so lines never interleave.
"""

from __future__ import annotations

import threading
from typing import Any, TextIO

import structlog

from smartcache.devstack import loglines
from smartcache.devstack.child import Child

TAIL_POLL_S = 0.2
TAIL_JOIN_TIMEOUT_S = 2.0

_NAME_COLOURS = ("\x1b[36m", "\x1b[35m", "\x1b[33m", "\x1b[32m", "\x1b[34m")
_RESET = "\x1b[0m"


class LogTail:
    """Follows the children's logs from their run_started marker; prints each line rendered by structlog.

    A daemon thread polls the files; ``banner`` prints between two polls, so lines never interleave.
    """

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self._renderer = structlog.dev.ConsoleRenderer(colors=True, pad_event_to=25)
        self._files: list[tuple[Child, str, Any]] = []
        self._partial: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-tail", daemon=True)

    def start(self) -> LogTail:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Print what is left, then stop following (the thread is a daemon: a wait is bounded, never a hang)."""
        self._stop.set()
        self._thread.join(TAIL_JOIN_TIMEOUT_S)
        self.poll()
        for _, _, f in self._files:
            f.close()

    def _run(self) -> None:
        while not self._stop.wait(TAIL_POLL_S):
            self.poll()

    def banner(self, lines: list[tuple[str, str]]) -> None:
        self.poll()
        with self._lock:
            print_banner(lines, self.out)

    def say(self, text: str, out: TextIO) -> None:
        """One line of make run's own, between two polls (never in the middle of a child's line)."""
        self.poll()
        with self._lock:
            print(text, file=out, flush=True)

    def follow(self, child: Child) -> None:
        assert child.log_path is not None, "every child of the stack logs to a file"
        f = child.log_path.open("rb")
        f.seek(child.log_offset)
        colour = _NAME_COLOURS[len(self._files) % len(_NAME_COLOURS)]
        with self._lock:
            self._files.append((child, f"{colour}{child.name:<8}{_RESET}|", f))

    def poll(self) -> None:
        """Print every complete line written since the last poll."""
        with self._lock:
            for child, prefix, f in self._files:
                data = self._partial.pop(child.name, b"") + f.read()
                *lines, rest = data.split(b"\n")
                if rest:
                    self._partial[child.name] = rest
                for line in lines:
                    if line.strip():
                        print(prefix, self.render(line.decode(errors="replace")), file=self.out)
            self.out.flush()

    def render(self, line: str) -> str:
        """A log line (ours, Tarantool's, etcd's) as one readable, coloured line; anything else as is."""
        event = loglines.parse(line)
        return line if event is None else str(self._renderer(None, "", event))


def print_banner(lines: list[tuple[str, str]], out: TextIO) -> None:
    """Two aligned columns: what, where."""
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        print(f"  {k:<{width}}  {v}", file=out, flush=True)
