"""``smartcache-console``: the console, or a clear message when the server extra is missing.

The console needs aiohttp, structlog and the Tarantool connector, which come with the server
extra, not with the client library; without them it says so and exits 2, as ``smartcache``
and ``smartcache-cli cluster`` do, instead of a traceback. The process itself is :mod:`.serve`.
"""

from __future__ import annotations

from collections.abc import Sequence

from smartcache import extras

#: what the console needs beyond the client library (the ``server`` extra)
CONSOLE_PACKAGES = ("aiohttp", "structlog", "tarantool")


def main(argv: Sequence[str] | None = None) -> int:
    """The ``smartcache-console`` command."""
    try:
        from smartcache.console import serve  # noqa: PLC0415 - the extra's packages are imported only to serve
    except ModuleNotFoundError as e:
        return extras.missing(e, CONSOLE_PACKAGES, "smartcache-console: the console")
    return serve.main(argv)
