"""Tarantool 2.6.0's limbo and our writes: no asynchronous transaction may meet synchronous ones.

On 2.6.0 an asynchronous transaction committed on the leader while the limbo still holds synchronous
transactions that are acknowledged but not yet removed (their CONFIRM is being written) is queued behind
them and then nothing ever confirms it. After replication_synchro_timeout it "times out": the leader writes
ROLLBACK with lsn -1 (which rolls back nothing on the followers) and rolls back in its own memory every
transaction behind it, the already confirmed ones too (their callers get ER_WAL_IO, txn.c:876). The leader
then lacks rows its followers and its own WAL have; its next write of the same key stops the followers'
appliers (ER_TUPLE_FOUND). This is what the memtx-full fault scenario met (an events partition's sequence
number reused). smartcache.quorum therefore guards every space the leader writes, the cache included.

Two real instances on 127.0.0.1 (a leader with our modules, a plain replica), quorum 2, the interleaving
forced: A (a synchronous write) is acknowledged, and while its CONFIRM is being written B is committed; then
C, another synchronous write. B is an unguarded write (sc_meta: the control, which must show the bug, or the
test proves nothing) or a cache put through sc.cache_put (guarded: no divergence).
"""

from __future__ import annotations

import json
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
        replication_synchro_timeout = 1, memtx_memory = 64 * 1024 * 1024}
box.schema.user.grant('guest', 'read,write,execute,replication', 'universe', nil, {if_not_exists = true})
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

local function acked()
    local r = box.info.replication[rid]
    return r and r.downstream and r.downstream.vclock and r.downstream.vclock[box.info.id] or 0
end
local res
local function call(name, fn)
    local ok, r = pcall(fn)
    res[name] = ok and (type(r) == 'table' and r.status or 'OK') or tostring(r)
end
-- Up to 5 tries until B is committed in the window: A written (the LSN moved past it) and acknowledged
-- (the replica has every row we have: A's CONFIRM is not written yet) while A is still in the limbo (its
-- commit trigger, which runs once it has left the limbo, has not run). No yield between that check and
-- B's commit.
for attempt = 1, 5 do
    res = {attempt = attempt}
    local a_committed = false
    local lsn0 = box.info.lsn
    local a = fiber.new(call, 'A', function()
        return box.atomic(function()
            box.on_commit(function() a_committed = true end)
            return sc.session_create(nil, nil, 'client-a', nil, 600, {})
        end)
    end)
    a:set_joinable(true)
    local b = fiber.new(function()
        while res.A == nil do
            local lsn = box.info.lsn
            if lsn > lsn0 and not a_committed and acked() >= lsn then
                res.window = true
                if mode == 'raw' then
                    call('B', function() box.space.sc_meta:replace({'limbo-test', attempt}) end)
                else
                    call('B', function() return sc.cache_put(nil, '', 'limbo-test', nil, 600, 'v') end)
                end
                return
            end
            fiber.yield()
        end
        res.B = 'missed the window'
    end)
    b:set_joinable(true)
    fiber.sleep(0.05)
    local c = fiber.new(call, 'C', function() return sc.session_create(nil, nil, 'client-c', nil, 600, {}) end)
    c:set_joinable(true)
    a:join() b:join() c:join()
    if res.window then break end
end
fiber.sleep(0.5)
local function state(space_of)
    local events = 0
    for _, s in space_of._space:pairs() do
        if s[3]:match('^events_') then events = events + space_of[s[3]]:len() end
    end
    return {sessions = space_of.sessions:len(), cache = space_of.cache:len(),
            meta = space_of.sc_meta:get('limbo-test') ~= nil, events = events}
end
local conn = netbox.connect(replica_uri)
local replica = conn:eval([=[
    local events = 0
    for _, s in box.space._space:pairs() do
        if s[3]:match('^events_') then events = events + box.space[s[3]]:len() end
    end
    local up = box.info.replication[1].upstream
    return {sessions = box.space.sessions:len(), cache = box.space.cache:len(),
            meta = box.space.sc_meta:get('limbo-test') ~= nil, events = events, upstream = up and up.status}
]=])
local leader = state(box.space)
-- one more synchronous write: on a diverged replica it may collide with a row the leader lost
local d_ok = pcall(sc.session_create, nil, nil, 'client-d', nil, 600, {})
fiber.sleep(0.5)
local after = conn:eval('local up = box.info.replication[1].upstream return up and up.status or "none"')
conn:close()
print(require('json').encode({results = res, leader = leader, replica = replica, d_ok = d_ok,
                              upstream_after = after}))
os.exit(0)
"""

REPLICA = r"""
local master, listen, dir = arg[1], arg[2], arg[3]
box.cfg{listen = listen, replication = {master}, read_only = true, work_dir = dir, log = dir .. '/replica.log',
        replication_synchro_quorum = 2, replication_synchro_timeout = 1, memtx_memory = 64 * 1024 * 1024}
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


def test_control_an_unguarded_write_in_the_window_diverges_the_replica_on_2_6_0(tmp_path: Path) -> None:
    version = subprocess.run(["tarantool", "--version"], check=True, capture_output=True, text=True).stdout
    if not version.startswith("Tarantool 2.6.0"):
        pytest.skip("the limbo bug is Tarantool 2.6.0's")
    doc = _run(tmp_path, "raw")
    assert doc["results"]["window"] is True, doc  # B was committed while A was in the limbo
    assert doc["results"]["A"] == "OK"
    assert "timed out" in doc["results"]["B"], doc  # stuck in the limbo, nothing could confirm it
    assert doc["results"]["C"] == "Failed to write to disk", doc  # confirmed, then rolled back on the leader
    assert doc["leader"] != {k: v for k, v in doc["replica"].items() if k != "upstream"}, doc


def test_a_cache_put_in_the_window_is_synchronous_and_nothing_diverges(tmp_path: Path) -> None:
    doc = _run(tmp_path, "cache")
    assert doc["results"]["window"] is True, doc  # B was committed while A was in the limbo
    assert (doc["results"]["A"], doc["results"]["B"], doc["results"]["C"]) == ("OK", "OK", "OK"), doc
    assert doc["leader"] == {k: v for k, v in doc["replica"].items() if k != "upstream"}, doc
    assert doc["replica"]["upstream"] == "follow", doc
    assert doc["d_ok"] is True, doc
    assert doc["upstream_after"] == "follow", doc
