"""Restarts and joins from a snapshot that holds synchronous writes (Tarantool 2.6.0, tarantool#5298).

On 2.6.0 an instance whose snapshot holds rows of a synchronous space cannot
start: every such row waits for a CONFIRM no snapshot has. smartcache.quorum
makes writes synchronous through an always-empty space instead; these tests
checkpoint a cluster full of synchronous writes and restart, kill and rebuild
its members from those snapshots.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest_ha import HACluster, eventually, ha_cluster, wait_for
from tests.integration.test_failover_storage import Writer

pytestmark = pytest.mark.slow


@pytest.fixture
def ha(tmp_path: Path) -> Iterator[HACluster]:
    with ha_cluster(tmp_path) as c:
        yield c


def checkpoint_all(ha: HACluster) -> None:
    """box.snapshot() on every instance (SIGUSR1) and wait for each new .snap (there must be new rows)."""
    before = {n: set(node.data_dir.glob("*.snap")) for n, node in ha.nodes.items()}
    for node in ha.nodes.values():
        node.send_signal(signal.SIGUSR1)
    for n, node in ha.nodes.items():
        eventually(lambda n=n, node=node: set(node.data_dir.glob("*.snap")) - before[n], what=f"a new snapshot on {n}")


def _held(r: dict[str, Any] | None) -> bool:
    """A leader holds writes (NOT_LEADER) for the few ms it takes to raise its quorum when a follower
    attaches; the service retries those, and so do these direct calls."""
    return r is not None and r["status"] == "NOT_LEADER"


def write_everything(ha: HACluster, leader: str, tag: str) -> list[str]:
    """Sessions, a device binding, a counter, an idempotent write: every guarded space gets rows."""

    def create(i: int) -> tuple[str, dict[str, Any] | None] | None:
        sid, r = ha.create_session(leader, {"tag": tag, "i": i})
        return None if _held(r) else (sid, r)

    def add() -> dict[str, Any] | None:
        r = ha.call(leader, "counter_add", f"c-{tag}", 5, None)
        return None if _held(r) else {"r": r}

    sids = []
    for i in range(20):
        sid, r = wait_for(partial(create, i), what="a leader that takes writes")
        assert r is not None
        assert r["status"] == "OK", r
        sids.append(sid)
    r = wait_for(add, what="a leader that takes writes")["r"]
    assert r is not None
    assert r["status"] == "OK", r
    return sids


def rebuild(ha: HACluster, target: str) -> None:
    """`cluster rejoin --force` of target (sc.rejoin: it exits), started again: it joins the leader empty."""
    uuid = ha.role(target)["instance_uuid"]  # type: ignore[index]
    answer = ha.operator_call(target, "rejoin", uuid, True)
    assert answer is not None
    assert answer["status"] == "OK", answer
    node = ha.nodes[target]
    eventually(lambda: not node.alive(), what="exit after rejoin")
    ha.restart(target)
    ha.wait_role(target, "follower", timeout_s=60)


def all_there(ha: HACluster, name: str, sids: list[str]) -> bool:
    return all(ha.status_of(name, "session_get", sid) == "OK" for sid in sids)


def test_every_member_restarts_from_a_snapshot_full_of_synchronous_writes(ha: HACluster) -> None:
    leader = ha.leader()
    before = write_everything(ha, leader, "before")
    checkpoint_all(ha)
    after = write_everything(ha, leader, "after")  # in the WAL behind the snapshot

    followers = [n for n in ha.nodes if n != leader]
    for n in followers:  # a clean stop and a crash
        if n == followers[0]:
            ha.restart(n)
        else:
            ha.nodes[n].send_signal(signal.SIGKILL)
            eventually(lambda n=n: not ha.nodes[n].alive(), what=f"{n} gone")
            ha.restart(n)
        ha.wait_role(n, "follower", timeout_s=60)
        eventually(lambda n=n: all_there(ha, n, before + after), what=f"{n} has every session after its restart")

    # The leader too: a follower takes over, the old leader comes back from its snapshot and follows.
    ha.nodes[leader].send_signal(signal.SIGKILL)
    eventually(lambda: not ha.nodes[leader].alive(), what="the leader gone")
    new = ha.leader(exclude=(leader,), timeout_s=60)
    assert all_there(ha, new, before + after)
    ha.restart(leader)
    ha.wait_role(leader, "follower", timeout_s=60)
    later = write_everything(ha, new, "later")
    eventually(lambda: all_there(ha, leader, before + after + later), what="the old leader follows again")
    counter = ha.call(new, "counter_get", "c-before")
    assert counter is not None
    assert counter["value"] == 5


def test_a_member_rebuilt_by_rejoin_joins_from_the_leaders_snapshot(ha: HACluster) -> None:
    leader = ha.leader()
    sids = write_everything(ha, leader, "joined")
    checkpoint_all(ha)
    target = next(n for n in ha.nodes if n != leader)
    rebuild(ha, target)
    eventually(lambda: all_there(ha, target, sids), what="the rebuilt member has every session")
    # And it restarts from a snapshot of its own as well.
    sids += write_everything(ha, leader, "rejoined")
    eventually(lambda: all_there(ha, target, sids), what="the rebuilt member follows")
    checkpoint_all(ha)
    ha.restart(target)
    ha.wait_role(target, "follower", timeout_s=60)
    assert all_there(ha, target, sids)


def test_writes_are_synchronous_through_sc_quorum_which_stays_empty(ha: HACluster) -> None:
    leader = ha.leader()
    write_everything(ha, leader, "probe")
    for name in ha.nodes:
        stats = ha.call(name, "stats")
        assert stats is not None
        sync = stats["synchronous"]
        assert sync["enabled"] is True
        assert sync["quorum_rows"] == 0
        assert {"sessions", "device", "idempotency", "counters", "semaphore_holders"} <= set(sync["guarded"])
        assert {"cache", "prewarm"} <= set(sync["guarded"])


CREATE_OLD = """
box.cfg{work_dir = arg[1], log_level = 2, replication_synchro_quorum = 1}
box.schema.space.create('sessions', {is_sync = true})
box.space.sessions:create_index('primary')
for i = 1, 10 do box.space.sessions:replace{i} end
box.snapshot()
for i = 11, 15 do box.space.sessions:replace{i} end  -- and some in the WAL, with their CONFIRM
os.exit(0)
"""

RECOVER = """
package.path = arg[2] .. '/?.lua;' .. package.path
local done = require('smartcache.quorum').strip_on_recovery()
box.cfg{work_dir = arg[1], log_level = 2, replication_synchro_quorum = 1, replication_synchro_timeout = 1}
local stripped = done()
print(require('json').encode({rows = box.space.sessions:len(), is_sync = box.space.sessions.is_sync,
                              stripped = stripped}))
