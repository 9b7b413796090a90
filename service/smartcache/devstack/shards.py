"""What var/ holds from an earlier make run (read from etcd), and the topology and bucket map make run seeds.

On the data of an earlier run (var/), once etcd is up, make run starts every shard etcd's bucket
map names (SMARTCACHE_SHARDS=2 make run, then make run: both shards, as the banner says), or
stops there in one sentence when it cannot start what var/ holds (another shard count asked,
instances on other ports): `settle_shards`; SMARTCACHE_SHARDS above what var/ holds grows it the
documented way (the new shards join the bucket map empty, `cluster rebalance` fills them). Once a
trio formed, `seed_topology` makes its first topology (`smartcache-cli cluster init`, idempotent)
and, sharded, `seed_shards` the bucket map and the shards added.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from smartcache.devstack.child import NotReady
from smartcache.devstack.plan import CLUSTER, MAX_SHARDS, SHARDS_VARIABLE, BadEnvironment, Plan
from smartcache.devstack.tarantool import Tarantool
from smartcache.ops.access import Access
from smartcache.wire.ports import PORT_OFFSET_VARIABLE


@dataclass(frozen=True)
class Recorded:
    """What etcd (its data is in var/) holds of make run's cluster from an earlier run."""

    #: the shards the bucket map names, in its order; () when there is none (one replica set, make-run)
    shards: tuple[str, ...]
    #: each shard's (or the one replica set's, under "") members as its topology names them; None: no topology
    members: dict[str, tuple[str, ...] | None]

    def describe(self) -> str:
        if not self.shards:
            return "the topology of one replica set (no shards)"
        n = len(self.shards)
        return f"a topology of {n} shard{'s' if n > 1 else ''} (etcd's bucket map names {', '.join(self.shards)})"


#: how long make run waits for etcd's answer when it reads what var/ holds
RECORDED_READ_S = 5.0


def read_recorded(etcd_urls: list[str]) -> Recorded | None:
    """The bucket map and topologies an earlier make run left in etcd (None: nothing, a new var/)."""
    from smartcache.ops import etcd  # noqa: PLC0415 - beside cluster (below), as make run's other reads
    from smartcache.wire import topology  # noqa: PLC0415 - as above, beside it

    def members(cluster: str) -> tuple[str, ...] | None:
        found = etcd.read(etcd_urls, topology.topology_key(cluster), RECORDED_READ_S)
        try:
            return tuple(m.address for m in topology.parse(found[0][1]).members) if found else None
        except ValueError:
            return None  # unreadable: nothing to compare with (the instances say what is wrong with it)

    try:
        found = etcd.read(etcd_urls, topology.buckets_key(CLUSTER), RECORDED_READ_S)
        if found:
            doc = json.loads(found[0][1])
            shards = tuple(str(s) for s in doc.get("shards") or ()) if isinstance(doc, dict) else ()
            return Recorded(shards, {s: members(topology.shard_cluster(CLUSTER, s)) for s in shards})
        one = members(CLUSTER)
    except etcd.EtcdUnavailable as e:
        raise NotReady(f"etcd did not say what var/ holds: {e}") from e
    return None if one is None else Recorded((), {"": one})


def settle_shards(plan: Plan, recorded: Recorded | None) -> tuple[Plan, str | None]:
    """The plan to run on what var/ holds, and a line for the banner saying so (None: nothing to say).

    Without SMARTCACHE_SHARDS, make run starts every shard the bucket map names (s1..sN, N <= MAX_SHARDS, each
    on its usual ports): a shard left out leaves the clients of its buckets with no storage (issue 35: half of
    them answered STORAGE_UNAVAILABLE; here the service was never ready, no /health/ready in 30 s).

    SMARTCACHE_SHARDS above what var/ holds grows the cluster the documented way (docs/sharding.md, "Moving
    buckets"): the shards it lacks start empty and join the bucket map holding no bucket (`cluster shard add`),
    and `smartcache-cli cluster rebalance` then moves buckets to them, their rows with them. One replica set
    becomes shard s1 first, its data where it was (a map naming s1 alone, holding every bucket: its rows get
    their bucket then); a make run stopped half-way through goes on from where it was. Before, a second shard
    asked of one replica set's var/ was refused (and earlier still started from empty storage: the one replica
    set's sessions answered NOT_FOUND).

    Fewer shards than var/ holds, shards make run cannot start, or a topology whose instances are all on other
    ports than this make run's: BadEnvironment, one sentence saying how to go on.
    """
    if recorded is None:
        return plan, None
    held = f"{plan.base} holds {recorded.describe()}"
    n = len(recorded.shards)
    if recorded.shards and (list(recorded.shards) != [f"s{k}" for k in range(1, n + 1)] or n > MAX_SHARDS):
        raise BadEnvironment(
            f"{held}, which make run cannot start (it starts 2..{MAX_SHARDS} shards named s1, s2...):"
            " start them as they were started (docs/sharding.md), or `make reset-data` to start over"
        )
    wanted = plan if plan.shards_given or n < 2 else plan.with_shards(n)
    if wanted.shards < n or (n == 1 and wanted.shards == 1):
        again = f"run `{SHARDS_VARIABLE}={max(n, 2)} make run`, or `make reset-data` to start over"
        if n == 1:
            raise BadEnvironment(f"{held}: a growth from one replica set stopped half-way; {again}")
        raise BadEnvironment(f"{held}, not the {plan.shards} {SHARDS_VARIABLE}={plan.shards} asks for: {again}")
    for k, name in enumerate(recorded.shards or ("",), 1):
        members = recorded.members.get(name)
        if members is not None and not set(members) & set(wanted.addresses(k)):
            raise BadEnvironment(
                f"{held}, whose {name or 'instances'} {'are' if not name else 'is'} on {', '.join(members)}, not on"
                f" this make run's {', '.join(wanted.addresses(k))}: run it with the ports it was made with"
                f" (the same {PORT_OFFSET_VARIABLE}), or `make reset-data` to start over"
            )
    if wanted.shards > max(n, 1):
        return _grown(wanted, recorded, held)
    if not recorded.shards or plan.shards_given:
        return wanted, None
    return wanted, (
        f"{', '.join(wanted.shard_names())}, the {n} that {plan.base} holds (etcd's bucket map): without"
        f" {SHARDS_VARIABLE} make run starts them all; `make reset-data` starts over with one replica set"
    )


