"""`smartcache-cli cluster` and etcd: status shows the members, who leads and who is down, beside the
instances; without the server extra it still shows etcd; a leader that dies during a switchover is a
clear answer and exit code, not a traceback."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from smartcache.devstack.etcd import EtcdCluster
from tests.integration.conftest_ha import HACluster, ha_cluster


def _cli(*args: str, env: dict[str, str] | None = None, python: list[str] | None = None) -> tuple[int, dict, str]:
    out = subprocess.run(
        [*(python or [sys.executable, "-m", "smartcache.cli"]), "--timeout", "1", "cluster", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )
    return out.returncode, json.loads(out.stdout), out.stderr


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HACluster]:
    with ha_cluster(tmp_path_factory.mktemp("ha-cli")) as cluster:
        yield cluster


def _addresses(ha: HACluster) -> str:
    return ",".join(n.address for n in ha.nodes.values())


def test_status_shows_every_etcd_member_who_leads_and_that_all_are_healthy(ha: HACluster) -> None:
    rc, doc, _ = _cli("--tarantool", _addresses(ha), "--etcd", ha.etcd.url, "status")
    assert rc == 0, doc
    etcd = doc["etcd"]
    assert etcd["healthy"] is True
    assert etcd["quorum"] is True
    leader = ha.etcd.leader()
    assert leader is not None
    assert etcd["leader"] == leader.name
    assert etcd["leader_endpoint"] == leader.url
    states = {m["name"]: m["state"] for m in etcd["members"]}
    assert states == {m.name: "leader" if m is leader else "follower" for m in ha.etcd.members}
    assert all(m["reachable"] and m["version"] for m in etcd["members"])


def test_one_etcd_member_down_shows_as_down_and_the_status_as_not_healthy(ha: HACluster) -> None:
    victim = ha.etcd.followers()[0]
    ha.etcd.kill(victim.name)
    try:
        rc, doc, err = _cli("--tarantool", _addresses(ha), "--etcd", ha.etcd.url, "status")
        assert rc == 1  # not healthy: a member cannot be asked
        assert "Traceback" not in err
        etcd = doc["etcd"]
        down = next(m for m in etcd["members"] if m["name"] == victim.name)
        assert down["state"] == "down"
        assert down["reachable"] is False
        assert "Connection refused" in down["error"]
        assert etcd["quorum"] is True  # two of three: the leader keeps its lease
        assert etcd["members_healthy"] == "2 of 3"
        assert doc["leader"] is not None  # the instances are fine
    finally:
        ha.etcd.restart(victim.name)


def test_status_asks_no_etcd_of_standalone_instances_or_when_told_not_to(ha: HACluster) -> None:
    rc, doc, _ = _cli("--tarantool", _addresses(ha), "--etcd", "", "status")
    assert rc == 0
    assert "skipped" in doc["etcd"]


def test_without_the_server_extra_status_still_shows_etcd(ha: HACluster) -> None:
    no_connector = [
        sys.executable,
        "-c",
        "import sys; sys.modules['tarantool'] = None\nfrom smartcache.cli.main import main\nsys.exit(main())",
    ]
    rc, doc, err = _cli("--etcd", ha.etcd.url, "status", python=no_connector)
    assert rc == 5  # a missing package: neither a usage error (2) nor a timeout (3)
    assert doc["error"] == "MISSING_PACKAGE"
    assert doc["etcd"]["healthy"] is True
    assert "Traceback" not in err


def test_a_cluster_name_etcd_holds_nothing_of_is_an_error_naming_those_it_holds(ha: HACluster) -> None:
    """`--cluster wrongname status` answered "cluster healthy", exit 0: the instances were asked, etcd under a
    prefix nobody writes. The right name, given or not, is the one status prints."""
    rc, doc, _ = _cli("--tarantool", _addresses(ha), "--etcd", ha.etcd.url, "status")
    assert rc == 0, doc
    name = doc["topology"]["cluster"]
    rc, doc, err = _cli("--tarantool", _addresses(ha), "--etcd", ha.etcd.url, "--cluster", "wrongname", "status")
    assert rc == 2, doc
    assert "Traceback" not in err
    assert doc["error"] == "NOT_FOUND"
    assert f"'wrongname': etcd holds no such cluster (it holds {name})" in doc["message"]
    rc, doc, _ = _cli("--tarantool", _addresses(ha), "--etcd", ha.etcd.url, "--cluster", name, "status")
    assert (rc, doc["topology"]["cluster"]) == (0, name)


def test_a_killed_leader_is_not_shown_as_leader_and_the_cluster_not_healthy(ha: HACluster) -> None:
    """Right after kill -9 its member record still says leader (until its lease runs out): status shows it as
    'leader? (no answer)' at most, never as leader, names no leader until one is elected, and exits 1.
    Runs last of the tests on the module's cluster: the killed instance stays down."""
    rc, doc, _ = _cli(
        "--tarantool", _addresses(ha), "--etcd", ha.etcd.url, "init", "--reason", "test"
    )  # members listed
    assert rc == 0, doc
    name = ha.leader()
    dead = ha.nodes[name].address
    os.kill(ha.nodes[name].pid, signal.SIGKILL)
    rc, doc, err = _cli("--tarantool", _addresses(ha), "--etcd", ha.etcd.url, "status")
    assert "Traceback" not in err
    assert rc == 1
    assert doc["healthy"] is False
    assert doc["leader"] != dead
    (member,) = [m for m in doc["topology"]["members"] if m["address"] == dead]
    assert member["reachable"] is False
    assert member["role"] in ("leader? (no answer)", "down"), member  # the record's word, or none once it expired
    shown = [m["role"] for m in doc["topology"]["members"] if not m["reachable"]] + [
        i.get("role") for i in doc["instances"] if not i["reachable"]
    ]
    assert "leader" not in shown


