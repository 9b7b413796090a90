"""Tarantool 2.6.0's synchronous rollback and a write that arrives while its ROLLBACK row is being written.

When the oldest write in the limbo waits replication_synchro_timeout without its quorum, 2.6.0
(txn_limbo.c, txn_limbo_wait_complete) writes a ROLLBACK row naming that write's LSN, and only after
that WAL write, in the same fiber, rolls back in memory every transaction in the limbo. The WAL write
yields: a transaction committed meanwhile enters the limbo and the WAL *after* the ROLLBACK row, and is
then rolled back in the leader's memory with the rest (its caller gets ER_WAL_IO or ER_SYNC_ROLLBACK).
The followers apply the ROLLBACK row before that transaction's rows arrive, so they keep them. The
leader's next event reuses the sequence number the lost write had, and the followers' appliers stop
on ER_TUPLE_FOUND in the events space: issue 35, as seen under load (fuzz mix and busy loops).

Fixed upstream in 2.6.1 ("txn_limbo: introduce cascading rollback": a write is refused with
ER_SYNC_ROLLBACK while the limbo's is_in_rollback is set). Our
workaround (compat.SYNC_ROLLBACK_ADMITS_NEWER, quorum.lua) refuses a new synchronous write from the
moment the oldest one has waited as long as the timeout (less a margin) until it has ended: a write
procedure answers WRITES_HELD before it begins, a statement already in a transaction fails as
read-only; nothing can enter between the timeout and the end of the rollback.

Two real instances on 127.0.0.1 (a leader with our modules, a plain replica); the leader's quorum is 3
with one replica, so write A can only time out. Just before its timeout the leader freezes its own WAL
thread (a cgroup v1 freezer holding that one thread): A's ROLLBACK row then waits in the WAL queue, and
C, written meanwhile, lands after it every time (a timing window of microseconds, on a busy machine
missed half the time, made as wide as we like). Then the WAL thaws, the quorum goes to 2 and D is
written: on a replica that kept C, D's event collides with C's. The control turns the workaround off
and must show the divergence, or the test proves nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from smartcache.devstack.stack import free_port

LEADER = r"""
package.path = arg[4] .. '/?.lua;' .. package.path
local fiber = require('fiber')
local netbox = require('net.box')
local listen, dir, replica_uri, mode = arg[1], arg[2], arg[3], arg[5]
box.cfg{listen = listen, work_dir = dir, log = dir .. '/leader.log', replication_synchro_quorum = 2,
        replication_synchro_timeout = 0.5, memtx_memory = 64 * 1024 * 1024}
box.schema.user.grant('guest', 'read,write,execute,replication', 'universe', nil, {if_not_exists = true})
local compat = require('smartcache.compat')
if mode == 'control' then
    compat.SYNC_ROLLBACK_ADMITS_NEWER = false
end
require('smartcache.schema').upgrade()
require('smartcache.api').register('svc', 'secret')
local quorum = require('smartcache.quorum')
quorum.enable(true)
quorum.watch_new_spaces(function(name) return name:match('^events_') ~= nil end)
quorum.guard_all(require('smartcache.events').partitions())

local rid
for _ = 1, 400 do
    for id, r in pairs(box.info.replication) do
        if id ~= box.info.id and r.downstream and r.downstream.status == 'follow' then rid = id end
    end
    if rid then break end
    fiber.sleep(0.05)
end
assert(rid, 'the replica did not subscribe')
assert(sc.session_create(nil, nil, 'warm-up', nil, 600, {}).status == 'OK')
fiber.sleep(0.1)

local res = {}
local function call(name, fn)
    local ok, r = pcall(fn)
    res[name] = ok and (type(r) == 'table' and r.status or 'OK') or tostring(r)
end
-- The WAL thread alone frozen (a freezer cgroup holding that one thread), so that A's ROLLBACK row waits
-- in the WAL queue for as long as we like: a write made meanwhile lands after it, every time.
local fio = require('fio')
local freezer = '/sys/fs/cgroup/freezer/smartcache-test-' .. box.info.pid
local function put(path, text)
    local f = assert(fio.open(path, {'O_WRONLY'}), path)
    f:write(text)
    f:close()
end
local wal
for _, task in ipairs(fio.listdir('/proc/self/task')) do
    local f = fio.open('/proc/self/task/' .. task .. '/comm', {'O_RDONLY'})
    if f ~= nil and f:read(64):match('^wal') then wal = task end
    if f ~= nil then f:close() end
end
assert(wal, 'no wal thread')
assert(fio.mkdir(freezer), 'cannot create ' .. freezer)
put(freezer .. '/tasks', wal)

