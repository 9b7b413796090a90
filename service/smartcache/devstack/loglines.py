"""What a line of a child's log says: its level, its time and its message, whoever wrote it.

Three kinds of line reach make run's terminal: JSON (ours, and Tarantool's with its own keys),
etcd 3.4's capnslog lines (``2026-12-06 17:29:41.958950 E | rafthttp: failed to dial ...``) and
its raft library's (``raft2026/12/06 17:29:20 INFO: ... became follower at term 0``); anything
else is shown as it is.

Some lines are logged above their weight in every normal start and stop, and looked like failures
to newcomers: Tarantool logs ``leaving orphan mode`` (replication connected: good news) and
``exiting the relay loop`` (a replica went away) at CRITICAL, and a connection whose other end
stopped as an error, as our failover does a leader's stepping down at a stop; an etcd member logs
``E |`` lines while a peer member starts or stops (its streams to that peer fail, and are dialled
again). Those
in `ROUTINE`, and only those, are shown at the level they deserve with a word on why; the level
they were logged at is shown too (``logged_as``), and the log files keep the line as written.
Every other error stays an error.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

#: Tarantool's JSON log keys -> structlog's; the rest of its fields are noise on a terminal
_TARANTOOL_KEYS = {"time": "timestamp", "message": "event"}
_NOISE = ("pid", "cord_name", "fiber_id", "fiber_name", "file", "line")
#: etcd's capnslog: date, time, a level letter, the package, the message
_CAPNSLOG = re.compile(r"\d{4}-\d\d-\d\d (\d\d:\d\d:\d\d\.\d{3})\d* ([CEWNID]) \| (?:([\w./-]+): )?(.*)")
_CAPNSLOG_LEVELS = {"C": "critical", "E": "error", "W": "warning", "N": "info", "I": "info", "D": "debug"}
#: the raft library's own logger inside etcd
_RAFT = re.compile(r"raft\d{4}/\d\d/\d\d (\d\d:\d\d:\d\d) ([A-Z]+): (.*)")
#: a plain line that starts with its level in brackets ("[WARNING] Deprecated ...")
_BRACKETED = re.compile(r"\[(CRITICAL|ERROR|WARNING|WARN|INFO|DEBUG)\] (.*)")


@dataclass(frozen=True)
class Routine:
    """A line logged above its weight in a normal start or stop: shown at level, with why."""

    #: matched against the line's message from its start
    message: re.Pattern[str]
    level: str
    why: str


ROUTINE = (
    Routine(re.compile(r"leaving orphan mode$"), "info", "replication connected (Tarantool says it at CRITICAL)"),
    Routine(
        re.compile(r"exiting the relay loop$"),
        "warning",
        "a replica went away: it stopped or restarts (Tarantool says it at CRITICAL)",
    ),
    Routine(
        re.compile(r"SystemError unexpected EOF when reading from socket, "),
        "warning",
        "the other end of a replication or client connection went away: it stopped or restarts",
    ),
    Routine(
        re.compile(r"failover: stepping down: shutting down$"),
        "info",
        "the leader's own stop: it gives up its key for another to take",
    ),
    Routine(
        re.compile(r"(failed to dial|failed to read|failed to find member|lost the TCP streaming connection) "),
        "warning",
        "a peer etcd member is starting or stopping (or cut off): its streams are dialled again",
    ),
    Routine(
        re.compile(r"Deprecated '--logger=capnslog' flag is set"),
        "info",
        "etcd 3.4's default logger, whose lines are read here",
    ),
)


def parse(line: str) -> dict[str, Any] | None:
    """The line as a structlog event (level, timestamp as the time of day, event...); None: not one we know."""
    event = _json(line) or _etcd(line)
    if event is None:
        return None
    message = str(event["event"])
    for routine in ROUTINE:
        if routine.message.match(message) and event["level"] != routine.level:
            event.update(logged_as=event["level"], level=routine.level, why=routine.why)
            break
    return event


def _json(line: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    event: dict[str, Any] = {_TARANTOOL_KEYS.get(str(k), str(k)): v for k, v in doc.items() if k not in _NOISE}
    event["level"] = str(event.get("level", "info")).lower()
    event["timestamp"] = str(event.get("timestamp", ""))[11:23]  # the time of day is enough here
    event.setdefault("event", "")
    return event


def _etcd(line: str) -> dict[str, Any] | None:
    if m := _CAPNSLOG.fullmatch(line):
        time_of_day, letter, package, message = m.groups()
        event = {"timestamp": time_of_day, "level": _CAPNSLOG_LEVELS[letter], "event": message}
        return {**event, "logger": package} if package else event
    if m := _RAFT.fullmatch(line):
        time_of_day, level, message = m.groups()
        return {"timestamp": time_of_day, "level": level.lower(), "event": message, "logger": "raft"}
    if m := _BRACKETED.fullmatch(line):
        level, message = m.groups()
        return {"timestamp": "", "level": "warning" if level == "WARN" else level.lower(), "event": message}
    return None
