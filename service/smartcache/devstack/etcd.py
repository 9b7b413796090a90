"""etcd as child processes: one member (`Etcd`) or a cluster of three on one host (`EtcdCluster`).

`make run`, the HA tests and the fault suite run three members, as production
does: one host, three processes, each with its own data dir, client port and
peer port, bootstrapped statically (``--initial-cluster`` names all three,
``--initial-cluster-state new``), on 127.0.0.1 unless told otherwise (the
fault suite gives each member a network namespace and an address of its own).
A member restarted on its data dir rejoins the cluster by itself (etcd ignores
the initial-cluster flags once it has data).

Built on `smartcache.devstack.child.Child`: stopped by its PID, and gone when we are
(PR_SET_PDEATHSIG). Its life is bounded as well: each member runs under
coreutils `timeout`, which ends it after `lifetime_s` even if every stop path
were missed. `Etcd.pid` is the `timeout` process's; `Etcd.etcd_pid` is etcd's
own PID (the child of `timeout`), for tests that kill or freeze a member.

Who leads and who is a member are read from the members themselves through
the v3 JSON gateway (``/v3/maintenance/status``, ``/v3/cluster/member/list``)
with the one etcd client (smartcache.ops.etcd, its blocking face): the same
answers ``smartcache-cli cluster status`` shows.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smartcache.devstack.child import POLL_S, READY_TIMEOUT_S, Child, NotReady, Stop
from smartcache.devstack.sockets import free_port
from smartcache.ops.etcd import Call, ask_one
from smartcache.ops.etcd.core import HEALTH, healthy

DEFAULT_LIFETIME_S = 3600
#: members of a cluster created without saying how many (a majority survives one lost member)
CLUSTER_SIZE = 3
#: a gateway request to one member; a frozen member costs this much, no more
ASK_TIMEOUT_S = 1.0
#: what a member is killed with after SIGTERM when its `timeout` wrapper does not end it
KILL_AFTER_S = 5
#: argv -> argv run elsewhere (the fault suite: inside a member's network namespace)
Wrap = Callable[[list[str]], list[str]]


def _etcd_binary() -> str:
    return shutil.which("etcd") or "/usr/bin/etcd"


@dataclass
class Etcd(Child):
    """One etcd v3 member (alone, or one of an `EtcdCluster`)."""

    client_port: int = 0
    peer_port: int = 0
    data_dir: Path = field(default_factory=Path)
    host: str = "127.0.0.1"

    @classmethod
    def create(
        cls,
        base_dir: Path,
        *,
        name: str = "etcd",
        client_port: int | None = None,
        peer_port: int | None = None,
        host: str = "127.0.0.1",
        initial_cluster: str | None = None,
        cluster_token: str = "smartcache",  # noqa: S107 - etcd's name for a cluster's id, no secret
        lifetime_s: int = DEFAULT_LIFETIME_S,
        wrap: Wrap | None = None,
    ) -> Etcd:
        """A member; initial_cluster (name=peer-url,...) defaults to this member alone."""
        client_port = client_port or free_port()
        peer_port = peer_port or free_port()
        data_dir = base_dir / f"{name}.data"
        client_url = f"http://{host}:{client_port}"
        peer_url = f"http://{host}:{peer_port}"
        argv = ["timeout", f"--kill-after={KILL_AFTER_S}", str(lifetime_s), _etcd_binary()]
        argv += ["--name", name, "--data-dir", str(data_dir)]
        argv += ["--listen-client-urls", client_url, "--advertise-client-urls", client_url]
        argv += ["--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url]
        argv += ["--initial-cluster", initial_cluster or f"{name}={peer_url}", "--initial-cluster-state", "new"]
        argv += ["--initial-cluster-token", cluster_token, "--log-level", "warn"]
        return cls(
            name=name,
            argv=wrap(argv) if wrap else argv,
            env={},
            log_path=base_dir / f"{name}.log",
            client_port=client_port,
            peer_port=peer_port,
            data_dir=data_dir,
            host=host,
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    @property
    def etcd_pid(self) -> int:
        """etcd's own PID: the only child of `timeout`."""
        children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
        if len(children) != 1:
            raise RuntimeError(f"expected one child of timeout({self.pid}), found {children}")
        return int(children[0])

    def healthy(self) -> bool:
        """GET /health says true: this member has a leader and answers a linearizable read."""
        return healthy(ask_one(self.url, HEALTH, ASK_TIMEOUT_S))

    def status(self) -> dict[str, Any] | None:
        """This member's /v3/maintenance/status (leader, raftTerm, version...); None when it does not answer."""
        doc = ask(self.url, "/v3/maintenance/status")
        return doc if isinstance(doc, dict) else None

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S, stop: Stop | None = None) -> None:
        """Until /health says true (NotReady if it exits, time runs out or stop is set)."""
        self.wait_until("/health true", self.healthy, timeout_s, stop)

    def cleanup(self) -> None:
        """Remove the data dir (after stop)."""
        shutil.rmtree(self.data_dir, ignore_errors=True)