box.cfg{replication_synchro_quorum = 3}  -- one replica: nothing can be confirmed, A times out
local lsn0 = box.info.lsn
local a = fiber.new(call, 'A', function() return sc.session_create(nil, nil, 'client-a', nil, 600, {}) end)
a:set_joinable(true)
while box.info.lsn == lsn0 do fiber.sleep(0.001) end  -- A is in the WAL: its wait of 0.5 s starts
fiber.sleep(0.3)
put(freezer .. '/freezer.state', 'FROZEN')
fiber.sleep(0.5)  -- A timed out meanwhile: its ROLLBACK row waits in the frozen WAL, A's fiber with it
res.window = res.A == nil
res.C = {}
local c = fiber.new(function()
    local ok, r = pcall(sc.session_create, nil, nil, 'client-c', nil, 600, {})
    res.C[1] = ok and (type(r) == 'table' and r.status or 'OK') or tostring(r)
end)
c:set_joinable(true)
fiber.sleep(0.05)  -- C is in the limbo and the WAL queue, after the ROLLBACK row (or refused)
put(freezer .. '/freezer.state', 'THAWED')
a:join() c:join()
put('/sys/fs/cgroup/freezer/tasks', wal)
fio.rmdir(freezer)
fiber.sleep(0.1)
box.cfg{replication_synchro_quorum = 2}
fiber.sleep(0.2)
-- D: as many writes as there were Cs, so that the event numbers of every C reach the replica again
call('D', function()
    for i = 1, #res.C + 1 do
        local r = sc.session_create(nil, nil, 'client-d-' .. i, nil, 600, {})
        if r.status ~= 'OK' then return r end
    end
    return {status = 'OK'}
end)
fiber.sleep(0.5)

local function state(space)
    local events = 0
    for _, s in space._space:pairs() do
        if s[3]:match('^events_') then events = events + space[s[3]]:len() end
    end
    return {sessions = space.sessions:len(), events = events}
end
local leader_state = state(box.space)
local conn = netbox.connect(replica_uri)
local replica = conn:eval([=[
    local events = 0
    for _, s in box.space._space:pairs() do
        if s[3]:match('^events_') then events = events + box.space[s[3]]:len() end
    end
    local up = box.info.replication[1].upstream
    return {sessions = box.space.sessions:len(), events = events, upstream = up and up.status,
            message = up and up.message}
]=])
conn:close()
print(require("json").encode({results = res, leader = leader_state, replica = replica,
                              holds = quorum.stats().rollback_holds}))
os.exit(0)
"""

REPLICA = r"""
local master, listen, dir = arg[1], arg[2], arg[3]
box.cfg{listen = listen, replication = {master}, read_only = true, work_dir = dir, log = dir .. '/replica.log',
        replication_synchro_quorum = 2, replication_synchro_timeout = 0.5, memtx_memory = 64 * 1024 * 1024}
box.schema.user.grant('guest', 'read,write,execute', 'universe', nil, {if_not_exists = true})
require('fiber').sleep(60)
os.exit(0)
"""


def _run(tmp_path: Path, mode: str) -> dict[str, Any]:
    lua = Path(__file__).resolve().parents[2] / "lua"
    (tmp_path / "leader.lua").write_text(LEADER)
    (tmp_path / "replica.lua").write_text(REPLICA)
    (tmp_path / "l").mkdir()
    (tmp_path / "r").mkdir()
    lp, rp = free_port(), free_port()
    leader = subprocess.Popen(
        ["tarantool", "leader.lua", f"127.0.0.1:{lp}", str(tmp_path / "l"), f"127.0.0.1:{rp}", str(lua), mode],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    replica = subprocess.Popen(
        ["tarantool", "replica.lua", f"127.0.0.1:{lp}", f"127.0.0.1:{rp}", str(tmp_path / "r")],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        out, err = leader.communicate(timeout=60)
    finally:
        for p in (leader, replica):
            if p.poll() is None:
                p.kill()
                p.wait()
    log = tmp_path / "l" / "leader.log"
    assert leader.returncode == 0, err + (log.read_text()[-3000:] if log.exists() else "")
    doc: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return doc


FREEZER = Path("/sys/fs/cgroup/freezer")


def _freezer() -> None:
    if not (FREEZER / "tasks").exists() or not os.access(FREEZER, os.W_OK):
        pytest.skip("needs a writable cgroup v1 freezer (root): the leader freezes its own WAL thread")


def _on_2_6_0() -> None:
    version = subprocess.run(["tarantool", "--version"], check=True, capture_output=True, text=True).stdout
    if not version.startswith("Tarantool 2.6.0"):
        pytest.skip("the rollback bug is Tarantool 2.6.0's")


def test_control_a_write_during_the_rollback_row_diverges_the_replica_on_2_6_0(tmp_path: Path) -> None:
    _on_2_6_0()
    _freezer()
    doc = _run(tmp_path, "control")
    res = doc["results"]
    assert res.get("window") is True, doc
    assert "Quorum collection for a synchronous transaction is timed out" in res["A"], doc
    # the replica kept the Cs that entered after the ROLLBACK row, which the leader rolled back ...
    assert doc["replica"]["sessions"] > doc["leader"]["sessions"], doc
    # ... and the Ds reused their event numbers: its applier stopped, and every later write times out
    assert doc["replica"]["upstream"] == "stopped", doc
    assert "Duplicate key" in doc["replica"]["message"], doc
    assert "timed out" in res["D"], doc


def test_a_write_during_a_rollback_is_refused_as_read_only_and_nothing_diverges(tmp_path: Path) -> None:
    _freezer()
    doc = _run(tmp_path, "fixed")
    res = doc["results"]
    assert res.get("window") is True, doc
    assert "Quorum collection for a synchronous transaction is timed out" in res["A"], doc
    assert res["C"], doc
    # refused up front (WRITES_HELD: the service sends it again) or, inside a transaction, as read-only
    assert all(c == "WRITES_HELD" or c.startswith("writes held: a synchronous write has waited") for c in res["C"]), doc
    assert doc["holds"] == len(res["C"]), doc
    assert res["D"] == "OK", doc
    assert doc["replica"]["upstream"] == "follow", doc
    assert doc["leader"] == {"sessions": doc["replica"]["sessions"], "events": doc["replica"]["events"]}, doc
