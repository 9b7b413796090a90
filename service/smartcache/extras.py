"""What a command needs beyond the client library, and the one way it says so when that is not installed.

``pip install smartcache-bank`` is the client library alone (ZeroMQ and msgpack): a front server
needs no more. The service (``smartcache``), the console (``smartcache-console``) and
``smartcache-cli cluster`` need the ``server`` extra (the Tarantool connectors, aiohttp,
structlog...). Without it each names the missing package and the install command, and exits 2,
instead of a ModuleNotFoundError's traceback: the command and the message are written here once.

It imports nothing else of smartcache: the commands call it before their own imports can fail.
"""

from __future__ import annotations

import sys
from collections.abc import Collection

#: how to install the server extra (the distribution's name is pyproject.toml's)
SERVER_EXTRA_INSTALL = "pip install 'smartcache-bank[server]'"
#: the exit code of a command whose extra is missing
EXIT_MISSING = 2


def missing(e: ModuleNotFoundError, packages: Collection[str], what: str) -> int:
    """EXIT_MISSING, after saying on stderr that `what` (``"smartcache: the service"``) needs the server extra
    and which package is missing; e itself again when the missing module is not one of packages (a bug, not
    an installation)."""
    if e.name not in packages:
        raise e
    print(  # noqa: T201 - before logging is configured
        f"{what} needs the server extra ({e.name} is missing): {SERVER_EXTRA_INSTALL}",
        file=sys.stderr,
    )
    return EXIT_MISSING
