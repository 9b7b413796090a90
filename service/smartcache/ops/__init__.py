"""Operations on the storage cluster: the library behind ``smartcache-cli cluster``, the console and the service.

What was ``smartcache.cli``'s inside (issue 36): the server runs the move settler in every
instance and the console switches over and rejoins, so none of it may live in the CLI, which
the server and the console never import (import-linter contracts in pyproject.toml). The
CLI, the console and the server import this; it imports the wire and nothing else of
smartcache.

* :mod:`.etcd`: the one etcd v3 client in Python (the JSON gateway, ``/v3/*``): a blocking face
  (the standard library only: the CLI runs with the client alone) and an asyncio face
  (:mod:`.etcd.aio`, aiohttp: the service's discovery) on one core, and the members' health;
* :mod:`.access`: how the Tarantool instances are reached (addresses, the operator's
  credentials, etcd, the cluster's name) -- no connector needed to hold one;
* :mod:`.instances`: one instance's answer (``sc.role``), the instances known and who leads;
* :mod:`.status`: the cluster as ``cluster status`` shows it (instances, etcd, topology, shards);
* :mod:`.audit`: every operator action written to storage's audit log before it acts and with
  its outcome (who, what, the reason typed), and the log read back;
* :mod:`.cluster`: the operations (switchover, rejoin, topology changes, a sharded cluster's
  map) and the one name callers import (``from smartcache.ops import cluster``);
* :mod:`.moves`: moving buckets between shards (the map, a shard's leader link, one move, the
  settler, plans).

Everything but :mod:`.etcd` and :mod:`.access` needs the Tarantool connector (the server extra).
"""
