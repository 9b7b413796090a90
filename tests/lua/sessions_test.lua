#!/usr/bin/env tarantool
local tap = require('tap')
local fiber = require('fiber')
local helper = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'helper.lua')
helper.start()
local F = require('smartcache.schema').F.sessions

local test = tap.test('sessions')
test:plan(13)

local SID = '6f1c2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b'

test:test('create then get returns the data', function(t)
    t:plan(6)
    local r = sc.session_create(nil, SID, 'client-1', '5.2', 60, {step = 1})
    t:is(r.status, 'OK', 'created')
    t:is(r.rev, 1, 'rev starts at 1')
    t:is(sc.session_create(nil, SID, 'client-1', nil, nil, nil).status, 'ALREADY_EXISTS', 'second create refused')
    r = sc.session_get(nil, SID)
    t:is(r.status, 'OK', 'found')
    t:is(r.client_id, 'client-1', 'client id')
    t:is(r.data.step, 1, 'data')
end)

test:test('a session created without an id gets a fresh version 4 UUID', function(t)
    t:plan(5)
    local uuid = require('uuid')
    local ids, bad, repeated, n = {}, 0, 0, 600  -- more than one 4 KiB pool of random bytes (256 ids)
    for _ = 1, n do
        local id = require('smartcache.util').uuid()
        local parsed = uuid.fromstr(id)
        local variant = id:sub(20, 20)
        if parsed == nil or parsed:str() ~= id or id:sub(15, 15) ~= '4' or not ('89ab'):find(variant, 1, true) then
            bad = bad + 1
        end
        if ids[id] then
            repeated = repeated + 1
        end
        ids[id] = true
    end
    t:is(bad, 0, 'each one canonical lowercase text of a version 4, RFC 4122 variant UUID')
    t:is(repeated, 0, 'no id repeats across pool refills')
    local r = sc.session_create(nil, nil, 'client-uuid', nil, 60, nil)
    t:is(r.status, 'OK', 'created')
    t:ok(uuid.fromstr(r.session_id) ~= nil, 'session_id is a UUID')
    t:is(sc.session_get(nil, r.session_id).client_id, 'client-uuid', 'found under it')
end)

test:test('util.insert and util.replace write like space:insert and space:replace', function(t)
    t:plan(8)
    local util = require('smartcache.util')
    local s = box.schema.space.create('util_write_test', {if_not_exists = true})
    s:create_index('primary', {if_not_exists = true})
    s:truncate()
    local n = 3000  -- enough for LuaJIT to compile the loop and the FFI call in it
    box.begin()
    for i = 1, n do
        util.insert(s, {i, 'a', {nested = {i, 2}}})
    end
    box.commit()
    t:is(s:len(), n, 'every write of a hot loop in a transaction is there')
    t:is_deeply(s:get(7):totable(), {7, 'a', {nested = {7, 2}}}, 'written as given')
    box.begin()
    local ok, err = pcall(util.insert, s, {1, 'b'})
    box.commit()
    t:ok(not ok and type(err) == 'cdata' and err.code == box.error.TUPLE_FOUND, 'a duplicate raises the box error')
    box.begin()
    util.replace(s, {1, 'c'})
    box.commit()
    t:is(s:get(1)[2], 'c', 'replaced')
    box.begin()
    util.insert(s, {n + 1, 'x'})
    box.rollback()
    t:is(s:get(n + 1), nil, 'rolled back with its transaction')
    util.insert(s, {n + 2, 'autocommit'})  -- outside a transaction: space:insert (a commit yields)
    t:is(s:get(n + 2)[2], 'autocommit', 'an autocommit write is written too')
    -- A space with a Lua trigger, registered as smartcache.quorum registers the spaces it guards:
    -- the trigger must not run inside an FFI call, so these writes take space:insert.
    local fired = 0
    s:on_replace(function() fired = fired + 1 end)
    util.register_lua_trigger(s)
    box.begin()
    for i = 1, n do
        util.replace(s, {i, 'd'})
    end
    box.commit()
    t:is(fired, n, 'the Lua trigger ran for each write of a hot loop')
    t:is(s:get(n)[2], 'd', 'and each was written')
    util.register_lua_trigger(s, false)
    s:drop()
end)

test:test('bad arguments are BAD_REQUEST, not errors', function(t)
    t:plan(3)
    t:is(sc.session_create(nil, SID .. 'x', 42).status, 'BAD_REQUEST', 'client id must be a string')
    t:is(sc.session_create(nil, 'x', 'c', nil, -5).status, 'BAD_REQUEST', 'negative ttl')
    t:is(sc.session_list(nil, nil).status, 'BAD_REQUEST', 'list needs a client')
end)

test:test('get slides the deadline', function(t)
    t:plan(2)
    local sid = helper.session()
    helper.age('sessions', F.expires_at, 50 * 1000, {F.updated_at})
    local before = box.space.sessions:get(sid)[F.expires_at]
    local r = sc.session_get(nil, sid)
    t:ok(box.space.sessions:get(sid)[F.expires_at] > before + 40 * 1000, 'deadline pushed to now + ttl')
    t:ok(r.expires_in_ms > 59 * 1000, 'expires_in_ms is the full ttl again')
end)

test:test('reads within the refresh granularity write nothing', function(t)
    t:plan(2)
    local id = 'aaaaaaaa-0000-4000-8000-0000000000ff'
    sc.session_create(nil, id, 'client-g', nil, 60, 'x')
    local lsn = box.info.lsn
    t:is(sc.session_get(nil, id).status, 'OK', 'read')
    t:is(box.info.lsn, lsn, 'no WAL write for a read right after a write')
end)

