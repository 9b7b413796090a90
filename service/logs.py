"""structlog, configured once at the entry point.

JSON lines (for ELK) unless the stream is a terminal, where structlog's
coloured console renderer is easier to read. Tracebacks never carry local
variables: they would copy customer data (session bodies, client ids) into
the logs.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog
from structlog.tracebacks import ExceptionDictTransformer
from structlog.typing import Processor

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure(
    level: str = "info", stream: TextIO | None = None, *, console: bool | None = None, cache: bool = True
) -> None:
    """timestamp, level, event, bound context (request_id...), one line each.

    console: coloured, human-readable lines; by default when the stream is a terminal, else JSON.
    cache: loggers keep their configuration after first use (fast); tests that configure again pass False.
    """
    out = stream or sys.stdout
    if console is None:
        console = out.isatty()
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
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            *renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=structlog.WriteLoggerFactory(out),
        cache_logger_on_first_use=cache,
    )
