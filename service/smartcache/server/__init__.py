"""The service: ``smartcache`` (``python -m smartcache.server``), with the server extra installed.

Rooms, and the directions ``make lint`` holds them to (import-linter, pyproject.toml):

* :mod:`.broker`: the broker thread (sockets, intake, replies, dispatch, the queue, the inproc link);
  it never imports the workers, the handlers or storage;
* :mod:`.work`: the worker slots and the execution of one message (decode, validate, handler, reply);
* :mod:`.handlers`: one module per family of message types;
* :mod:`.storage`: Tarantool instances, leader routing, clock offsets;
* beside them: :mod:`.app` (start-up and shutdown order), :mod:`.config` and :mod:`.parsers`
  (settings), :mod:`.deadlines` (the deadline budget), :mod:`.job`, :mod:`.metrics`, :mod:`.logs`,
  :mod:`.security` (CURVE), :mod:`.corebackend` (the bank's product service), :mod:`.publisher`
  (the events PUB socket), :mod:`.eventloop`, :mod:`.zmqio`.

work → handlers → storage and corebackend; app composes them all.
"""

from __future__ import annotations

from smartcache import extras

#: what the server needs beyond the client library (the ``server`` extra)
SERVER_PACKAGES = ("asynctnt", "aiohttp", "prometheus_client", "structlog")


def main(argv: list[str] | None = None) -> int:
    """The ``smartcache`` command: the service, or a clear message when the server extra is missing."""
    try:
        from smartcache.server import app  # noqa: PLC0415 - the extra's packages are imported only to serve
    except ModuleNotFoundError as e:
        return extras.missing(e, SERVER_PACKAGES, "smartcache: the service")
    return app.main(argv)
