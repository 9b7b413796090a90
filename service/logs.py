"""structlog, configured once at the entry point: JSON lines on stdout for ELK."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure(level: str = "info", stream: TextIO | None = None) -> None:
    """One JSON object per line: timestamp, level, event, logger, bound context (request_id...)."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.dict_tracebacks,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=structlog.WriteLoggerFactory(stream or sys.stdout),
        cache_logger_on_first_use=True,
    )