@dataclass
class EtcdCluster:
    """Members on one host, one data dir, client port and peer port each, bootstrapped together."""

    members: list[Etcd]

    @classmethod
    def create(
        cls,
        base_dir: Path,
        *,
        size: int = CLUSTER_SIZE,
        name: str = "etcd",
        client_ports: Sequence[int] | None = None,
        peer_ports: Sequence[int] | None = None,
        hosts: Sequence[str] | None = None,
        lifetime_s: int = DEFAULT_LIFETIME_S,
        wrap: Callable[[int, list[str]], list[str]] | None = None,
    ) -> EtcdCluster:
        """Members <name>-1..<name>-<size>; ports free ones unless given; wrap(i, argv) runs member i elsewhere."""
        client_ports = list(client_ports or [free_port() for _ in range(size)])
        peer_ports = list(peer_ports or [free_port() for _ in range(size)])
        hosts = list(hosts or ["127.0.0.1"] * size)
        if not len(client_ports) == len(peer_ports) == len(hosts) == size:
            raise ValueError(f"{size} members need {size} client ports, peer ports and hosts")
        names = [f"{name}-{i}" for i in range(1, size + 1)]
        initial = ",".join(f"{n}=http://{h}:{p}" for n, h, p in zip(names, hosts, peer_ports, strict=True))
        token = f"{name}-{os.getpid()}-{time.monotonic_ns()}"  # a member of another cluster is never taken for ours
        members = [
            Etcd.create(
                base_dir,
                name=n,
                client_port=client_ports[i],
                peer_port=peer_ports[i],
                host=hosts[i],
                initial_cluster=initial,
                cluster_token=token,
                lifetime_s=lifetime_s,
                wrap=(lambda argv, i=i: wrap(i, argv)) if wrap else None,  # type: ignore[misc]
            )
            for i, n in enumerate(names)
        ]
        return cls(members)

    # -- what SC_ETCD and the CLI take ----------------------------------------------

    @property
    def endpoints(self) -> list[str]:
        """Every member's client URL."""
        return [m.url for m in self.members]

    @property
    def url(self) -> str:
        """Every member's client URL, comma-separated: the form SC_ETCD and SMARTCACHE_ETCD take."""
        return ",".join(self.endpoints)

    def member(self, name: str) -> Etcd:
        for m in self.members:
            if m.name == name:
                return m
        raise KeyError(f"no etcd member {name!r} (members: {', '.join(m.name for m in self.members)})")

    # -- start and stop -------------------------------------------------------------

    def start(self) -> None:
        """Start every member (they elect a leader once a majority is up)."""
        for m in self.members:
            m.start()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S, stop: Stop | None = None) -> Etcd:
        """Until one member leads and every running member says healthy; the leader.

        NotReady if a member exits, time runs out or stop is set.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            for m in self.members:
                if not m.alive():
                    raise NotReady(f"{m.name} exited before the etcd cluster formed:\n{m.log_tail()}")
            leader = self.leader()
            if leader is not None and all(m.healthy() for m in self.members):
                return leader
            if time.monotonic() > deadline:
                raise NotReady(f"etcd: no leader and healthy members in {timeout_s:g} s:\n{self.members[0].log_tail()}")
            if stop is not None and stop.wait(POLL_S):
                raise NotReady("stopped while waiting for etcd")
            if stop is None:
                time.sleep(POLL_S)

    def stop(self) -> None:
        """Stop every member by its PID (SIGTERM, then SIGKILL), resuming a frozen one first."""
        for m in self.members:
            with contextlib.suppress(RuntimeError, OSError):
                if m.alive():
                    os.kill(m.etcd_pid, signal.SIGCONT)
            m.stop()

    def cleanup(self) -> None:
        """Remove every member's data dir (after stop)."""
        for m in self.members:
            m.cleanup()

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Send sig to a member's etcd process itself (not its `timeout`); its PID.

        SIGKILL: returns once the member is gone. SIGSTOP freezes it (SIGCONT resumes it).
        """
        member = self.member(name)
        pid = member.etcd_pid
        os.kill(pid, sig)
        if sig == signal.SIGKILL:
            deadline = time.monotonic() + 10
            while member.alive():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} (pid {pid}) still running 10 s after SIGKILL")
                time.sleep(POLL_S)
        return pid

    def restart(self, name: str, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Start a stopped or killed member again on its data dir; returns once it is healthy."""
        member = self.member(name)
        member.stop()
        member.start()
        member.wait_ready(timeout_s)

    # -- losing its data: a wipe, a restore from an old copy ------------------------------

    def wipe(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """etcd forgets everything: every member stopped by its PID, its data dir deleted, all started again on
        the same ports (a new cluster bootstraps: `--initial-cluster-state new`)."""
        self.stop()
        for m in self.members:
            shutil.rmtree(m.data_dir, ignore_errors=True)
        self.start()
        self.wait_ready(timeout_s)

    def snapshot(self, dest: Path) -> None:
        """A copy of every member's data dir taken at one moment: all frozen (SIGSTOP) for the copy, tens of ms,
        so the copies agree with each other (what a restore from a backup gives every member)."""
        frozen = []
        try:
            for m in self.members:
                os.kill(m.etcd_pid, signal.SIGSTOP)
                frozen.append(m)
            for m in self.members:
                shutil.copytree(m.data_dir, dest / m.name)
        finally:
            for m in frozen:
                os.kill(m.etcd_pid, signal.SIGCONT)

    def restore(self, copy: Path, timeout_s: float = READY_TIMEOUT_S) -> None:
        """etcd goes back in time: every member stopped, its data dir replaced by the snapshot's copy, all started
        again on the same ports."""
        self.stop()
        for m in self.members:
            shutil.rmtree(m.data_dir, ignore_errors=True)
            shutil.copytree(copy / m.name, m.data_dir)
        self.start()
        self.wait_ready(timeout_s)

    # -- who is a member, who leads ---------------------------------------------------

    def status(self) -> dict[str, dict[str, Any] | None]:
        """Each member's /v3/maintenance/status by name (None: it does not answer)."""
        return {m.name: m.status() for m in self.members}

    def member_list(self) -> list[dict[str, Any]]:
        """The cluster's members as the first member that answers lists them: [{ID, name, peerURLs, clientURLs}]."""
        for m in self.members:
            doc = ask(m.url, "/v3/cluster/member/list")
            if doc is not None:
                return list(doc.get("members", []))
        return []

    def leader(self) -> Etcd | None:
        """The member that leads, as a majority of the members that answer see it (None: no leader now).

        Each answering member names the leader it follows (status.leader, a member ID); the
        one named by a majority of all members is the leader. A member cut off from the
        others may still name an old leader, so one voice is not enough.
        """
        ids: dict[str, Etcd] = {}
        votes: dict[str, int] = {}
        for m in self.members:
            doc = m.status()
            if doc is None:
                continue
            ids[str(doc.get("header", {}).get("member_id"))] = m
            lead = str(doc.get("leader", "0"))
            if lead != "0":
                votes[lead] = votes.get(lead, 0) + 1
        for lead, n in votes.items():
            if n > len(self.members) // 2 and lead in ids:
                return ids[lead]
        return None

    def wait_leader(self, timeout_s: float = READY_TIMEOUT_S, exclude: tuple[str, ...] = ()) -> Etcd:
        """Until a member not excluded leads; that member."""
        deadline = time.monotonic() + timeout_s
        while True:
            leader = self.leader()
            if leader is not None and leader.name not in exclude:
                return leader
            if time.monotonic() > deadline:
                raise TimeoutError(f"etcd: no leader outside {exclude} in {timeout_s:g} s: {self.status()}")
            time.sleep(POLL_S)

    def followers(self) -> list[Etcd]:
        """The members that do not lead now (all of them when none leads)."""
        leader = self.leader()
        return [m for m in self.members if m is not leader]


def ask(url: str, path: str, body: dict[str, Any] | None = None, timeout_s: float = ASK_TIMEOUT_S) -> Any:
    """POST a JSON body (default {}) to a member's gateway; the decoded answer, None when it does not answer."""
    return ask_one(url, Call(path, body or {}), timeout_s)
