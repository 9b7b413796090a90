"""smartcache-cli's ``events`` command: follow the event log from a shell.

``events tail`` subscribes like a front server does (Client.subscribe:
EVENTS_READ to catch up from ``--from``, then the service's PUB socket, gaps
recovered) and prints one JSON object per event, a line each, flushed, until
Ctrl-C, ``--count`` events or ``--idle`` seconds without one: on a terminal too, as
the README says (``--format columns``: seq, topic, key and payload in columns, for
reading). main.py wires it in, with the service endpoint and CURVE keys of every
other command.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from smartcache.cli import exits
from smartcache.cli.arguments import seconds
from smartcache.client import Client
from smartcache.client.clients import SUBSCRIBE_RETRY_S
from smartcache.wire.errors import CursorTooOld
from smartcache.wire.ports import EVENTS_ENDPOINT_VARIABLE, EVENTS_PORT, PORT_OFFSET_VARIABLE, default_events_endpoint

COMMANDS = ("events",)
#: how events are printed: one JSON object a line (the default, a terminal included), or columns for reading
FORMATS = ("json", "columns")
#: without --idle, a poll this long at a time (Ctrl-C ends it)
POLL_S = 3600.0
Emit = Callable[[dict[str, Any]], None]


def add_parsers(sub: Any) -> None:
    """``events tail`` on smartcache-cli's subparsers."""
    ev = sub.add_parser(
        "events",
        help="the event log: follow it (tail)",
        description="Events of every change that matters (session.created/updated/deleted/expired, device.bound, "
        "products.stored, bucket.sent/received) and application events (app.*), numbered by a gap-free sequence.",
    )
    ops = ev.add_subparsers(dest="operation", required=True, metavar="OPERATION", help="what to do")
    tail = ops.add_parser(
        "tail",
        help="print events as they come, one JSON object per line",
        description="Catch up from --from with EVENTS_READ, then follow the service's events socket; every event "
        "once, in order, one JSON object per line (on a terminal too; --format columns lays them out for reading). "
        f"Exit {exits.OK} at Ctrl-C, --count or --idle; {exits.STATUS} if the events after --from were dropped by "
        "retention (CURSOR_TOO_OLD).",
    )
    tail.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="PREFIX",
        help="only events whose topic starts with PREFIX (repeat for several; default: all)",
    )
    tail.add_argument(
        "--from",
        dest="from_seq",
        type=from_sequence,
        metavar="N|SHARD=N,...",
        help="start at sequence N (default: new ones); a sharded cluster's per shard: s1=N,s2=M",
    )
    tail.add_argument(
        "--publishers",
        default=default_events_endpoint(),
        metavar="ENDPOINT[,ENDPOINT...]",
        help=f"the services' events sockets (default: ${EVENTS_ENDPOINT_VARIABLE}, else tcp://127.0.0.1:"
        f"{EVENTS_PORT} + ${PORT_OFFSET_VARIABLE}; now %(default)s)",
    )
    tail.add_argument("--count", type=int, metavar="N", help="stop after N events")
    tail.add_argument("--idle", type=seconds, metavar="SECONDS", help="stop after SECONDS without an event")
    tail.add_argument(
        "--format",
        choices=FORMATS,
        default="json",
        help="json: one JSON object per event and line (the default, on a terminal too); columns: seq, topic, key "
        "and payload, for reading (--json overrides it)",
    )


def from_sequence(text: str) -> int | dict[str, int]:
    """--from: one sequence (one replica set), or shard=sequence pairs (a sharded cluster's logs)."""
    try:
        if "=" not in text:
            return int(text)
        pairs = [p.split("=", 1) for p in text.split(",") if p.strip()]
        return {name.strip(): int(seq) for name, seq in pairs}
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a sequence or shard=sequence list: {text!r}") from None


def run(client: Client, a: argparse.Namespace, emit: Emit) -> int:
    """Print events until told to stop; request errors go to the caller (main.py prints them)."""
    try:
        # --idle bounds every wait, the first read of the log (finding the head) included: with the service
        # down, it ends after --idle seconds, not after the subscription's 30 s of retries.
        retry_s = a.idle if a.idle is not None else SUBSCRIBE_RETRY_S
        with client.subscribe(a.topic, a.from_seq, publishers=a.publishers, retry_s=retry_s) as sub:
            printed = 0
            while a.count is None or printed < a.count:
                event = sub.poll(a.idle if a.idle is not None else POLL_S)
                if event is None:
                    if a.idle is not None:
                        break
                    continue
                shown = {
                    "seq": event.seq,
                    "topic": event.topic,
                    "key": event.key,
                    "time_ms": event.time_ms,
                    "payload": event.payload,
                }
                emit({**shown, "shard": event.shard} if event.shard else shown)
                sys.stdout.flush()
                printed += 1
    except CursorTooOld as e:
        emit({"error": "CURSOR_TOO_OLD", "message": str(e), "oldest_seq": e.oldest_seq})
        return exits.STATUS
    except ValueError as e:  # one --from sequence for a sharded cluster's logs
        emit({"error": "BAD_ARGUMENT", "message": f"--from: {e}"})
        return exits.USAGE
    except KeyboardInterrupt:
        pass
    return exits.OK
