#!/usr/bin/env tarantool
-- smartcache.quorum: guarded spaces' writes are synchronous through sc_quorum,
-- which stays empty. A quorum of 2 with no replica makes every synchronous
-- commit time out, so a guarded write must fail and leave nothing behind.
-- Runnable alone: `tarantool tests/lua/quorum_test.lua`.
local tap = require('tap')
local fio = require('fio')

local here = fio.dirname(fio.abspath(debug.getinfo(1, 'S').source:sub(2)))
package.path = fio.pathjoin(here, '..', '..', 'lua') .. '/?.lua;' .. package.path  -- tests/lua -> lua/
local helper = dofile(fio.pathjoin(here, 'helper.lua'))
local quorum = require('smartcache.quorum')

helper.start()
quorum.enable(true)
quorum.guard_all()

local test = tap.test('quorum')
test:plan(10)

local function without_quorum(fn)
    box.cfg({replication_synchro_quorum = 2, replication_synchro_timeout = 0.2})
    local ok, err = pcall(fn)
    box.cfg({replication_synchro_quorum = 1})
    return ok, err
end

test:test('every guarded space is guarded, the cache and prewarm too; sc_meta is not', function(t)
    t:plan(2 * #quorum.GUARDED + 4)
    local util = require('smartcache.util')
    for _, name in ipairs(quorum.GUARDED) do
        t:ok(quorum.is_guarded(box.space[name]), name .. ' guarded')
        -- Its Lua trigger must not run inside an FFI call: util.insert/replace take space:insert.
        t:ok(util.has_lua_trigger(box.space[name]), name .. ' known to util as Lua-triggered')
    end
    -- On 2.6.0 an asynchronous write of the leader that meets synchronous ones in the limbo gets
    -- stuck there and rolls back confirmed writes when it times out (smartcache.quorum, GUARDED).
    t:ok(quorum.is_guarded(box.space.cache), 'cache guarded')
    t:ok(quorum.is_guarded(box.space.prewarm), 'prewarm guarded')
    t:ok(not quorum.is_guarded(box.space.sc_meta), 'sc_meta not guarded')
    t:is(box.space.sessions.is_sync, false, 'no data space is synchronous itself')
end)

test:test('a guarded write without its quorum rolls back, with the rest of its transaction', function(t)
    t:plan(5)
    local before = box.space.sessions:len()
    local ok, err = without_quorum(function()
        box.atomic(function()
            box.space.counters:replace({'q-test', 1, 1, 0, 0})
            _G.sc.session_create(nil, nil, 'client-q', nil, 60, {})
        end)
    end)
    t:ok(not ok, 'the commit failed')
    t:like(tostring(err), 'Quorum collection', 'for want of a quorum')
    t:is(box.space.sessions:len(), before, 'no session left behind')
    t:is(box.space.counters:get('q-test'), nil, 'nor the counter')
    t:is(box.space.sc_quorum:len(), 0, 'sc_quorum is empty')
end)

test:test('a compare-and-set waits for a pending write of its key: no CONFLICT against a write that rolls back',
    function(t)
    t:plan(3)
    local fiber = require('fiber')
    local id = helper.session('client-cas', {n = 0})
    local rev0 = _G.sc.session_get(nil, id).rev
    box.cfg({replication_synchro_quorum = 2, replication_synchro_timeout = 0.3})  -- no replica: A rolls back
    local a_done, b_res, b_after_a = false, nil, nil
    local a = fiber.new(function()
        pcall(_G.sc.session_update, nil, id, {n = 1})
        a_done = true
    end)
    a:set_joinable(true)
    fiber.yield()  -- A waits for its quorum: rev0 + 1 is in the space, not committed
    local b = fiber.new(function()
        local ok, r = pcall(_G.sc.session_update, nil, id, {n = 2}, rev0)
        b_after_a = a_done
        b_res = ok and r.status or tostring(r)
    end)
    b:set_joinable(true)
    a:join()
    b:join()
    box.cfg({replication_synchro_quorum = 1})
    t:ok(b_after_a, 'B answered only once A had ended')
    t:isnt(b_res, 'CONFLICT', 'B compared with the committed revision, not with A rolled back: ' .. tostring(b_res))
    t:is(_G.sc.session_get(nil, id).rev, rev0, 'neither is applied (no quorum)')
end)

test:test('a write that finds nothing to change writes nothing to the WAL (no asynchronous row)', function(t)
    -- Tarantool writes a delete or an update of a missing key to the WAL and fires no trigger:
    -- an asynchronous row, which behind synchronous ones in the limbo is 2.6.0's
    -- ASYNC_BEHIND_SYNC_ROLLS_BACK (the fault suite's fuzz mix deleted cache keys that were not there).
    local sid = require('uuid').str()
    local handle = require('smartcache.sessions').handle(sid)
    local live = helper.session('client-nowal')
    local bound = require('smartcache.util').uuid()
    local digest = require('digest')
    _G.sc.session_create(nil, bound, 'client-nowal', nil, 60, nil, nil, nil, nil, nil, digest.sha256_hex('a'))
    local other = digest.sha256_hex('b')
    _G.sc.session_key_check(nil, 'edbffad44be25c45')
    local calls = {
        {'cache_delete', sid, 'no-such-key'},
        {'cache_delete', '', 'no-such-key'},
        {'cache_delete', live, 'no-such-key'},
        {'cache_put', sid, 'k', 0, 60, 1},
        {'session_delete', sid},
        {'session_delete', nil, nil, handle, 'client-nowal'},
        {'session_delete', nil, nil, require('smartcache.sessions').handle(live), 'client-another'},
        {'session_touch', sid},
        {'session_update', sid, {x = 1}},
        {'session_rotate', sid},
        {'session_rotate', sid, require('smartcache.util').uuid(), 5000},
        {'session_rekey', sid, require('smartcache.util').uuid()},
        {'session_rekey', live, require('smartcache.util').uuid()},  -- stored-keyed: never renamed
        {'session_key_check', 'edbffad44be25c45'},
        {'session_key_check', '282a57a80ded0fdb'},  -- another key's id: MISMATCH
        {'session_create', bound, 'client-nowal'},  -- ALREADY_EXISTS
        {'semaphore_renew', 'no-such-sem', 'holder', 1000},
        {'semaphore_release', 'no-such-sem', 'holder'},
        {'queue_ack', 'no-such-queue', 1},
        {'queue_release', 'no-such-queue', 1},
        {'latch_count_down', 'no-such-latch', 1},
        {'prewarm_complete', 'no-such-client', 1, 'owner', {}},
        {'prewarm_fail', 'no-such-client', 1, 'owner'},
    }
    -- A bound session refused for its binding writes its event and nothing else (its own row).
    local mismatch = {
        {'session_get', bound, other}, {'session_touch', bound, other},
        {'session_update', bound, {x = 1}, nil, nil, nil, nil, other}, {'session_rotate', bound, sid, 0, other},
        {'session_delete', bound, other}, {'cache_put', bound, 'k', 0, 60, 1, other},
        {'cache_delete', bound, 'k', other},
    }
    t:plan(#calls + #mismatch)
    for _, c in ipairs(mismatch) do
        local msgpack = require('msgpack')
        local before, row = box.info.lsn, msgpack.encode(box.space.sessions:get(bound))
        local r = _G.sc[c[1]](nil, unpack(c, 2, 8))
        t:ok(r.status == 'BINDING_MISMATCH' and box.info.lsn - before <= 3
             and msgpack.encode(box.space.sessions:get(bound)) == row,
             string.format('%s with another binding: its event only (%s, %d rows)', c[1], r.status,
                           box.info.lsn - before))
    end
    for _, c in ipairs(calls) do
        local before = box.info.lsn
        local ok, r = pcall(_G.sc[c[1]], nil, unpack(c, 2))
        local status = ok and type(r) == 'table' and r.status or tostring(r)
        t:is(box.info.lsn, before, string.format('%s of what is not there (%s): no WAL row', c[1], status))
    end
end)

test:test('a write of an unguarded space commits without a quorum', function(t)
    t:plan(2)
    local ok = without_quorum(function()
        box.space.sc_meta:replace({'quorum-test', 1})
    end)
    t:ok(ok, 'committed')
    t:is(box.space.sc_meta:get('quorum-test')[2], 1, 'and is there')
    box.space.sc_meta:delete('quorum-test')
end)

test:test('with its quorum a guarded write commits and sc_quorum stays empty', function(t)
    t:plan(3)
    local r = _G.sc.session_create(nil, nil, 'client-q', nil, 60, {})
    t:is(r.status, 'OK', 'created')
    t:ok(box.space.sessions:get(r.session_id) ~= nil, 'stored')
    t:is(box.space.sc_quorum:len(), 0, 'sc_quorum is empty')
end)

test:test('a space created later under a watched name is guarded once its creation commits', function(t)
    t:plan(3)
    quorum.watch_new_spaces(function(name)
        return name == 'quorum_watched'
    end)
    local s = box.schema.space.create('quorum_watched')
    s:create_index('primary')
    t:ok(quorum.is_guarded(box.space.quorum_watched), 'guarded')
    t:ok(not without_quorum(function()
        box.space.quorum_watched:replace({1})
    end), 'its write needs a quorum')
    t:is(box.space.quorum_watched:len(), 0, 'and rolled back without one')
    box.space.quorum_watched:drop()
end)

test:test('a read of a key whose write waits for its quorum waits for the outcome (no dirty read)', function(t)
    t:plan(6)
    local fiber = require('fiber')
    local sid = helper.session('client-dirty')
    local other = helper.session('client-dirty')
    box.cfg({replication_synchro_quorum = 2, replication_synchro_timeout = 0.5})
    local writer = fiber.new(function()
        return _G.sc.session_update(nil, sid, 'dirty', nil, nil)
    end)
    writer:set_joinable(true)
    fiber.yield()
    local F = require('smartcache.schema').F.sessions
    t:is(box.space.sessions:get(sid)[F.data], 'dirty', 'the write is in the space already (2.6: no MVCC)')
    local t0 = fiber.clock()
    local near = _G.sc.session_get(nil, other)
    t:ok(fiber.clock() - t0 < 0.3, 'a read of another key does not wait')
    t:is(near.status, 'OK', 'and answers')
    local got = _G.sc.session_get(nil, sid)
    t:ok(fiber.clock() - t0 >= 0.4, 'the read of that key waited for the outcome')
    local _, res = writer:join()
    box.cfg({replication_synchro_quorum = 1})
    t:ok(res == nil or res.status ~= 'OK', 'the write rolled back')
    t:isnt(got.data, 'dirty', 'and the read never saw it')
end)

test:test('a cache write without its quorum rolls back', function(t)
    t:plan(3)
    local ok, err = without_quorum(function()
        return _G.sc.cache_put(nil, '', 'q-cache', nil, 60, 'v')
    end)
    t:ok(not ok, 'the commit failed')
    t:like(tostring(err), 'Quorum collection', 'for want of a quorum')
    t:is(box.space.cache:get({'', 'q-cache'}), nil, 'nothing left behind')
end)

test:test('our DDL is synchronous while synchronous writes are in flight, else not', function(t)
    t:plan(6)
    local fiber = require('fiber')
    local partitions = require('smartcache.events.partitions')
    local joined  -- did join() make the transaction synchronous (touch sc_quorum)?
    local function create(day)
        return pcall(box.atomic, function()
            local before = quorum.inflight
            quorum.join()
            joined = quorum.inflight > before
            partitions.create(day)
        end)
    end
    box.cfg({replication_synchro_quorum = 2, replication_synchro_timeout = 0.5})
    t:ok(create('20991230') and not joined, 'nothing in flight: asynchronous, created without a quorum')
    local f = fiber.new(function()
        pcall(box.space.counters.replace, box.space.counters, {'q-inflight', 1, 1, 0, 0})
    end)
    f:set_joinable(true)
    fiber.yield()
    t:ok(quorum.inflight > 0, 'a synchronous write in flight')
    local ok, err = create('20991231')
    t:ok(not ok and joined, 'then the DDL is synchronous too: ' .. tostring(err))
    f:join()
    box.cfg({replication_synchro_quorum = 1})
    t:is(box.space[partitions.PREFIX .. '20991231'], nil, 'and left nothing without its quorum')
    t:is(quorum.inflight, 0, 'nothing in flight once both ended')
    t:is(box.space.counters:get('q-inflight'), nil, 'the write rolled back')
    box.space[partitions.PREFIX .. '20991230']:drop()
end)

helper.finish(test)
