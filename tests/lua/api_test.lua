#!/usr/bin/env tarantool
-- The calling convention of sc.*: deadlines, NOT_LEADER, idempotency keys.
local tap = require('tap')
local fiber = require('fiber')
local helper = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'helper.lua')
helper.start()
local schema = require('smartcache.schema')
local util = require('smartcache.util')

local test = tap.test('api')
test:plan(10)

local function new_session(client)
    return sc.session_create(nil, nil, client or 'client-api', nil, 60, {n = 0}).session_id
end

test:test('a procedure past its deadline does nothing', function(t)
    t:plan(3)
    local before = box.space.sessions:len()
    local past = {deadline_ms = util.now_ms() - 1}
    t:is(sc.session_create(past, nil, 'client-late', nil, 60, nil).status, 'DEADLINE_EXCEEDED', 'write refused')
    t:is(box.space.sessions:len(), before, 'nothing written')
    t:is(sc.session_get(past, 'aaaaaaaa-0000-4000-8000-000000000000').status, 'DEADLINE_EXCEEDED', 'read refused')
end)

test:test('a deadline in the future lets the procedure run', function(t)
    t:plan(1)
    local meta = {deadline_ms = util.now_ms() + 10000}
    t:is(sc.session_create(meta, nil, 'client-on-time', nil, 60, nil).status, 'OK', 'created')
end)

test:test('writes answer NOT_LEADER and do nothing while the instance may not write', function(t)
    t:plan(4)
    local sid = new_session()
    local original = util.set_writable(function() return false end)
    local before = box.space.sessions:len()
    t:is(sc.session_create(nil, nil, 'client-x', nil, 60, nil).status, 'NOT_LEADER', 'create refused')
    t:is(sc.session_update(nil, sid, {n = 1}).status, 'NOT_LEADER', 'update refused')
    t:is(box.space.sessions:len(), before, 'nothing written')
    local r = sc.session_get(nil, sid)
    util.set_writable(original)
    t:is(r.status, 'OK', 'reads still answer')
end)

test:test('a repeated write under one idempotency key is applied once', function(t)
    t:plan(6)
    local sid = new_session()
    local meta = {idempotency_key = 'update-1-' .. sid}
    local first = sc.session_update(meta, sid, {n = 1})
    local again = sc.session_update(meta, sid, {n = 1})
    t:is(first.status, 'OK', 'first applied')
    t:is(first.rev, 2, 'rev 2')
    t:is(again.rev, 2, 'the repeat answers the same revision')
    t:is(again.replayed, true, 'marked as a replay')
    t:is(first.replayed, nil, 'the first is not')
    t:is(sc.session_get(nil, sid).rev, 2, 'stored revision moved once')
end)

test:test('a create repeated under one key returns the same session', function(t)
    t:plan(3)
    local meta = {idempotency_key = 'create-1'}
    local before = box.space.sessions:len()
    local a = sc.session_create(meta, nil, 'client-idem', nil, 60, nil)
    local b = sc.session_create(meta, nil, 'client-idem', nil, 60, nil)
    t:is(a.session_id, b.session_id, 'same id')
    t:is(box.space.sessions:len(), before + 1, 'one session')
    t:is(b.replayed, true, 'replayed')
end)

test:test('a key reused for another request, or malformed, is BAD_REQUEST', function(t)
    t:plan(4)
    local sid = new_session()
    local meta = {idempotency_key = 'reuse-' .. sid}
    t:is(sc.session_update(meta, sid, {n = 1}).status, 'OK', 'first use')
    local r = sc.session_update(meta, sid, {n = 2})
    t:is(r.status, 'BAD_REQUEST', 'other arguments')
    t:is(sc.session_get(nil, sid).data.n, 1, 'not applied')
    t:is(sc.cache_put({idempotency_key = string.rep('k', 65)}, '', 'k', 0, 60, 1).status, 'BAD_REQUEST',
         'a key over 64 bytes')
end)

test:test('a refusal under a key is not stored: a repeat answers what is true now', function(t)
    t:plan(7)
    local meta = {idempotency_key = 'refused-cas'}
    local r = sc.counter_cas(meta, 'c-refused', 5, 6)
    t:is_deeply({r.status, r.value}, {'CONFLICT', 0}, 'refused: the counter is 0')
    t:is(box.space.idempotency:get('refused-cas'), nil, 'nothing stored under the key')
    sc.counter_cas(nil, 'c-refused', 0, 5)
    r = sc.counter_cas(meta, 'c-refused', 5, 6)
    t:is_deeply({r.status, r.value, r.replayed}, {'OK', 6, nil}, 'the repeat is applied, not the stale CONFLICT')
    r = sc.counter_cas(meta, 'c-refused', 5, 6)
    t:is_deeply({r.status, r.value, r.replayed}, {'OK', 6, true}, 'the applied one is stored and replayed')
    meta = {idempotency_key = 'refused-bad'}
    t:is(sc.latch_create(meta, 'l-refused', 0).status, 'BAD_REQUEST', 'count 0 refused')
    t:is(sc.latch_create(meta, 'l-refused', 2).status, 'OK', 'the corrected request under the same key is applied')
    t:is(sc.latch_create(meta, 'l-refused', 2).replayed, true, 'and replayed')
end)

test:test('keys expire and are swept', function(t)
    t:plan(2)
    sc.cache_put({idempotency_key = 'short-lived'}, '', 'k', 0, 60, 1)
    t:ok(box.space.idempotency:get('short-lived') ~= nil, 'stored')
    box.space.idempotency:update('short-lived', {{'=', schema.F.idempotency.expires_at, 1}})
    local deadline = fiber.clock() + 5
    while box.space.idempotency:get('short-lived') ~= nil and fiber.clock() < deadline do
        fiber.sleep(0.05)
    end
    t:is(box.space.idempotency:get('short-lived'), nil, 'swept')
end)

test:test('a read whose refresh cannot be written answers the data with refresh_failed', function(t)
    t:plan(4)
    local sid = new_session()
    -- past a tenth of its TTL: a read would refresh it (smartcache.sessions refresh_after_ms)
    helper.age('sessions', schema.F.sessions.expires_at, 30000, {schema.F.sessions.updated_at})
    local original = util.set_writable(function() return false end)
    local r = sc.session_get(nil, sid)
    util.set_writable(original)
    t:is(r.status, 'OK', 'answered')
    t:is(r.refresh_failed, true, 'flagged: the deadline did not move')
    t:is(r.data.n, 0, 'with the data')
    r = sc.session_get(nil, sid)
    t:is(r.refresh_failed, nil, 'no flag once the refresh works')
end)

test:test('sc.role before the failover is set up: standalone without SC_ETCD, starting in HA mode', function(t)
    t:plan(4)
    local config = require('smartcache.config')
    local role = require('smartcache.failover.procedures').role
    local saved = config.ha
    config.ha = nil
    local r = role(nil)
    t:is(r.role, 'standalone', 'no SC_ETCD: standalone')
    t:is(r.writable, true, 'and writable as its box is')
    config.ha = {cluster = 'test'}  -- HA mode, answering before failover.start (an instance joining the leader)
    r = role(nil)
    config.ha = saved
    t:is(r.role, 'starting', 'HA mode: starting')
    t:ok(r.writable == false and r.leader_uuid == nil, 'never taken for a leader')
end)

helper.finish(test)
