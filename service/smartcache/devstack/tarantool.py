"""Tarantool instances as children of the stack (lua/init.lua), and a trio's election waited for.

`Tarantool` is one storage instance on 127.0.0.1 (its iproto and operator HTTP ports, its data
dir); `wait_cluster_formed` waits until etcd elected one of a trio and the others follow it;
`role_of` reads an instance's role from its /health, make run's "is it back?" after a restart.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smartcache.devstack.child import LUA_INIT, READY_TIMEOUT_S, Child, NotReady, Stop, http_get_json
from smartcache.devstack.sockets import free_port, listens


@dataclass
class Tarantool(Child):
    """One storage instance running lua/init.lua."""

    port: int = 0
    http_port: int = 0
    data_dir: Path = field(default_factory=Path)

    @classmethod
    def create(
        cls,
        name: str,
        base_dir: Path,
        *,
        port: int | None = None,
        http_port: int | None = None,
        read_only: bool = False,
        replication: list[str] | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> Tarantool:
        port = port or free_port()
        http_port = http_port or free_port()
        data_dir = base_dir / name
        env = {
            "SC_INSTANCE_NAME": name,
            "SC_LISTEN": f"127.0.0.1:{port}",
            "SC_HTTP_LISTEN": f"127.0.0.1:{http_port}",
            "SC_DATA_DIR": str(data_dir),
            "SC_READ_ONLY": "true" if read_only else "false",
            "SC_REPLICATION": ",".join(replication or []),
            "SC_MEMTX_MEMORY": str(128 * 1024 * 1024),
            **(extra_env or {}),
        }
        tarantool = shutil.which("tarantool") or "tarantool"
        return cls(
            name=name,
            argv=[tarantool, str(LUA_INIT)],
            env=env,
            log_path=base_dir / f"{name}.log",
            port=port,
            http_port=http_port,
            data_dir=data_dir,
        )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S, stop: Stop | None = None) -> dict[str, Any]:
        """Wait until this process listens on both ports and its /health answers 200; returns the document."""
        health: dict[str, Any] = {}

        def ready() -> bool:
            if not (listens(self.pid, self.port) and listens(self.pid, self.http_port)):
                return False
            with contextlib.suppress(OSError, ValueError):
                status, doc = http_get_json(self.http_url + "/health", timeout_s=1.0)
                if status == 200:
                    health.update(doc)
                    return True
            return False

        self.wait_until("/health 200", ready, timeout_s, stop)
        return health


def leads_or_follows(t: Tarantool) -> bool:
    return role_of(t) in ("leader", "follower")


def role_of(t: Tarantool) -> str:
    """The instance's role from its /health ('?' while it does not answer)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        _, doc = http_get_json(t.http_url + "/health", timeout_s=0.5)
        return str(doc.get("role"))
    return "?"


def wait_cluster_formed(instances: list[Tarantool], stop: Stop) -> Tarantool:
    """Until etcd has elected one instance and the others follow it (so a synchronous write finds its
    quorum at once: the first write of the quick start must not wait for followers); returns the leader."""
    elected: list[Tarantool] = []

    def formed() -> bool:
        roles = {}
        for t in instances:
            if not t.alive():
                raise NotReady(f"{t.name} exited before the cluster formed:\n{t.log_tail()}")
            with contextlib.suppress(OSError, ValueError):
                status, doc = http_get_json(t.http_url + "/health", timeout_s=1.0)
                if status == 200:
                    roles[t.name] = doc
        leaders = [t for t in instances if roles.get(t.name, {}).get("role") == "leader"]
        if len(leaders) != 1 or len(roles) != len(instances):
            return False
        followers = [roles[t.name] for t in instances if t is not leaders[0]]
        following = all(
            doc.get("role") == "follower" and any(r.get("upstream_status") == "follow" for r in doc["replication"])
            for doc in followers
        )
        downstreams = sum(1 for r in roles[leaders[0].name]["replication"] if r.get("downstream_status") == "follow")
        elected[:] = leaders
        return following and downstreams == len(followers)

    instances[0].wait_until("a leader elected by etcd, followed by the others", formed, READY_TIMEOUT_S, stop)
    return elected[0]
