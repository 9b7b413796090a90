"""A child process started by us and stopped by its PID, gone when we are.

Every child gets ``PR_SET_PDEATHSIG`` (SIGTERM): a parent killed by -9 leaves none behind. The
kernel sends it when the *thread* that forked the child ends, so a supervisor starts its children
from one long-lived thread (the main one). A child whose parent died between the fork and the
``prctl`` (it would never get the signal) ends itself at once. Its signal mask is emptied: a
supervisor blocks the signals it takes with ``sigtimedwait`` (signals.py), and a child must not
inherit that. libc is loaded before any fork: between fork and exec the child calls only
``prctl``, ``getppid``, ``kill`` and ``sigprocmask`` (no lock, no allocation of its own).

With a log file, each start appends a ``run_started`` JSON line first, so one run's lines are
easy to find in an appended log; without one, the child writes where its parent does.
"""

from __future__ import annotations

import ctypes
import datetime
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: a child that ignores SIGTERM this long gets SIGKILL
STOP_TIMEOUT_S = 15.0
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: the child only calls it


def die_with_parent(parent_pid: int) -> Callable[[], None]:
    """preexec_fn: SIGTERM when the parent dies (and at once if it died already), no signal blocked."""

    def preexec() -> None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGTERM)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())

    return preexec


def _now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Child:
    """A child process started by us and stopped by its PID."""

    name: str
    argv: list[str]
    #: added to our environment (replace_env: the whole environment)
    env: dict[str, str]
    #: its stdout and stderr, appended (None: ours)
    log_path: Path | None = None
    cwd: Path | None = None
    replace_env: bool = False
    #: a session of its own (setsid); else a process group of its own. Either way a Ctrl-C on the terminal
    #: reaches only the supervisor, which stops its children in its own order
    new_session: bool = True
    proc: subprocess.Popen[bytes] | None = None
    #: where this run's lines start in log_path (after the run_started marker)
    log_offset: int = 0
    #: time.monotonic() of the last start
    started_at: float = 0.0

    def start(self) -> None:
        env = self.env if self.replace_env else {**os.environ, **self.env}
        preexec = die_with_parent(os.getpid())
        group = None if self.new_session else 0
        self.started_at = time.monotonic()
        if self.log_path is None:
            self.proc = subprocess.Popen(
                self.argv,
                env=env,
                cwd=self.cwd,
                preexec_fn=preexec,  # noqa: PLW1509 - prctl, getppid, kill, sigprocmask: no locks
                start_new_session=self.new_session,
                process_group=group,
            )
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            marker = {"timestamp": _now_iso(), "level": "info", "event": "run_started", "process": self.name}
            log.write(json.dumps({**marker, "argv": self.argv, "by_pid": os.getpid()}).encode() + b"\n")
            log.flush()
            self.log_offset = log.tell()
            self.proc = subprocess.Popen(
                self.argv,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                preexec_fn=preexec,  # noqa: PLW1509 - prctl, getppid, kill, sigprocmask: no locks
                start_new_session=self.new_session,
                process_group=group,
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        """Its exit status once it ended (negative: the signal that killed it); None while it runs."""
        return self.proc.returncode if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send_signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def wait(self, timeout_s: float | None = None) -> int | None:
        """Until it exits (subprocess.TimeoutExpired after timeout_s); its exit status."""
        return self.proc.wait(timeout_s) if self.proc is not None else None

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """Send sig, wait up to timeout_s, then SIGKILL; returns the exit code (reaps it)."""
        if self.proc is None:
            return None
        if self.alive():
            os.kill(self.pid, sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(timeout_s)
        return self.proc.returncode

    def log_tail(self, lines: int = 30) -> str:
        if self.log_path is None:
            return ""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""