# -- a leader that dies during the switchover -------------------------------------------------------


class FakeLeader:
    """Speaks enough iproto to be asked sc.role (a leader) and then resets the connection on sc.switchover,
    as a Tarantool killed in the middle of the hand-over does (the connector's NetworkError, errno 104)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.uuid = str(uuid.uuid4())
        self.calls: list[str] = []
        self.dead = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self.dead.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _session(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            if self.dead.is_set():  # killed: whoever asks now meets a closed door
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
            line1 = f"Tarantool 2.6.0 (Binary) {self.uuid}".ljust(63) + "\n"
            line2 = base64.b64encode(os.urandom(32)).decode().ljust(63) + "\n"
            conn.sendall((line1 + line2).encode())
            unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                unpacker.feed(data)
                for item in unpacker:
                    if not isinstance(item, int):
                        continue  # the length came first; header and body follow
                    header, body = next(unpacker), next(unpacker)
                    self._answer(conn, header, body)

    def _answer(self, conn: socket.socket, header: dict[int, Any], body: dict[int, Any]) -> None:
        sync, code = header.get(0x01, 0), header.get(0x00)
        result: list[Any] = []
        if code == 0x0A:  # CALL
            name = body.get(0x22)
            self.calls.append(name)
            if name == "sc.switchover":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST: killed
                self.dead.set()
                self.server.close()
                conn.close()
                return
            result = [{"role": "leader", "writable": True, "term": 7, "instance_uuid": self.uuid, "uri": self.address}]
            if name == "sc.audit_write":  # the entry before the switchover is taken
                result = [{"status": "OK", "seq": len(self.calls)}]
        reply = msgpack.packb({0x00: 0, 0x01: sync, 0x05: 1}) + msgpack.packb({0x30: result})
        conn.sendall(b"\xce" + struct.pack(">I", len(reply)) + reply)  # the length as a msgpack uint32, always


def test_a_leader_that_dies_during_the_switchover_is_a_clear_error_not_a_traceback() -> None:
    leader = FakeLeader()
    rc, doc, err = _cli("--tarantool", leader.address, "switchover", "--timeout-ms", "2000", "--reason", "test")
    assert "Traceback" not in err, err
    assert rc == 4  # lost during the operation: try again later, not a usage error
    assert doc["error"] == "CONNECTION_LOST"
    assert doc["address"] == leader.address
    assert "may or may not have happened" in doc["message"]
    assert "104" in doc["message"] or "reset" in doc["message"].lower()
    assert doc["leader"] is None  # asked again: nothing answers there any more
    assert leader.calls[-1] == "sc.switchover"
    assert leader.calls.count("sc.audit_write") == 1, "written before it acted"
    assert doc["audit"]["done"]["error"].startswith("the outcome was not recorded")


def test_etcd_cluster_helper_names_the_leader_and_every_member(tmp_path: Path) -> None:
    cluster = EtcdCluster.create(tmp_path)
    cluster.start()
    try:
        leader = cluster.wait_ready()
        listed = sorted(m["name"] for m in cluster.member_list())
        assert listed == ["etcd-1", "etcd-2", "etcd-3"]
        assert cluster.url == ",".join(m.url for m in cluster.members)
        cluster.kill(leader.name)
        successor = cluster.wait_leader(15, exclude=(leader.name,))
        assert successor is not leader
        cluster.restart(leader.name)
        assert cluster.wait_ready().name in {m.name for m in cluster.members}
    finally:
        cluster.stop()
        cluster.cleanup()