def _grown(wanted: Plan, recorded: Recorded, held: str) -> tuple[Plan, str]:
    """SMARTCACHE_SHARDS above what var/ holds: the shards to add, and the banner's line on them."""
    added = tuple(wanted.shard_names()[max(1, len(recorded.shards)) :])
    first = "" if recorded.shards else "; it is shard s1 now, its data where it was"
    return replace(wanted, added=added), (
        f"{held}{first}; {', '.join(added)} joined the bucket map holding no bucket (cluster shard add): run"
        f" `.venv/bin/smartcache-cli cluster --cluster {CLUSTER} rebalance"
        f" --reason 'grown to {len(wanted.shard_names())} shards'` to move buckets to"
        f" {'it' if len(added) == 1 else 'them'}, their sessions with them (docs/sharding.md, Moving buckets)"
    )


def _access(etcd_urls: list[str], cluster_name: str = CLUSTER, addresses: Sequence[str] = ()) -> Access:
    """How make run reaches its instances as the operator (SC_OPERATOR_USER and _PASSWORD, as the instances)."""
    return Access(
        addresses=list(addresses),
        user=os.environ.get("SC_OPERATOR_USER") or "operator",
        password=os.environ.get("SC_OPERATOR_PASSWORD") or "operator",
        etcd=etcd_urls,
        cluster=cluster_name,
    )


def _until_ok(what: str, ask: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """ask() again until it answers OK: a shard that has just made its topology may have no leader for a moment
    (NO_LEADER), and every step asked here is idempotent. NotReady after SHARDS_INIT_S."""
    deadline = time.monotonic() + SHARDS_INIT_S
    while True:
        r = ask()
        if r.get("status") == "OK":
            return r
        if time.monotonic() > deadline:
            raise NotReady(f"{what} in {SHARDS_INIT_S:g} s: {r}")
        time.sleep(0.5)


def seed_shards(plan: Plan) -> str:
    """SMARTCACHE_SHARDS=N: the bucket map and each shard's buckets (`cluster init --shards`, idempotent), then
    the shards this run adds, holding no bucket (`cluster shard add`, idempotent). What it did, in words."""
    from smartcache.ops import cluster, moves  # noqa: PLC0415 - needs the server extra's connector, as make run does

    access = _access(plan.etcd_urls)
    kept = [s for s in plan.shard_names() if s not in plan.added]
    made = False

    def init() -> dict[str, Any]:
        nonlocal made
        r = cluster.shards_init(access, kept, SHARD_BUCKETS)
        made = made or bool(r.get("created"))
        return r

    r = _until_ok("the shards did not take their buckets", init)
    for name in plan.added:
        _until_ok(f"shard {name} did not join the bucket map", partial(moves.shard_add, access, name))
    ranges = ", ".join(f"{s} {first}..{last}" for first, last, s in r["map"]["ranges"])
    joined = f"; {', '.join(plan.added)} joined it holding no bucket" if plan.added else ""
    return f"{'made' if made else 'kept'} the bucket map ({r['map']['buckets']} buckets): {ranges}{joined}"


#: how long make run asks the shards to take their buckets (each must have a leader)
SHARDS_INIT_S = 30.0
#: the bucket count of make run's sharded cluster
SHARD_BUCKETS = 1024


def seed_topology(instances: list[Tarantool], etcd_urls: list[str], cluster_name: str = CLUSTER) -> str:
    """The cluster's first topology, once it formed: `smartcache-cli cluster init` (idempotent: a make run on the
    data of an earlier one keeps the topology it has, members added since included). What it did, in words."""
    from smartcache.ops import cluster  # noqa: PLC0415 - needs the server extra's connector, as make run does

    r = cluster.topology_init(_access(etcd_urls, cluster_name, [t.address for t in instances]))
    if r.get("status") != "OK":
        return f"no topology ({r.get('reason') or r.get('status')}: {r.get('message')}): SC_CLUSTER_SIZE decides"
    made = "made the topology" if r.get("created") else "the topology is"
    return f"{made} (version {r['version']}): {r['members']}; smartcache-cli cluster add|remove changes it"
