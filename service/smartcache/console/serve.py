"""The console's process, once its packages are there (:mod:`.main` checks): settings, the log, then the page on
``--listen`` until SIGTERM or Ctrl-C.

Exit 0 on SIGTERM/SIGINT, 1 when the port cannot be bound, 2 on bad settings
(production without the operator token among them, a ``$SMARTCACHE_PORT_OFFSET`` that
is not a number or moves a port past 65535), one ``bad_settings`` line naming what is wrong.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

import structlog
from aiohttp import web

from smartcache.console.app import make_app
from smartcache.console.settings import EXIT_BAD, Settings, SettingsError, from_args
from smartcache.wire.ports import PortOffsetError

EXIT_OK, EXIT_BIND = 0, 1


def configure_logs() -> None:
    """JSON lines on stderr, as the service writes them."""
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        cache_logger_on_first_use=True,
    )


async def serve(settings: Settings) -> int:
    log = structlog.get_logger("smartcache.console")
    runner = web.AppRunner(make_app(settings), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    try:
        await site.start()
    except OSError as e:
        reason = e.strerror or str(e)  # the reason is the message: no traceback to show
        log.warning("console_bind_failed", host=settings.host, port=settings.port, error=reason)
        await runner.cleanup()
        return EXIT_BIND
    port = runner.addresses[0][1] if runner.addresses else settings.port
    log.info(
        "console_started",
        url=f"http://{settings.host}:{port}/",
        read_only=not settings.token,
        production=settings.production,
        services=[s.name for s in settings.services],
        tarantool=list(settings.access.addresses),
        etcd=list(settings.access.etcd),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("console_stopping")
    await runner.cleanup()
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    configure_logs()
    try:
        settings = from_args(argv)
    except (SettingsError, PortOffsetError) as e:  # the offset is read for the defaults of the options
        structlog.get_logger("smartcache.console").error("bad_settings", message=str(e))
        print(f"smartcache-console: {e}", file=sys.stderr)  # noqa: T201 - the one line an operator reads
        return EXIT_BAD
    return asyncio.run(serve(settings))