os.exit(0)
"""


def test_a_data_directory_with_synchronous_spaces_from_an_earlier_version_recovers(tmp_path: Path) -> None:
    lua = Path(__file__).resolve().parents[2] / "lua"
    for name, text in (("create.lua", CREATE_OLD), ("recover.lua", RECOVER)):
        (tmp_path / name).write_text(text)
    data = tmp_path / "data"
    data.mkdir()
    run = partial(subprocess.run, check=True, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    run(["tarantool", "create.lua", str(data)])
    done = run(["tarantool", "recover.lua", str(data), str(lua)])
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"rows": 15, "is_sync": False, "stripped": ["sessions"]}


def test_a_member_rebuilt_under_synchronous_load_joins_and_has_every_acknowledged_write(ha: HACluster) -> None:
    """Tarantool 2.6.0 cannot take a CONFIRM in a join's final stage (tarantool#5566): the joiner asks
    the leader to hold writes (sc.join_hold) until it is registered. Writers run all along."""
    leader = ha.leader()
    target = next(n for n in ha.nodes if n != leader)
    with Writer(ha) as writer:
        eventually(lambda: len(writer.acked) > 200, what="writes under way")
        rebuild(ha, target)
        at_join = len(writer.acked)
        eventually(lambda: len(writer.acked) > at_join + 200, what="writes go on after the join")
    acked = [sid for _, sid in writer.acked]
    eventually(lambda: all_there(ha, target, acked), what="the rebuilt member has every acknowledged session")
    stats = ha.call(leader, "role")
    assert stats is not None
    held = [line for line in ha.nodes[leader].log_path.read_text().splitlines() if "join hold released" in line]
    assert held, "the leader held writes for the join"
    assert "the joiner is registered" in held[-1]
