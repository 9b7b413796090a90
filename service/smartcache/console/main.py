"""``smartcache-console``: the console, or a clear message when the server extra is missing.

The console needs aiohttp, structlog and the Tarantool connector, which come with the server
extra, not with the client library; without them it says so and exits 2, as ``smartcache``
and ``smartcache-cli cluster`` do, instead of a traceback. The process itself is :mod:`.serve`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

#: what the console needs beyond the client library (the ``server`` extra)
CONSOLE_PACKAGES = ("aiohttp", "structlog", "tarantool")
#: the exit code of bad settings, and of a missing package
EXIT_BAD = 2


def main(argv: Sequence[str] | None = None) -> int:
    """The ``smartcache-console`` command."""
    try:
        from smartcache.console import serve  # noqa: PLC0415 - the extra's packages are imported only to serve
    except ModuleNotFoundError as e:
        if e.name not in CONSOLE_PACKAGES:
            raise
        print(  # noqa: T201 - before logging is configured
            f"smartcache-console: the console needs the server extra ({e.name} is missing): "
            "pip install 'smartcache-bank[server]'",
            file=sys.stderr,
        )
        return EXIT_BAD
    return serve.main(argv)
