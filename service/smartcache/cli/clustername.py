"""Which cluster a ``cluster`` command is about: a name given is checked with etcd; none given, the instances say.

Issue 36: ``cluster --cluster wrongname status`` answered "cluster healthy" (the instances
were asked, and etcd under a prefix nobody writes), and ``cluster drain`` wanted ``--cluster
make-run`` though ``cluster status`` finds the cluster by itself. So, for every command:

* a name given (``--cluster``, ``$SMARTCACHE_CLUSTER``) must be one etcd holds keys of:
  ``/smartcache/<name>/...``, or a shard's replica set of it (``/smartcache/<name>.<shard>/...``);
  else NOT_FOUND, naming the clusters etcd holds. With etcd not asked (``--etcd ''``) or not
  answering, the name is taken as given and the command says what it finds, as before;
* no name given: the one the first instance that answers reports (its SC_CLUSTER), and for a
  shard's replica set (``<cluster>.<shard>``) whose cluster has a bucket map, that cluster, as
  ``cluster status`` finds it (ops/status.py); the moves need it, the other operations find
  their replica set's own from the instances (ops/instances.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from smartcache.ops import etcd
from smartcache.ops.access import Access
from smartcache.ops.etcd.core import Call, kvs, range_call

#: where every cluster's keys live, /smartcache/<cluster>/... (smartcache/wire/topology.py prefix)
ROOT = "/smartcache/"


def held(endpoints: Sequence[str], timeout_s: float) -> list[str] | None:
    """The clusters etcd holds keys of, sorted, shards' replica sets included; None when etcd is not asked or does
    not answer (then nobody can tell a mistyped name)."""
    if not endpoints:
        return None
    every = range_call(ROOT, prefix=True)
    keys_only = Call(every.path, {**(every.body or {}), "keys_only": True})
    try:
        found = kvs(etcd.Etcd(endpoints, timeout_s).ask(keys_only))
    except etcd.EtcdUnavailable:
        return None
    return sorted({kv.key[len(ROOT) :].split("/", 1)[0] for kv in found if kv.key.startswith(ROOT)} - {""})


def unknown(access: Access) -> dict[str, Any] | None:
    """NOT_FOUND when the name given is no cluster etcd holds; None when it is one, when none is given, or when etcd
    cannot tell."""
    if access.cluster is None:
        return None
    names = held(access.etcd, access.timeout_s)
    if names is None or access.cluster in names or any(n.startswith(access.cluster + ".") for n in names):
        return None
    holds = f"it holds {', '.join(names)}" if names else "it holds none"
    return {
        "error": "NOT_FOUND",
        "message": f"--cluster / $SMARTCACHE_CLUSTER {access.cluster!r}: etcd holds no such cluster ({holds})",
        "clusters": names,
    }


def reported(access: Access) -> str | None:
    """The cluster the instances run in (the first that answers with a name), or the sharded cluster its replica
    set is a shard of; None when no instance answers with one. Needs the Tarantool connector (the server extra)."""
    from smartcache.ops import cluster  # noqa: PLC0415 (the server extra: see admin._cluster)

    name = next((n for a in access.addresses if (n := cluster.role(access, a).get("cluster"))), None)
    if not isinstance(name, str):
        return None
    return cluster.sharded_cluster_of(access, name) or name
