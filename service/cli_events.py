"""smartcache-cli's ``events`` command: follow the event log from a shell.

``events tail`` subscribes like a front server does (Client.subscribe:
EVENTS_READ to catch up from ``--from``, then the service's PUB socket, gaps
recovered) and prints one JSON object per event, a line each, flushed, until
Ctrl-C, ``--count`` events or ``--idle`` seconds without one. cli.py wires it
in, with the service endpoint and CURVE keys of every other command.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from service.client import Client
from service.config import PORT_OFFSET_VARIABLE
from service.errors import CursorTooOld

COMMANDS = ("events",)
EVENTS_ENDPOINT_VARIABLE = "SMARTCACHE_EVENTS_ENDPOINT"
DEFAULT_EVENTS_PORT = 5556
EXIT_OK, EXIT_STATUS = 0, 1
#: without --idle, a poll this long at a time (Ctrl-C ends it)
POLL_S = 3600.0
Emit = Callable[[dict[str, Any]], None]


def default_publishers() -> str:
    """$SMARTCACHE_EVENTS_ENDPOINT, else make run's: port 5556 + $SMARTCACHE_PORT_OFFSET."""
    offset = os.environ.get(PORT_OFFSET_VARIABLE, "").strip()
    port = DEFAULT_EVENTS_PORT + (int(offset) if offset.isdigit() else 0)
    return os.environ.get(EVENTS_ENDPOINT_VARIABLE) or f"tcp://127.0.0.1:{port}"


def add_parsers(sub: Any) -> None:
    """``events tail`` on smartcache-cli's subparsers."""
    ev = sub.add_parser(
        "events",
        help="the event log: follow it (tail)",
        description="Events of every change that matters (session.created/updated/deleted/expired, device.bound, "
        "products.stored) and application events (app.*), numbered by a gap-free sequence.",
    )
    ops = ev.add_subparsers(dest="operation", required=True, metavar="OPERATION", help="what to do")
    tail = ops.add_parser(
        "tail",
        help="print events as they come, one JSON object per line",
        description="Catch up from --from with EVENTS_READ, then follow the service's events socket; every event "
        "once, in order. Exit 0 at Ctrl-C, --count or --idle; 1 if the events after --from were dropped by "
        "retention (CURSOR_TOO_OLD).",
    )
    tail.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="PREFIX",
        help="only events whose topic starts with PREFIX (repeat for several; default: all)",
    )
    tail.add_argument("--from", dest="from_seq", type=int, metavar="N", help="start at sequence N (default: new ones)")
    tail.add_argument(
        "--publishers",
        default=default_publishers(),
        metavar="ENDPOINT[,ENDPOINT...]",
        help=f"the services' events sockets (default: ${EVENTS_ENDPOINT_VARIABLE}, else tcp://127.0.0.1:"
        f"{DEFAULT_EVENTS_PORT} + ${PORT_OFFSET_VARIABLE}; now %(default)s)",
    )
    tail.add_argument("--count", type=int, metavar="N", help="stop after N events")
    tail.add_argument("--idle", type=float, metavar="SECONDS", help="stop after SECONDS without an event")


def run(client: Client, a: argparse.Namespace, emit: Emit) -> int:
    """Print events until told to stop; request errors go to the caller (cli.py prints them)."""
    try:
        with client.subscribe(a.topic, a.from_seq, publishers=a.publishers) as sub:
            printed = 0
            while a.count is None or printed < a.count:
                event = sub.poll(a.idle if a.idle is not None else POLL_S)
                if event is None:
                    if a.idle is not None:
                        break
                    continue
                emit(
                    {
                        "seq": event.seq,
                        "topic": event.topic,
                        "key": event.key,
                        "time_ms": event.time_ms,
                        "payload": event.payload,
                    }
                )
                sys.stdout.flush()
                printed += 1
    except CursorTooOld as e:
        emit({"error": "CURSOR_TOO_OLD", "message": str(e), "oldest_seq": e.oldest_seq})
        return EXIT_STATUS
    except KeyboardInterrupt:
        pass
    return EXIT_OK
