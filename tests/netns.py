"""Network namespaces for fault tests: every process on a host of its own, links a test can cut.

Why namespaces and not tests/tcpproxy.py: a proxy only cuts the connections
that go through it, so each Tarantool, etcd and service would have to be told
to use a different address per peer, and a cut proxy closes or holds bytes in
user space (the peers see it at once, or never). Here every host has its own
network stack and address, and a partition drops packets in the kernel on
arrival: TCP on both sides retransmits and times out as on a real network,
connections that were up stay "up" until a timeout says otherwise, and the
programs are configured as in production (one address each).

Layout of one run (``PREFIX`` + the creator's PID, so a crashed run's leftovers
are recognised and removed by the next):

* a hub namespace holding a bridge (its own netfilter: the root namespace's
  firewall, Docker's FORWARD DROP say, never sees the hosts' traffic);
* one namespace per host, ``eth0`` on the bridge, 10.200.<net>.<n>/24;
* one veth from the root namespace (the test itself, the *observer*) to the
  bridge, 10.200.<net>.1: the observer reaches every host and is never cut.

A host's traffic is blocked per peer by an nftables set in the host's own
namespace, applied on *arrival* only (input hook): a packet leaves its sender,
crosses the bridge and is dropped by the receiver, so the sender sees no error,
only silence; blocking a pair adds each to the other's set. Processes run in a
host with ``argv_in(host, argv)``: ``nsenter --net`` execs the program, so the
PID is the program's own (signals go straight to it), and it shares our mount
namespace (tmpfs and loop mounts are visible to it).

Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN), ``ip``, ``nft`` and ``nsenter``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "scf-"
NETNS_DIR = Path("/run/netns")
#: third octet range tried for a run's /24 (10.200.<net>.0/24)
NET_RANGE = range(16, 250)
#: host numbers: .1 is the observer
FIRST_HOST = 10
_RUN_NAME = re.compile(rf"^{re.escape(PREFIX)}(\d+)-(.+)$")
_ROOT_LINK = re.compile(r"^scf(\d+)o$")
_NFT_RULES = """
table inet scf {
    set blocked { type ipv4_addr; }
    chain input {
        type filter hook input priority 0; policy accept;
        ip saddr @blocked drop
    }
}
"""


class NetnsError(RuntimeError):
    """A namespace, link or rule could not be created (not root? no nft?); the message has the command's output."""


def _run(*argv: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip() or done.stdout.strip()}")
    return done


