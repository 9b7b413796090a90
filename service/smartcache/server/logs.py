"""structlog, configured once at the entry point.

JSON lines (for ELK) unless the stream is a terminal, where structlog's
coloured console renderer is easier to read. Tracebacks never carry local
variables: they would copy customer data (session bodies, client ids) into
the logs.
"""

from __future__ import annotations

import logging
import sys
import time
from contextvars import ContextVar
from typing import TextIO

import structlog
from structlog.tracebacks import ExceptionDictTransformer
from structlog.typing import EventDict, Processor

from smartcache.wire import frame_request_id

#: the header frame of the message the running task serves (the worker sets it when the task starts;
#: each asyncio task has its own copy): what gives every line logged meanwhile its request id
message_header: ContextVar[bytes | None] = ContextVar("smartcache_message_header", default=None)

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure(
    level: str = "info",
    stream: TextIO | None = None,
    *,
    console: bool | None = None,
    cache: bool = True,
    process: int | None = None,
) -> None:
    """timestamp, level, event, bound context (request_id...), one line each.

    console: coloured, human-readable lines; by default when the stream is a terminal, else JSON.
    cache: loggers keep their configuration after first use (fast); tests that configure again pass False.
    process: a child of ``--processes``: its index, as the ``process`` field of every line (on every
    thread: a contextvar would not reach the broker's and workers' threads).
    """
    out = stream or sys.stdout
    if console is None:
        console = out.isatty()
    fields = [_with_fields({"process": process})] if process is not None else []
    renderer: list[Processor] = (
        [structlog.dev.ConsoleRenderer(colors=True, exception_formatter=structlog.dev.plain_traceback)]
        if console
        else [
            structlog.processors.ExceptionRenderer(ExceptionDictTransformer(show_locals=False)),
            structlog.processors.JSONRenderer(),
        ]
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            add_request_id,
            *fields,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            *renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=structlog.WriteLoggerFactory(out),
        cache_logger_on_first_use=cache,
    )
    _route_stdlib([*fields, *renderer], out, LEVELS[level])


def _with_fields(fields: dict[str, object]) -> Processor:
    """A processor adding the same fields to every line."""

    def add(_logger: object, _method: str, event: EventDict) -> EventDict:
        event.update(fields)
        return event

    return add


def add_request_id(_logger: object, _method: str, event: EventDict) -> EventDict:
    """Every line logged while a message runs (its task's context) carries the message's request id:
    read from its header when a line is logged, rather than bound for every message (that cost about 2 %
    of the CPU per request, for lines that are rarely written)."""
    header = message_header.get()
    if header is not None and "request_id" not in event:
        event["request_id"] = frame_request_id(header)
    return event


#: libraries that log through the standard library (asynctnt: connects, disconnects)
STDLIB_LOGGERS = ("asynctnt", "aiohttp")
#: one line per message template and logger in this long; the next says how many were dropped
STDLIB_EVERY_S = 10.0


class _RateLimit(logging.Filter):
    """Keeps a library's repeated message (say, a reconnect every 0.5 s) to one line per STDLIB_EVERY_S."""

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[tuple[str, object], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.msg)
        now = time.monotonic()
        last, dropped = self._last.get(key, (-STDLIB_EVERY_S, 0))
        if now - last < STDLIB_EVERY_S:
            self._last[key] = (last, dropped + 1)
            return False
        self._last[key] = (now, 0)
        if dropped:
            record.suppressed = dropped
        return True


def _route_stdlib(renderer: list[Processor], out: TextIO, level: int) -> None:
    """Libraries' standard-library logs come out as our lines too: same keys, same renderer, rate-limited."""
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer],
            foreign_pre_chain=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                structlog.stdlib.ExtraAdder(),
                structlog.processors.TimeStamper(fmt="iso", utc=True),
            ],
        )
    )
    handler.addFilter(_RateLimit())
    for name in STDLIB_LOGGERS:
        lib = logging.getLogger(name)
        lib.handlers = [handler]
        lib.setLevel(max(level, logging.INFO))
        lib.propagate = False
