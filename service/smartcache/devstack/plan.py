"""What `make run` starts and on which ports: its variables read once (`Plan.from_env`), every port checked.

Before starting anything make run checks every port it needs is free, binding as the servers do
(SO_REUSEADDR: a TIME-WAIT they could bind over does not count), and names the variable to change
and what holds the port if not (a second `make run` next to a running one stops there);
SMARTCACHE_PORT_OFFSET=N moves every default port by N at once, and smartcache-cli's default
endpoints with them. SMARTCACHE_SHARDS=N asks for N trios, sharded by client, each one's ports
SHARD_PORT_STEP above the one before.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path

from smartcache.devstack.child import ROOT
from smartcache.devstack.sockets import ephemeral_range, port_holders, port_is_free
from smartcache.wire import ports
from smartcache.wire.ports import MAX_PORT_OFFSET, PORT_OFFSET_VARIABLE

#: make run's ports: variable -> default (SMARTCACHE_PORT_OFFSET is added to each default)
DEFAULT_PORTS = {
    **{f"SC_PORT_{i}": p for i, p in enumerate(ports.TARANTOOL_PORTS, 1)},
    **{f"SC_HTTP_PORT_{i}": p for i, p in enumerate(ports.TARANTOOL_HTTP_PORTS, 1)},
    **{f"ETCD_PORT_{i}": p for i, p in enumerate(ports.ETCD_PORTS, 1)},
    **{f"ETCD_PEER_PORT_{i}": p for i, p in enumerate(ports.ETCD_PEER_PORTS, 1)},
    "BACKEND_PORT": ports.BACKEND_PORT,
    "SMARTCACHE_METRICS_PORT": ports.METRICS_PORT,
    "SMARTCACHE_CONSOLE_PORT": ports.CONSOLE_PORT,
}
#: the three Tarantool instances of make run (elected: none is master by configuration)
INSTANCES = ("tarantool-1", "tarantool-2", "tarantool-3")
#: SC_CLUSTER of make run's instances and SMARTCACHE_CLUSTER of its service: keys under /smartcache/make-run/
CLUSTER = "make-run"
#: etcd runs as long as make run; its data stays in var/ like the instances'
ETCD_LIFETIME_S = 30 * 86400
#: make run's variables of before the three etcd members: refused, naming the new ones
GONE_VARIABLES = {
    "ETCD_PORT": "make run runs three etcd members now: set ETCD_PORT_1..3 (client ports) and "
    "ETCD_PEER_PORT_1..3 (peer ports) instead of ETCD_PORT",
}
#: SMARTCACHE_SHARDS=N make run: N trios, sharded by client (docs/design/sharding.md); their ports step by 10
SHARDS_VARIABLE = "SMARTCACHE_SHARDS"
MAX_SHARDS = 3
SHARD_PORT_STEP = 10
DEFAULT_LISTEN_PORT = ports.LISTEN_PORT
#: the service's events PUB socket (SMARTCACHE_EVENTS_LISTEN), moved by the offset too
DEFAULT_EVENTS_PORT = ports.EVENTS_PORT


class BadEnvironment(Exception):
    """A make run variable is unusable, or a port it needs is taken; the message names the variable."""


@dataclass
class Plan:
    """What `make run` starts, on which ports, from which variables."""

    base: Path
    #: variable -> port; every one must be free before anything starts
    ports: dict[str, int]
    listen: str
    listen_port: int | None  # None: an ipc:// endpoint, nothing to check
    #: the service's events socket (SMARTCACHE_EVENTS_LISTEN)
    events_listen: str = ""
    #: SMARTCACHE_SHARDS: one replica set (the default), or that many, sharded by client
    shards: int = 1
    #: whether SMARTCACHE_SHARDS said so (unset: as many as var/'s etcd records, settle_shards)
    shards_given: bool = False
    #: the shards this run adds to the bucket map holding no bucket (SMARTCACHE_SHARDS above what var/ holds;
    #: `smartcache-cli cluster rebalance` then fills them): settle_shards
    added: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Plan:
        ports, errors = {}, []
        errors += [why for name, why in GONE_VARIABLES.items() if env.get(name, "").strip()]
        offset = env.get(PORT_OFFSET_VARIABLE, "").strip() or "0"
        if not offset.isdigit() or int(offset) > MAX_PORT_OFFSET:
            errors.append(f"{PORT_OFFSET_VARIABLE}={offset!r} must be a number 0..{MAX_PORT_OFFSET}")
            offset = "0"
        for name, default in DEFAULT_PORTS.items():
            raw = env.get(name, "").strip() or str(default + int(offset))
            if not raw.isdigit() or not 1 <= int(raw) <= 65535:
                errors.append(f"{name}={raw!r} must be a port number 1..65535")
            else:
                ports[name] = int(raw)
        listen = env.get("SMARTCACHE_LISTEN", "").strip() or f"tcp://127.0.0.1:{DEFAULT_LISTEN_PORT + int(offset)}"
        listen_port = None
        if listen.startswith("tcp://"):
            port = listen.rpartition(":")[2]
            if port.isdigit() and int(port) > 0:
                listen_port = ports["SMARTCACHE_LISTEN"] = int(port)
            else:
                errors.append(f"SMARTCACHE_LISTEN={listen!r}: make run needs a fixed port (tcp://host:PORT)")
        events = (
            env.get("SMARTCACHE_EVENTS_LISTEN", "").strip() or f"tcp://127.0.0.1:{DEFAULT_EVENTS_PORT + int(offset)}"
        )
        events_port = events.rpartition(":")[2] if events.startswith("tcp://") else ""
        if events_port.isdigit() and int(events_port) > 0:
            ports["SMARTCACHE_EVENTS_LISTEN"] = int(events_port)
        raw_shards = env.get(SHARDS_VARIABLE, "").strip()  # unset: as many as var/ holds (settle_shards), or one
        shards = int(raw_shards or "1") if (raw_shards or "1").isdigit() else 0
        if not 1 <= shards <= MAX_SHARDS:
            errors.append(f"{SHARDS_VARIABLE}={raw_shards!r} must be 1..{MAX_SHARDS}")
            shards = 1
        ports, moved_errors = _with_shard_ports(ports, shards)
        errors += moved_errors
        if errors:
            raise BadEnvironment("; ".join(errors))
        base = Path(env.get("SMARTCACHE_VAR") or ROOT / "var")
        return cls(base, ports, listen, listen_port, events, shards, shards_given=bool(raw_shards))

    def with_shards(self, shards: int) -> Plan:
        """This plan with that many shards (each one's ports 10 above the one before), as SMARTCACHE_SHARDS=N."""
        ports, errors = _with_shard_ports(self.ports, shards)
        if errors:
            raise BadEnvironment("; ".join(errors))
        return replace(self, ports=ports, shards=shards)

    def shard_names(self) -> list[str]:
        return [f"s{k}" for k in range(1, self.shards + 1)]

    def instance_name(self, shard: int, i: int) -> str:
        """Instance i (1..3) of shard k: tarantool-i for one replica set, else tarantool-s<k>-i; and tarantool-i
        for shard s1 of a cluster grown from one replica set (its data stays where it was: var/ holds
        tarantool-1 and no tarantool-s1-1)."""
        one = f"tarantool-{i}"
        if self.shards == 1 or (
            shard == 1 and (self.base / one).exists() and not (self.base / "tarantool-s1-1").exists()
        ):
            return one
        return f"tarantool-s{shard}-{i}"

    def port(self, name: str, shard: int) -> int:
        """An instance port of shard k (1: the first trio's own)."""
        return self.ports[name] if shard == 1 else self.ports[f"{name} (shard s{shard})"]

    def addresses(self, shard: int) -> list[str]:
        """The iproto addresses of shard k's three instances (what its topology names)."""
        return [f"127.0.0.1:{self.port(f'SC_PORT_{i}', shard)}" for i in (1, 2, 3)]

    @property
    def etcd_urls(self) -> list[str]:
        """The three etcd members' client URLs (SC_ETCD, SMARTCACHE_ETCD)."""
        return [f"http://127.0.0.1:{self.ports[f'ETCD_PORT_{i}']}" for i in (1, 2, 3)]

    def check_ports(self, only: Collection[str] | None = None) -> None:
        """Every port distinct and free now (of those named in only, if given), or BadEnvironment naming each
        variable to change, what holds its port and, for a port in the ephemeral range, the offsets below it."""
        by_port: dict[int, list[str]] = {}
        for name, port in self.ports.items():
            by_port.setdefault(port, []).append(name)
        shared = [f"{' and '.join(names)} share port {port}" for port, names in by_port.items() if len(names) > 1]
        if shared:
            raise BadEnvironment(f"{'; '.join(shared)}: give each its own port")
        taken = {
            port: names[0]
            for port, names in by_port.items()
            if (only is None or names[0] in only) and not port_is_free(port)
        }
        if not taken:
            return
        low, high = ephemeral_range()
        in_range = [str(p) for p in taken if low <= p <= high]
        highest_offset = low - 1 - max(*DEFAULT_PORTS.values(), DEFAULT_LISTEN_PORT, DEFAULT_EVENTS_PORT)
        why = (
            f"; {', '.join(in_range)} {'lies' if len(in_range) == 1 else 'lie'} in the kernel's ephemeral range"
            f" {low}-{high}, whose ports any outgoing connection may take: {PORT_OFFSET_VARIABLE} up to"
            f" {highest_offset} keeps every port below it"
            if in_range and highest_offset >= 0
            else ""
        )
        raise BadEnvironment(
            f"port {', '.join(f'{p} ({name})' for p, name in taken.items())} already in use"
            f" ({'; '.join(f'{p}: {port_holders(p)}' for p in taken)}): set each variable named to a free port,"
            f" or move them all with {PORT_OFFSET_VARIABLE}=N{why}"
        )


def _with_shard_ports(ports: dict[str, int], shards: int) -> tuple[dict[str, int], list[str]]:
    """ports with the instance ports of shards 2..N (SHARD_PORT_STEP above the shard before each), and the
    errors of those that would pass 65535."""
    out = {name: port for name, port in ports.items() if " (shard s" not in name}
    errors = []
    for k in range(2, shards + 1):
        for i in (1, 2, 3):
            for name in (f"SC_PORT_{i}", f"SC_HTTP_PORT_{i}"):
                moved = out.get(name, 0) + SHARD_PORT_STEP * (k - 1)
                if name in out and moved > 65535:
                    errors.append(f"{name}={out[name]}: shard s{k}'s instance would need port {moved}")
                elif name in out:
                    out[f"{name} (shard s{k})"] = moved
    return out, errors