def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def cleanup_stale() -> list[str]:
    """Delete namespaces and root links of earlier runs whose creating process is gone; their names."""
    removed = []
    names = [p.name for p in NETNS_DIR.iterdir()] if NETNS_DIR.is_dir() else []
    for name in names:
        m = _RUN_NAME.match(name)
        if m and not _pid_alive(int(m.group(1))):
            _run("ip", "netns", "del", name, check=False)
            removed.append(name)
    for line in _run("ip", "-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            link = parts[1].strip().split("@")[0]
            m = _ROOT_LINK.match(link)
            if m and not _pid_alive(int(m.group(1))):
                _run("ip", "link", "del", link, check=False)
                removed.append(link)
    return removed


def _free_net() -> int:
    used = _run("ip", "-4", "-o", "addr", "show", check=False).stdout
    for net in NET_RANGE:
        if f" 10.200.{net}." not in used:
            return net
    raise NetnsError("no free 10.200.x.0/24 left for a test network")


@dataclass
class Host:
    name: str
    netns: str
    ip: str


@dataclass
class Network:
    """One run's hub, hosts and observer link; ``close()`` removes them all."""

    run: str
    net: int
    hosts: dict[str, Host] = field(default_factory=dict)
    #: host -> the peers whose packets it drops
    blocked: dict[str, set[str]] = field(default_factory=dict)
    #: a name that stands for several hosts in cut and isolate (the fault suite's "etcd": its three members)
    groups: dict[str, list[str]] = field(default_factory=dict)
    _created: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, names: list[str]) -> Network:
        """A network with these hosts (and the observer), after removing a crashed run's leftovers."""
        cleanup_stale()
        net = cls(run=f"{PREFIX}{os.getpid()}", net=_free_net())
        try:
            net._make_hub()
            for name in names:
                net.add_host(name)
            net._make_observer_link()
        except BaseException:
            net.close()
            raise
        return net

    @property
    def hub(self) -> str:
        return f"{self.run}-hub"

    @property
    def observer_link(self) -> str:
        return f"scf{os.getpid()}o"

    @property
    def observer_ip(self) -> str:
        return f"10.200.{self.net}.1"

    def _add_netns(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self._created.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")

    def _make_hub(self) -> None:
        self._add_netns(self.hub)
        _run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.hub, "link", "set", "br0", "up")

    def _make_observer_link(self) -> None:
        link = self.observer_link
        _run("ip", "link", "add", link, "type", "veth", "peer", "name", "p-observer", "netns", self.hub)
        _run("ip", "-n", self.hub, "link", "set", "p-observer", "master", "br0", "up")
        _run("ip", "addr", "add", f"{self.observer_ip}/24", "dev", link)
        _run("ip", "link", "set", link, "up")

    def add_host(self, name: str) -> Host:
        """A namespace with eth0 on the bridge, its own address and an empty block list."""
        if len(name) > 12 or not re.fullmatch(r"[a-z0-9]+", name):
            raise ValueError(f"host name {name!r}: 1-12 lowercase letters and digits")
        ns = f"{self.run}-{name}"
        ip = f"10.200.{self.net}.{FIRST_HOST + len(self.hosts)}"
        ipaddress.ip_address(ip)
        self._add_netns(ns)
        _run("ip", "-n", self.hub, "link", "add", f"p-{name}", "type", "veth", "peer", "name", "eth0", "netns", ns)
        _run("ip", "-n", self.hub, "link", "set", f"p-{name}", "master", "br0", "up")
        _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        _run("ip", "-n", ns, "link", "set", "eth0", "up")
        _run("ip", "netns", "exec", ns, "nft", "-f", "-", stdin=_NFT_RULES)
        host = Host(name, ns, ip)
        self.hosts[name] = host
        self.blocked[name] = set()
        return host

    def argv_in(self, host: str, argv: list[str]) -> list[str]:
        """argv run inside host's network namespace (nsenter execs it: same PID)."""
        return ["nsenter", f"--net={NETNS_DIR / self.hosts[host].netns}", *argv]

    # -- faults ---------------------------------------------------------------------

    def _set(self, host: str, verb: str, peers: set[str]) -> None:
        if not peers:
            return
        ips = ", ".join(self.hosts[p].ip for p in sorted(peers))
        _run(
            "ip",
            "netns",
            "exec",
            self.hosts[host].netns,
            "nft",
            verb,
            "element",
            "inet",
            "scf",
            "blocked",
            f"{{ {ips} }}",
        )

    def add_group(self, name: str, hosts: list[str]) -> None:
        """Let name stand for these hosts in cut and isolate (a group is not a host: nothing runs "in" it)."""
        unknown = [h for h in hosts if h not in self.hosts]
        if unknown or name in self.hosts:
            raise ValueError(f"group {name!r}: {'unknown hosts ' + str(unknown) if unknown else 'a host has the name'}")
        self.groups[name] = list(hosts)

    def expand(self, name: str) -> list[str]:
        """The hosts a name stands for: a group's members, or the host itself."""
        return self.groups.get(name, [name])

    def cut(self, a: str, b: str) -> None:
        """Drop every packet between hosts a and b, both ways (each drops the other's on arrival); either may be
        a group (every member of it)."""
        for x in self.expand(a):
            for y in self.expand(b):
                for p, q in ((x, y), (y, x)):
                    if q not in self.blocked[p]:
                        self._set(p, "add", {q})
                        self.blocked[p].add(q)

    def isolate(self, host: str, from_hosts: list[str]) -> None:
        """Cut host from each of from_hosts (groups stand for their members)."""
        for other in [h for name in from_hosts for h in self.expand(name)]:
            if other not in self.expand(host):
                self.cut(host, other)

    def heal(self) -> None:
        """Every cut link carries packets again."""
        for host, peers in self.blocked.items():
            if peers:
                _run("ip", "netns", "exec", self.hosts[host].netns, "nft", "flush", "set", "inet", "scf", "blocked")
                peers.clear()

    def close(self) -> None:
        """Remove the observer link and every namespace of this run (processes in them must be stopped first)."""
        with contextlib.suppress(NetnsError):
            _run("ip", "link", "del", self.observer_link, check=False)
        for ns in reversed(self._created):
            _run("ip", "netns", "del", ns, check=False)
        self._created.clear()
        self.hosts.clear()
        self.groups.clear()
