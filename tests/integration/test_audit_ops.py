"""The audit of operator actions and the rekey of sessions written before revision 11, through smartcache-cli as a
real subprocess against etcd and three Tarantool instances in HA mode (issue 37).

An acting command is written to storage's audit before it acts (with who asked and the reason typed) and with its
outcome; `smartcache-cli audit` prints both. `cluster sessions-rekey` renames raw-keyed rows to the stored ids the
service derives with the cluster's key (refused with another key), prints counts and never an id, and renames
nothing the second time; the service then finds each session by the raw id its client holds.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from smartcache.client import Client
from smartcache.ops.access import Access
from smartcache.ops.instances import call
from smartcache.wire import sessionkeys
from tests.conftest import service_process
from tests.integration.conftest_ha import HACluster, ha_cluster

KEY = secrets.token_bytes(32)


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HACluster]:
    with ha_cluster(tmp_path_factory.mktemp("ha-audit")) as cluster:
        yield cluster


def _cli(ha: HACluster, *args: str, key: bytes | None = None) -> tuple[int, list[dict[str, Any]], str]:
    """smartcache-cli with the cluster's instances and etcd: (exit code, the JSON lines printed, stdout)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMARTCACHE_SESSION_KEY")}
    if key is not None:
        env["SMARTCACHE_SESSION_KEY"] = key.hex()
    where = ["--tarantool", ",".join(n.address for n in ha.nodes.values()), "--etcd", ha.etcd.url]
    command, rest = (args[0], args[1:]) if args[0] == "audit" else ("cluster", args)
    as_json = [] if "--format" in args else ["--json"]  # --json would win over --format columns
    out = subprocess.run(
        [sys.executable, "-m", "smartcache.cli", *as_json, command, *where, *rest],
        check=False, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    return out.returncode, [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")], out.stdout


def _entries(ha: HACluster, reason: str) -> list[dict[str, Any]]:
    rc, lines, _ = _cli(ha, "audit", "--limit", "1000")
    assert rc == 0, lines
    return [e for e in lines[:-1] if e.get("reason") == reason]


def test_a_switchover_is_written_before_and_after_with_who_and_why_and_audit_prints_both(ha: HACluster) -> None:
    reason = "planned maintenance " + uuid.uuid4().hex[:6]
    rc, (doc,), _ = _cli(ha, "switchover", "--reason", reason)
    assert rc == 0, doc
    asked, done = _entries(ha, reason)
    assert asked["seq"] == doc["audit"]["asked"]["seq"]
    assert done["seq"] == doc["audit"]["done"]["seq"]
    assert asked["action"] == done["action"] == "cluster.switchover"
    assert asked["who"].startswith("cli:"), asked["who"]
    assert asked["who"].endswith(" as operator"), asked["who"]
    assert asked["details"]["phase"] == "asked"
    assert (done["details"]["phase"], done["details"]["status"]) == ("done", "OK")
    assert done["details"]["asked_seq"] == asked["seq"]
    assert asked["time"].endswith("+00:00")
    # on from the last line's next: nothing new
    rc, lines, _ = _cli(ha, "audit")
    nxt = lines[-1]["next"]
    rc, lines, _ = _cli(ha, "audit", "--since", str(nxt))
    assert (rc, lines) == (0, [{"next": nxt, "count": 0}])
    # for reading
    rc, _, text = _cli(ha, "audit", "--format", "columns", "--since", str(asked["seq"] - 1))
    first = text.splitlines()[0]
    assert f"  {asked['seq']}  cli:" in first
    assert f"cluster.switchover  -  asked  {json.dumps(reason)}" in first


def test_an_acting_command_without_a_reason_writes_nothing_and_does_nothing(ha: HACluster) -> None:
    _, lines, _ = _cli(ha, "audit")
    before = lines[-1]["next"]
    rc, (doc,), _ = _cli(ha, "rejoin", next(iter(ha.nodes.values())).address)
    assert rc == 2
    assert "--reason TEXT is required" in doc["message"]
    _, lines, _ = _cli(ha, "audit", "--since", str(before))
    assert lines == [{"next": before, "count": 0}]


def _raw_keyed(ha: HACluster, client_id: str, n: int) -> list[str]:
    """Sessions as a service of revision 10 made them: keyed by the raw id (sc.session_create with no id)."""
    leader = ha.leader()
    made = [ha.call(leader, "session_create", None, client_id, None, 600, {"n": i}) for i in range(n)]
    assert all(m and m["status"] == "OK" for m in made), made
    return [str(m["session_id"]) for m in made if m]


def test_sessions_rekey_renames_raw_keyed_sessions_once_and_the_service_finds_them(
    ha: HACluster, tmp_path: Path
) -> None:
    raws = _raw_keyed(ha, "client-rekey", 5)
    rc, (doc,), _ = _cli(ha, "sessions-rekey", "--reason", "upgrade to revision 11")
    assert rc == 2
    assert "needs the session key" in doc["message"]
    rc, (doc,), out = _cli(ha, "sessions-rekey", "--reason", "upgrade to revision 11", key=KEY)
    assert rc == 0, doc
    assert (doc["status"], doc["rekeyed"], doc["not_found"], doc["errors"]) == ("OK", 5, 0, [])
    assert not any(raw in out for raw in raws), "counts, never an id"
    again = _cli(ha, "sessions-rekey", "--reason", "upgrade to revision 11, again", key=KEY)[1][0]
    assert (again["status"], again["rekeyed"]) == ("OK", 0)
    operator = Access(addresses=(), user="operator", password="operator")
    page = call(operator, ha.nodes[ha.leader()].address, "sessions_page", None, 100)
    assert (page["status"], page["sessions"], page["done"]) == ("OK", [], True), "no raw-keyed session left"
    # the audit: the key's id, never the key; the counts in the outcome
    asked, done = _entries(ha, "upgrade to revision 11")
    assert asked["details"]["key_id"] == sessionkeys.key_id(KEY)
    assert KEY.hex() not in json.dumps([asked, done])
    assert (done["details"]["status"], done["details"]["rekeyed"]) == ("OK", 5)
    # a service deriving with the same key finds every session by the id its client holds
    leader = ha.nodes[ha.leader()]
    addresses = ",".join(n.address for n in ha.nodes.values())
    with (
        service_process(leader, tmp_path, SMARTCACHE_TARANTOOL=addresses, SMARTCACHE_SESSION_KEY=KEY.hex()) as svc,
        Client(svc.endpoint, timeout_s=5) as c,
    ):
        for i, raw in enumerate(raws):
            got = c.session_get(uuid.UUID(raw))
            assert (got.status, got.body.get("data")) == ("OK", {"n": i})


def test_sessions_rekey_with_another_key_renames_nothing(ha: HACluster) -> None:
    """Runs after the test above: the cluster keeps KEY's id; a rename with any other key would log every customer
    out (their clients' ids would derive to other stored ids)."""
    raws = _raw_keyed(ha, "client-rekey-2", 1)
    rc, (doc,), _ = _cli(ha, "sessions-rekey", "--reason", "a wrong key", key=secrets.token_bytes(32))
    assert rc == 1
    assert doc["status"] == "INCOMPLETE"
    (stopped,) = doc["replica_sets"].values()
    assert "not this cluster's session key" in stopped["error"]
    assert doc["rekeyed"] == 0
    rc, (doc,), _ = _cli(ha, "sessions-rekey", "--reason", "the right key", key=KEY)
    assert (rc, doc["rekeyed"]) == (0, len(raws))