test:test('an expired session is invisible before the sweeper runs', function(t)
    t:plan(5)
    local id = 'aaaaaaaa-0000-4000-8000-000000000001'
    require('smartcache.expiry').paused = true
    sc.session_create(nil, id, 'client-2', nil, 1, 'x')
    -- Move the deadline just into the past, keeping the sweeper asleep long enough to look.
    box.space.sessions:update(id, {{'=', F.expires_at, require('smartcache.util').now_ms() - 1}})
    t:ok(box.space.sessions:get(id) ~= nil, 'tuple still stored')
    t:is(sc.session_get(nil, id).status, 'NOT_FOUND', 'get says NOT_FOUND')
    t:is(sc.session_touch(nil, id).status, 'NOT_FOUND', 'touch says NOT_FOUND')
    t:is(sc.session_update(nil, id, 'y').status, 'NOT_FOUND', 'update says NOT_FOUND')
    t:is(#sc.session_list(nil, 'client-2').sessions, 0, 'not listed')
    require('smartcache.expiry').paused = false
end)

test:test('touch refreshes without reading', function(t)
    t:plan(2)
    local sid = helper.session()
    local r = sc.session_touch(nil, sid)
    t:is(r.status, 'OK', 'touched')
    t:is(sc.session_touch(nil, 'no-such').status, 'NOT_FOUND', 'missing')
end)

test:test('update with compare-and-set', function(t)
    t:plan(6)
    local sid = helper.session(nil, {step = 1})
    local r = sc.session_update(nil, sid, {step = 2}, 1)
    t:is(r.status, 'OK', 'expected rev 1 matches')
    t:is(r.rev, 2, 'rev is now 2')
    r = sc.session_update(nil, sid, {step = 3}, 1)
    t:is(r.status, 'CONFLICT', 'stale expected rev conflicts')
    t:is(r.rev, 2, 'conflict reports the current rev')
    t:is(sc.session_get(nil, sid).data.step, 2, 'conflicting update changed nothing')
    t:is(sc.session_update(nil, sid, {step = 4}).rev, 3, 'update without expected rev always applies')
end)

test:test('delete cascades to the session cache', function(t)
    t:plan(5)
    local sid = helper.session()
    t:is(sc.cache_put(nil, sid, 'k1', 1, 60, 'v1').status, 'OK', 'cache put 1')
    t:is(sc.cache_put(nil, sid, 'k2', 1, 60, 'v2').status, 'OK', 'cache put 2')
    local r = sc.session_delete(nil, sid)
    t:is(r.status, 'OK', 'deleted')
    t:is(r.cache_deleted, 2, 'two cache entries went with it')
    t:is(box.space.cache.index.primary:count({sid}), 0, 'no cache entries left')
end)

test:test('list returns a client live sessions only', function(t)
    t:plan(2)
    for i = 1, 3 do
        sc.session_create(nil, 'bbbbbbbb-0000-4000-8000-00000000000' .. i, 'client-3', 'v', 60, i)
    end
    sc.session_create(nil, 'bbbbbbbb-0000-4000-8000-000000000009', 'client-4', 'v', 60, 9)
    local r = sc.session_list(nil, 'client-3')
    t:is(#r.sessions, 3, 'three sessions')
    t:is(r.sessions[1].version, 'v', 'with their fields')
end)

test:test('the sweeper removes expired sessions and their cache', function(t)
    t:plan(3)
    local id = 'cccccccc-0000-4000-8000-000000000001'
    sc.session_create(nil, id, 'client-5', nil, 60, 'x')
    sc.cache_put(nil, id, 'k', 0, 60, 'v')
    local expiry = require('smartcache.expiry')
    local before = expiry.expired.sessions
    box.space.sessions:update(id, {{'=', F.expires_at, 1}})
    -- The delete is visible before its WAL write returns; the sweeper counts it after: wait for both.
    local deadline = fiber.clock() + 5
    while (box.space.sessions:get(id) ~= nil or expiry.expired.sessions == before) and fiber.clock() < deadline do
        fiber.sleep(0.05)
    end
    t:is(box.space.sessions:get(id), nil, 'session swept')
    t:is(box.space.cache:get({id, 'k'}), nil, 'its cache swept with it')
    t:ok(expiry.expired.sessions > before, 'counted')
end)

test:test('a new session wakes the sweeper that sleeps past its deadline', function(t)
    t:plan(3)
    local config = require('smartcache.config')
    local expiry = require('smartcache.expiry')
    local max_sleep = config.sweep_max_sleep_s
    config.sweep_max_sleep_s = 30
    fiber.sleep(max_sleep + 0.1)  -- its nap of the old length ends: it sleeps up to 30 s now
    local id = 'cccccccc-0000-4000-8000-000000000002'
    local before = expiry.expired.sessions
    local created = fiber.clock()
    sc.session_create(nil, id, 'client-6', nil, 1, 'x')
    local deadline = created + 5
    while box.space.sessions:get(id) ~= nil and fiber.clock() < deadline do
        fiber.sleep(0.01)
    end
    local took = fiber.clock() - created
    -- The delete is visible before its WAL write returns; the sweeper counts it after.
    while expiry.expired.sessions == before and fiber.clock() < deadline do
        fiber.sleep(0.01)
    end
    config.sweep_max_sleep_s = max_sleep
    t:is(box.space.sessions:get(id), nil, 'swept')
    t:ok(took >= 0.99 and took < 1.3, string.format('at its deadline (%.2f s after it was created)', took))
    t:ok(expiry.expired.sessions > before, 'counted')
end)

helper.finish(test)
