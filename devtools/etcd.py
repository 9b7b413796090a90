"""etcd as a child process, for tests and (later) `make run`.

One member on 127.0.0.1, client and peer ports free at start, its own data dir
(created here, removed by `cleanup`). Built on `devtools.devstack.Child`: stopped
by its PID, and gone when we are (PR_SET_PDEATHSIG). Its life is bounded as
well: it runs under coreutils `timeout`, which ends it after `lifetime_s`
even if every stop path were missed. `pid` is etcd's own PID (the child of
`timeout`), for tests that stop or freeze etcd itself.
"""

from __future__ import annotations

import contextlib
import shutil
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from devtools.devstack import READY_TIMEOUT_S, Child, free_port

DEFAULT_LIFETIME_S = 3600


@dataclass
class Etcd(Child):
    """A one-member etcd v3 cluster listening on 127.0.0.1."""

    client_port: int = 0
    peer_port: int = 0
    data_dir: Path = field(default_factory=Path)

    @classmethod
    def create(
        cls,
        base_dir: Path,
        *,
        name: str = "etcd",
        client_port: int | None = None,
        lifetime_s: int = DEFAULT_LIFETIME_S,
    ) -> Etcd:
        client_port = client_port or free_port()
        peer_port = free_port()
        data_dir = base_dir / f"{name}.data"
        etcd = shutil.which("etcd") or "/usr/bin/etcd"
        client_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        argv = [
            "timeout",
            "--kill-after=5",
            str(lifetime_s),
            etcd,
            "--name",
            name,
            "--data-dir",
            str(data_dir),
            "--listen-client-urls",
            client_url,
            "--advertise-client-urls",
            client_url,
            "--listen-peer-urls",
            peer_url,
            "--initial-advertise-peer-urls",
            peer_url,
            "--initial-cluster",
            f"{name}={peer_url}",
            "--initial-cluster-state",
            "new",
            "--log-level",
            "warn",
        ]
        return cls(
            name=name,
            argv=argv,
            env={},
            log_path=base_dir / f"{name}.log",
            client_port=client_port,
            peer_port=peer_port,
            data_dir=data_dir,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def etcd_pid(self) -> int:
        """etcd's own PID: the only child of `timeout`."""
        children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
        if len(children) != 1:
            raise RuntimeError(f"expected one child of timeout({self.pid}), found {children}")
        return int(children[0])

    def healthy(self) -> bool:
        with (
            contextlib.suppress(OSError, ValueError),
            urllib.request.urlopen(self.url + "/health", timeout=1.0) as r,  # noqa: S310 - our own child
        ):
            return b'"health":"true"' in r.read()
        return False

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until /health says true."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited:\n{self.log_tail()}")
            if self.healthy():
                return
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} not ready in {timeout_s}s:\n{self.log_tail()}")

    def cleanup(self) -> None:
        """Remove the data dir (after stop)."""
        shutil.rmtree(self.data_dir, ignore_errors=True)


def post_json(url: str, body: bytes, timeout_s: float = 2.0) -> bytes:
    """POST to etcd's JSON gateway; returns the raw answer (tests decode it)."""
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:  # noqa: S310 - our own child
            return bytes(r.read())
    except urllib.error.HTTPError as e:
        return bytes(e.read())
