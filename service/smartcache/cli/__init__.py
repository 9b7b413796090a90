"""``smartcache-cli``: talk to a running service, its storage and its keys from a shell.

:mod:`.main` (the parser, the message commands, output and exit codes),
:mod:`.coordination` (counters, locks, queues...), :mod:`.events` (``events tail``),
:mod:`.admin` (``cluster`` and ``keys``), :mod:`.cluster` (the storage instances as an
operator sees them). It uses the client library and the wire only, never the server;
``cluster`` needs the Tarantool connector of the server extra.
"""
