"""What var/ holds from an earlier make run (read from etcd), and the topology and bucket map make run seeds.

On the data of an earlier run (var/), once etcd is up, make run starts every shard etcd's bucket
map names (SMARTCACHE_SHARDS=2 make run, then make run: both shards, as the banner says), or
stops there in one sentence when it cannot start what var/ holds (another shard count asked,
instances on other ports): `settle_shards`. Once a trio formed, `seed_topology` makes its first
topology (`smartcache-cli cluster init`, idempotent) and, sharded, `seed_shards` the bucket map.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from smartcache.devstack.child import NotReady
from smartcache.devstack.plan import CLUSTER, MAX_SHARDS, SHARDS_VARIABLE, BadEnvironment, Plan
from smartcache.devstack.tarantool import Tarantool
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
    from smartcache.cli import etcd  # noqa: PLC0415 - needs the server extra, as make run does
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
    them answered STORAGE_UNAVAILABLE; here the service was never ready, no /health/ready in 30 s). A shard
    count that differs from the one var/ holds, shards make run cannot start, or a topology whose instances are
    all on other ports than this make run's: BadEnvironment, one sentence saying how to go on.
    """
    if recorded is None:
        return plan, None
    n = max(1, len(recorded.shards))
    again = (
        f"run `{SHARDS_VARIABLE}={n} make run`, or `make reset-data` to start over"
        if recorded.shards
        else f"run `make run` without {SHARDS_VARIABLE}, or `make reset-data` to start over"
    )
    held = f"{plan.base} holds {recorded.describe()}"
    if not recorded.shards:
        if plan.shards > 1:
            raise BadEnvironment(f"{held}, which {SHARDS_VARIABLE}={plan.shards} would leave out of reach: {again}")
        wanted = plan
    elif list(recorded.shards) != [f"s{k}" for k in range(1, n + 1)] or not 2 <= n <= MAX_SHARDS:
        raise BadEnvironment(
            f"{held}, which make run cannot start (it starts 2..{MAX_SHARDS} shards named s1, s2...):"
            " start them as they were started (docs/sharding.md), or `make reset-data` to start over"
        )
    elif plan.shards_given and plan.shards != n:
        raise BadEnvironment(f"{held}, not the {plan.shards} {SHARDS_VARIABLE}={plan.shards} asks for: {again}")
    else:
        wanted = plan.with_shards(n)
    for k, name in enumerate(recorded.shards or ("",), 1):
        members = recorded.members.get(name)
        if members is not None and not set(members) & set(wanted.addresses(k)):
            raise BadEnvironment(
                f"{held}, whose {name or 'instances'} {'are' if not name else 'is'} on {', '.join(members)}, not on"
                f" this make run's {', '.join(wanted.addresses(k))}: run it with the ports it was made with"
                f" (the same {PORT_OFFSET_VARIABLE}), or `make reset-data` to start over"
            )
    if not recorded.shards or plan.shards_given:
        return wanted, None
    return wanted, (
        f"{', '.join(wanted.shard_names())}, the {n} that {plan.base} holds (etcd's bucket map): without"
        f" {SHARDS_VARIABLE} make run starts them all; `make reset-data` starts over with one replica set"
    )


def seed_shards(shards: list[str], etcd_urls: list[str]) -> str:
    """SMARTCACHE_SHARDS=N: the bucket map and each shard's buckets (`cluster init --shards`, idempotent)."""
    from smartcache.cli import cluster  # noqa: PLC0415 - needs the server extra's connector, as make run does

    access = cluster.Access(
        addresses=(),
        user=os.environ.get("SC_OPERATOR_USER") or "operator",
        password=os.environ.get("SC_OPERATOR_PASSWORD") or "operator",
        etcd=etcd_urls,
        cluster=CLUSTER,
    )
    # A shard that has just made its topology may have no leader for a moment (NO_LEADER): asked again,
    # since every step of it is idempotent.
    deadline = time.monotonic() + SHARDS_INIT_S
    made = False
    while True:
        r = cluster.shards_init(access, shards, SHARD_BUCKETS)
        made = made or bool(r.get("created"))
        if r.get("status") == "OK":
            break
        if time.monotonic() > deadline:
            raise NotReady(f"the shards did not take their buckets in {SHARDS_INIT_S:g} s: {r}")
        time.sleep(0.5)
    ranges = ", ".join(f"{s} {first}..{last}" for first, last, s in r["map"]["ranges"])
    return f"{'made' if made else 'kept'} the bucket map ({r['map']['buckets']} buckets): {ranges}"


#: how long make run asks the shards to take their buckets (each must have a leader)
SHARDS_INIT_S = 30.0
#: the bucket count of make run's sharded cluster
SHARD_BUCKETS = 1024


def seed_topology(instances: list[Tarantool], etcd_urls: list[str], cluster_name: str = CLUSTER) -> str:
    """The cluster's first topology, once it formed: `smartcache-cli cluster init` (idempotent: a make run on the
    data of an earlier one keeps the topology it has, members added since included). What it did, in words."""
    from smartcache.cli import cluster  # noqa: PLC0415 - needs the server extra's connector, as make run does

    access = cluster.Access(
        addresses=[t.address for t in instances],
        user=os.environ.get("SC_OPERATOR_USER") or "operator",
        password=os.environ.get("SC_OPERATOR_PASSWORD") or "operator",
        etcd=etcd_urls,
        cluster=cluster_name,
    )
    r = cluster.topology_init(access)
    if r.get("status") != "OK":
        return f"no topology ({r.get('reason') or r.get('status')}: {r.get('message')}): SC_CLUSTER_SIZE decides"
    made = "made the topology" if r.get("created") else "the topology is"
    return f"{made} (version {r['version']}): {r['members']}; smartcache-cli cluster add|remove changes it"
