"""``smartcache-cli``: talk to a running service, its storage and its keys from a shell.

:mod:`.main` (the parser, the message commands, output), :mod:`.arguments` (the argument
types and checks), :mod:`.suggest` ("did you mean"), :mod:`.exits` (the exit codes),
:mod:`.coordination` (counters, locks, queues...), :mod:`.events` (``events tail``),
:mod:`.admin` (``cluster`` and ``keys``), :mod:`.clustername` (which cluster a ``cluster``
command is about), :mod:`.output` (the layouts), :mod:`.progress` (the progress line of
rebalance and drain). Argument parsing and output only: the storage cluster's operations
(etcd, status, switchover, moves) are :mod:`smartcache.ops`'. It uses ops, the client,
settings (the operator's credentials), extras and the wire, never the server or the console;
``cluster`` needs the Tarantool connector of the server extra.
"""
