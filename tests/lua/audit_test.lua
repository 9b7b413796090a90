#!/usr/bin/env tarantool
-- The operators' audit log (smartcache.audit): append-only, numbered without gaps, read after a
-- cursor, refused where this instance may not write, kept SC_AUDIT_RETENTION_DAYS (never the newest).
-- Runnable alone: `tarantool tests/lua/audit_test.lua`.
local tap = require('tap')
local helper = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'helper.lua')
helper.start()
local util = require('smartcache.util')
local audit = require('smartcache.audit')
local F = require('smartcache.schema').F.audit

local test = tap.test('audit')
test:plan(6)

test:test('an entry is written with its time and read back after a cursor, oldest first', function(t)
    t:plan(7)
    local a = sc.audit_write(nil, 'operator@host', 'cluster.switchover', 'tarantool-3:3301', 'patching host 1',
                             {phase = 'start'})
    local b = sc.audit_write(nil, 'token:3f9a0c1d2e4b', 'console.reveal', 'hn4ocuo2mlvhg7cu3bqos4p2klm',
                             'ticket 4711')
    t:is_deeply({a.status, b.status, b.seq}, {'OK', 'OK', a.seq + 1}, 'numbered one after the other')
    t:ok(math.abs(a.time_ms - util.now_ms()) < 5000, 'on this instance\'s clock')
    local r = sc.audit_read(nil, a.seq - 1, 10)
    t:is(#r.entries, 2, 'both read')
    t:is_deeply(r.entries[1], {seq = a.seq, time_ms = a.time_ms, who = 'operator@host', action = 'cluster.switchover',
        target = 'tarantool-3:3301', reason = 'patching host 1', details = {phase = 'start'}}, 'as written')
    t:is_deeply({r.entries[2].target, r.entries[2].reason, r.entries[2].details}, {'hn4ocuo2mlvhg7cu3bqos4p2klm',
        'ticket 4711', nil}, 'no details: none')
    t:is_deeply({r.last_seq, r.head_seq}, {b.seq, b.seq}, 'the cursor to go on from, and the newest')
    r = sc.audit_read(nil, b.seq, 10)
    t:is_deeply({#r.entries, r.last_seq}, {0, b.seq}, 'nothing after the newest: the cursor stays')
end)

test:test('a read pages by limit', function(t)
    t:plan(3)
    local first = audit.head()
    for i = 1, 5 do
        sc.audit_write(nil, 'ops', 'cluster.move', 'bucket ' .. i, 'rebalance')
    end
    local r = sc.audit_read(nil, first, 2)
    t:is_deeply({#r.entries, r.last_seq}, {2, first + 2}, 'two, and the cursor after them')
    r = sc.audit_read(nil, r.last_seq, 1000)
    t:is_deeply({#r.entries, r.entries[1].seq}, {3, first + 3}, 'the rest from the cursor')
    t:is(sc.audit_read(nil, 0, 1001).status, 'BAD_REQUEST', 'limit at most 1000')
end)

test:test('bad entries are BAD_REQUEST and write nothing', function(t)
    t:plan(6)
    local head = audit.head()
    t:is(sc.audit_write(nil, '', 'cluster.move').status, 'BAD_REQUEST', 'who is required')
    t:is(sc.audit_write(nil, 'ops', 'no spaces allowed').status, 'BAD_REQUEST', 'action: letters, digits, . _ -')
    t:is(sc.audit_write(nil, 'ops', 'x', nil, string.rep('r', 1025)).status, 'BAD_REQUEST', 'a reason over 1 KiB')
    t:is(sc.audit_write(nil, 'ops', 'x', nil, nil, {1, 2}).status, 'BAD_REQUEST', 'details must be a map')
    t:is(sc.audit_read(nil, -1).status, 'BAD_REQUEST', 'after_seq below 0')
    t:is(audit.head(), head, 'nothing written')
end)

test:test('where this instance may not write: NOT_LEADER, nothing written; reads still answer', function(t)
    t:plan(3)
    local head = audit.head()
    local original = util.set_writable(function() return false end)
    local r = sc.audit_write(nil, 'ops', 'cluster.rejoin', 'x', 'y')
    local read = sc.audit_read(nil, 0, 1)
    util.set_writable(original)
    t:is(r.status, 'NOT_LEADER', 'NOT_LEADER')
    t:is(audit.head(), head, 'nothing written')
    t:is(read.status, 'OK', 'a read answers')
end)

test:test('the retention drops entries older than SC_AUDIT_RETENTION_DAYS, never the newest', function(t)
    t:plan(4)
    local day = 86400 * 1000
    local old = audit.retention_days * day + day
    for _, e in box.space.audit:pairs() do
        box.space.audit:update(e[F.seq], {{'-', F.time_ms, old}})  -- every entry so far: a day past it
    end
    local newest, before = audit.head(), box.space.audit:len()
    t:is(audit.sweep_once(), before - 1, 'the old entries dropped (' .. (before - 1) .. ')')
    t:is_deeply({box.space.audit:len(), audit.head()}, {1, newest}, 'the newest kept, however old')
    local r = sc.audit_write(nil, 'ops', 'cluster.drain', 's2', 'decommission')
    t:is(r.seq, newest + 1, 'the sequence goes on from it')
    t:is_deeply({audit.sweep_once(), box.space.audit:len()}, {1, 1}, 'then the old one goes, the new one stays')
end)

test:test('operators only; the service never writes one', function(t)
    t:plan(2)
    local api = require('smartcache.api')
    t:ok(api.OPERATOR_ONLY['sc.audit_write'] and api.OPERATOR_ONLY['sc.audit_read'], 'both operators only')
    box.session.su('admin')
    local granted = box.space._priv:select({})
    local service_role = box.space._user.index.name:get(api.ROLE)[1]
    local fn = box.space._func.index.name:get('sc.audit_write')[1]
    local found = false
    for _, p in ipairs(granted) do
        found = found or (p[2] == service_role and p[3] == 'function' and p[4] == fn)
    end
    t:ok(not found, 'no execute right of the service\'s role on sc.audit_write')
end)

helper.finish(test)
