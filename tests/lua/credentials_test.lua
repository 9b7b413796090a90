#!/usr/bin/env tarantool
-- Sessions as credentials (issue 37, PROTOCOL.md revision 11), storage's side: stored ids given by
-- the service, the absolute lifetime, rotation with a grace window, binding, SESSION_DELETE by
-- handle, the session key's id, the rekey of raw-keyed rows of before.
-- Runnable alone: `tarantool tests/lua/credentials_test.lua`.
local tap = require('tap')
local digest = require('digest')
local fiber = require('fiber')
local helper = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'helper.lua')
helper.start()
local util = require('smartcache.util')
local config = require('smartcache.config')
local expiry = require('smartcache.expiry')
local schema = require('smartcache.schema')
local F = schema.F.sessions
local FR = schema.F.rotations

local uuid = util.uuid
local handle = helper.handle

local test = tap.test('credentials')
test:plan(16)

-- Events of a topic written since seq.
local function events_since(seq, topic)
    return sc.events_read(nil, seq, {topic}, 1000, 0).events
end

local function head()
    return sc.events_read(nil, nil, nil, 1, 0).head_seq
end

-- A session's binding as the service sends it: the SHA-256 of the value, hex.
local function bound_to(value)
    return digest.sha256_hex(value)
end

-- Shift a session's times back by ms (as if created and last refreshed that long ago).
local function age_session(id, ms)
    local t = box.space.sessions:get(id)
    local ops = {{'-', F.updated_at, ms}, {'-', F.expires_at, ms}, {'-', F.created_at, ms}}
    if t[F.absolute_at] ~= nil then
        table.insert(ops, {'-', F.absolute_at, ms})
    end
    box.space.sessions:update(id, ops)
end

test:test('a session is created under the stored id the service gives, canonical UUID text', function(t)
    t:plan(7)
    local id = uuid()
    local r = sc.session_create(nil, id, 'client-c1', nil, 60, {a = 1})
    t:is_deeply({r.status, r.session_id, r.handle}, {'OK', nil, handle(id)}, 'OK, its handle, no id answered')
    t:is(box.space.sessions:get(id)[F.stored], true, 'marked as a stored id')
    t:is(sc.session_create(nil, id:upper(), 'client-c1').status, 'BAD_REQUEST', 'upper case: not canonical')
    t:is(sc.session_create(nil, 'x', 'client-c1').status, 'BAD_REQUEST', 'not a UUID')
    t:is(sc.session_create(nil, id, 'client-c1').status, 'ALREADY_EXISTS', 'the same id twice')
    -- A service of revision 10 during a rolling upgrade (storage first) still creates without an id.
    local made = sc.session_create(nil, nil, 'client-c1', nil, 60)
    t:ok(made.status == 'OK' and made.session_id ~= nil, 'no id: made here as before, and answered')
    t:is(box.space.sessions:get(made.session_id)[F.stored], nil, 'raw-keyed (no handle until rekeyed)')
end)

test:test('the absolute deadline: created + max_lifetime_s, answered, and no refresh passes it', function(t)
    t:plan(9)
    local id = uuid()
    local r = sc.session_create(nil, id, 'client-abs', nil, 3600, {a = 1}, nil, nil, nil, 120)
    t:ok(r.expires_in_ms <= 120000 and r.absolute_expires_in_ms == 120000, 'the idle deadline capped at 2 min')
    local default = uuid()
    r = sc.session_create(nil, default, 'client-abs', nil, 60)
    t:is(r.absolute_expires_in_ms, config.session_max_lifetime_ms, 'default SC_SESSION_MAX_LIFETIME_S')
    -- 100 s later, the TTL an hour: a read refreshes to the absolute deadline, not an hour on.
    age_session(id, 100000)
    local g = sc.session_get(nil, id)
    t:ok(g.status == 'OK' and g.expires_in_ms <= 20000 and g.expires_in_ms == g.absolute_expires_in_ms,
         'a read refreshes up to the absolute deadline: ' .. tostring(g.expires_in_ms))
    local lsn = box.info.lsn
    box.space.sessions:update(id, {{'-', F.updated_at, 10000}})
    lsn = box.info.lsn
    sc.session_get(nil, id)
    sc.session_touch(nil, id)
    t:is(box.info.lsn, lsn, 'at the absolute deadline already: a due refresh writes nothing')
    local u = sc.session_update(nil, id, {a = 2})
    t:ok(u.status == 'OK' and u.expires_in_ms <= 20000, 'an update does not pass it either')
    t:is(sc.session_create(nil, uuid(), 'client-abs', nil, 60, nil, nil, nil, nil, 59).status, 'BAD_REQUEST',
         'max_lifetime_s below 60')
    t:is(sc.session_create(nil, uuid(), 'client-abs', nil, 60, nil, nil, nil, nil, 31536001).status, 'BAD_REQUEST',
         'max_lifetime_s above a year')
    -- Past it: NOT_FOUND at once, and the sweeper's session.expired says why.
    local before = head()
    age_session(id, 30000)
    t:is(sc.session_get(nil, id).status, 'NOT_FOUND', 'NOT_FOUND past the absolute deadline')
    expiry.sweep_once('sessions')
    local ev = events_since(before, 'session.expired')
    t:is_deeply({#ev, ev[1] and ev[1].key, ev[1] and ev[1].payload.reason}, {1, handle(id), 'absolute'},
        'session.expired, reason absolute')
end)

test:test('a session of before version 9 gets created_at + the default at its next write', function(t)
    t:plan(5)
    local id, now = uuid(), util.now_ms()
    -- As version 5-8 wrote it: ten fields, no bucket, no absolute deadline, no stored mark.
    box.space.sessions:insert({id, 'client-old', '', 1, now - 7200000, 3600000, now + 60000, {a = 1},
                               now - 7200000, box.NULL})
    local g = sc.session_get(nil, id)
    t:is(g.status, 'OK', 'read')
    t:ok(math.abs(g.absolute_expires_in_ms - (config.session_max_lifetime_ms - 7200000)) < 1000,
         'counted from its creation')
    local row = box.space.sessions:get(id)
    t:is(row[F.absolute_at], now - 7200000 + config.session_max_lifetime_ms, 'and written with the refresh')
    t:ok(row[F.expires_at] <= row[F.absolute_at], 'the refresh capped by it')
    -- One created longer ago than the lifetime is gone: NOT_FOUND, writes nothing, swept as absolute.
    local old = uuid()
    box.space.sessions:insert({old, 'client-old', '', 1, now - 60000, 3600000, now + 3540000, nil,
                               now - config.session_max_lifetime_ms - 1000})
    local lsn = box.info.lsn
    local answers = {sc.session_get(nil, old).status, sc.session_touch(nil, old).status,
                     sc.session_update(nil, old, {a = 2}).status, #sc.session_list(nil, 'client-old').sessions}
    t:is_deeply({answers, box.info.lsn - lsn}, {{'NOT_FOUND', 'NOT_FOUND', 'NOT_FOUND', 1}, 0},
        'older than the lifetime: NOT_FOUND at its next read and write (nothing written), not listed')
end)

test:test('rotation with a grace window: the old id answers reads, never refreshes, refuses writes', function(t)
    t:plan(12)
    local old, new = helper.session('client-grace', {step = 1}), uuid()
    sc.cache_put(nil, old, 'k', 0, 60, 'v')
    local r = sc.session_rotate(nil, old, new, 5000)
    t:is_deeply({r.status, r.handle, r.cache_moved}, {'OK', handle(new), 1}, 'rotated')
    t:is(box.space.rotations:get(old)[FR.new_id], new, 'the old id is kept with the new one')
    local lsn = box.info.lsn
    box.space.sessions:update(new, {{'-', F.updated_at, 30000}})  -- a refresh would be due
    lsn = box.info.lsn
    local g = sc.session_get(nil, old)
    t:is_deeply({g.status, g.rotated, g.data.step}, {'OK', true, 1}, 'a read by the old id: the session, rotated')
    t:is(box.info.lsn, lsn, 'and nothing refreshed')
    t:is(sc.cache_get(nil, old, 'k').data, 'v', 'its cache read by the old id')
    t:is(sc.session_get(nil, new).rotated, nil, 'the new id is not rotated')
    local writes = {
        sc.session_touch(nil, old), sc.session_update(nil, old, {step = 2}), sc.session_delete(nil, old),
        sc.session_rotate(nil, old, uuid()), sc.cache_put(nil, old, 'k2', 0, 60, 1), sc.cache_delete(nil, old, 'k'),
    }
    local statuses = {}
    for _, w in ipairs(writes) do
        table.insert(statuses, w.status)
    end
    t:is_deeply(statuses, {'NOT_FOUND', 'NOT_FOUND', 'NOT_FOUND', 'NOT_FOUND', 'NOT_FOUND', 'NOT_FOUND'},
        'touch, update, delete, rotate, cache put and delete by the old id: NOT_FOUND')
    t:is(sc.session_get(nil, new).data.step, 1, 'nothing changed')
    -- The window ends: the sweeper takes the row, and the old id is NOT_FOUND for everything.
    box.space.rotations:update(old, {{'=', FR.expires_at, util.now_ms() - 1}})
    t:is(sc.session_get(nil, old).status, 'NOT_FOUND', 'after grace_ms: NOT_FOUND at once')
    t:is(sc.cache_get(nil, old, 'k').status, 'NOT_FOUND', 'its cache too')
    expiry.sweep_once('rotations')
    t:is(box.space.rotations:get(old), nil, 'swept')
    t:is(sc.session_get(nil, new).status, 'OK', 'the session lives on under its new id')
end)

test:test('old ids follow the session through a second rotation, and end with it', function(t)
    t:plan(5)
    local a, b, c = helper.session('client-chain', {n = 1}), uuid(), uuid()
    sc.session_rotate(nil, a, b, 5000)
    sc.session_rotate(nil, b, c, 5000)
    t:is(sc.session_get(nil, a).data.n, 1, 'the first id reads the session after two rotations')
    t:is(sc.session_get(nil, b).rotated, true, 'the second too')
    t:is(box.space.rotations:get(a)[FR.new_id], c, 'both point at the newest id')
    sc.session_delete(nil, c)
    t:is(sc.session_get(nil, a).status, 'NOT_FOUND', 'the session ended: its old ids are NOT_FOUND')
    t:is(box.space.rotations.index.by_new:count({c}), 0, 'and their rows gone with it')
end)

test:test('concurrent rotations of one session: exactly one wins, the others NOT_FOUND', function(t)
    t:plan(3)
    local old = helper.session('client-race-rot')
    local done, statuses, winner = fiber.channel(20), {}, nil
    for _ = 1, 20 do
        fiber.create(function()
            local new = uuid()
            local r = sc.session_rotate(nil, old, new, 5000)
            if r.status == 'OK' then
                winner = new
            end
            done:put(r.status)
        end)
    end
    for _ = 1, 20 do
        local s = done:get(5)
        statuses[s] = (statuses[s] or 0) + 1
    end
    t:is_deeply(statuses, {OK = 1, NOT_FOUND = 19}, 'one OK, 19 NOT_FOUND')
    t:is(sc.session_get(nil, winner).status, 'OK', 'the winner\'s id holds the session')
    t:is(box.space.sessions.index.by_client:count({'client-race-rot'}), 1, 'one session')
end)

test:test('a rotation\'s arguments: grace 0..60000, a new canonical id, not a session already', function(t)
    t:plan(6)
    local old = helper.session('client-rot-args')
    t:is(sc.session_rotate(nil, old, uuid(), 60001).status, 'BAD_REQUEST', 'grace_ms above 60000')
    t:is(sc.session_rotate(nil, old, uuid(), -1).status, 'BAD_REQUEST', 'grace_ms below 0')
    t:is(sc.session_rotate(nil, old, old).status, 'BAD_REQUEST', 'the same id')
    t:is(sc.session_rotate(nil, old, 'nope').status, 'BAD_REQUEST', 'not UUID text')
    t:is(sc.session_rotate(nil, old, helper.session('client-rot-args')).status, 'ALREADY_EXISTS',
         'the new id is a session already')
    local r = sc.session_rotate(nil, old, uuid())
    t:is(box.space.rotations:get(old)[FR.expires_at] - util.now_ms() > config.rotate_grace_ms - 1000, true,
         'no grace_ms: SC_ROTATE_GRACE_MS (' .. r.status .. ')')
end)

test:test('a bound session answers only its binding; a mismatch does nothing and is told', function(t)
    t:plan(11)
    local id, dev = uuid(), bound_to('device-7f3a')
    t:is(sc.session_create(nil, id, 'client-bind', nil, 60, {n = 1}, nil, nil, nil, nil, dev).status, 'OK',
         'created bound')
    t:is(box.space.sessions:get(id)[F.binding], dev, 'the binding\'s digest kept as given')
    local before = head()
    box.space.sessions:update(id, {{'-', F.updated_at, 30000}})  -- a refresh would be due
    local lsn_row = box.space.sessions:get(id)[F.updated_at]
    local wrong = bound_to('device-0000')
    local answers = {
        sc.session_get(nil, id), sc.session_get(nil, id, wrong), sc.session_touch(nil, id, wrong),
        sc.session_update(nil, id, {n = 2}, nil, nil, nil, nil, wrong), sc.session_rotate(nil, id, uuid(), 0, wrong),
        sc.session_delete(nil, id, wrong), sc.cache_put(nil, id, 'k', 0, 60, 1, wrong),
        sc.cache_get(nil, id, 'k', wrong), sc.cache_delete(nil, id, 'k', wrong),
    }
    local statuses = {}
    for _, a in ipairs(answers) do
        statuses[a.status] = (statuses[a.status] or 0) + 1
    end
    t:is_deeply(statuses, {BINDING_MISMATCH = #answers}, 'no binding, or another: BINDING_MISMATCH for every call')
    local row = box.space.sessions:get(id)
    t:is_deeply({row[F.rev], row[F.updated_at], row[F.data].n}, {1, lsn_row, 1}, 'nothing done, nothing refreshed')
    local ev = events_since(before, 'session.binding_mismatch')
    t:is_deeply({#ev, ev[1] and ev[1].key, ev[1] and ev[1].payload}, {#answers, handle(id), {client_id = 'client-bind'}},
        'a session.binding_mismatch event each, keyed by handle')
    local g = sc.session_get(nil, id, dev)
    t:ok(g.status == 'OK' and box.space.sessions:get(id)[F.updated_at] > lsn_row, 'the binding: answered and refreshed')
    t:is(sc.session_update({idempotency_key = 'bind-key'}, id, {n = 2}, nil, nil, nil, nil, wrong).status,
         'BINDING_MISMATCH', 'under an idempotency key')
    t:is(box.space.idempotency:get('bind-key'), nil, 'the refusal is not stored under it')
    local new = uuid()
    sc.session_rotate(nil, id, new, 5000, dev)
    t:is(sc.session_get(nil, new).status, 'BINDING_MISMATCH', 'a rotation keeps the binding')
    t:is(sc.session_get(nil, id, dev).rotated, true, 'the old id in its grace window checks it too')
    t:is(sc.session_get(nil, new, 'device-7f3a').status, 'BAD_REQUEST', 'a binding that is no digest: BAD_REQUEST')
end)

test:test('a session created without a binding ignores the field', function(t)
    t:plan(2)
    local id = helper.session('client-unbound')
    t:is(sc.session_get(nil, id, bound_to('anything')).status, 'OK', 'any binding given: OK')
    t:is(sc.session_update(nil, id, {n = 1}, nil, nil, nil, nil, bound_to('x')).status, 'OK', 'writes too')
end)

test:test('SESSION_DELETE by handle and client: its client\'s live session, else NOT_FOUND', function(t)
    t:plan(9)
    local id = uuid()
    sc.session_create(nil, id, 'client-dev', nil, 60, nil, nil, nil, nil, nil, bound_to('phone'))
    sc.cache_put(nil, id, 'k', 0, 60, 1, bound_to('phone'))
    local h = handle(id)
    t:is(sc.session_delete(nil, nil, nil, h, 'client-other').status, 'NOT_FOUND', 'another client\'s: NOT_FOUND')
    t:is(sc.session_delete(nil, id, nil, h, 'client-dev').status, 'BAD_REQUEST', 'an id and a handle: BAD_REQUEST')
    t:is(sc.session_delete(nil, nil, nil, h).status, 'BAD_REQUEST', 'a handle without its client: BAD_REQUEST')
    t:is(sc.session_delete(nil, nil, nil, nil, 'client-dev').status, 'BAD_REQUEST', 'neither: BAD_REQUEST')
    local bad = sc.session_delete(nil, nil, nil, id, 'client-dev')
    t:ok(bad.status == 'BAD_REQUEST' and bad.message:find('handle'), 'an id given as a handle: ' .. bad.message)
    local before = head()
    local r = sc.session_delete(nil, nil, nil, h, 'client-dev')
    t:is_deeply({r.status, r.cache_deleted}, {'OK', 1}, 'ended, no binding asked ("sign out that device")')
    t:is(box.space.sessions:get(id), nil, 'gone')
    t:is(events_since(before, 'session.deleted')[1].key, h, 'session.deleted by handle')
    t:is(sc.session_delete(nil, nil, nil, h, 'client-dev').status, 'NOT_FOUND', 'again: NOT_FOUND')
end)

test:test('the session key\'s id: the first one given is kept, another is MISMATCH', function(t)
    t:plan(7)
    box.space.sc_meta:delete('session_key_id')
    local r = sc.session_key_check(nil, 'edbffad44be25c45')
    t:is_deeply({r.status, r.key_id, r.first}, {'OK', 'edbffad44be25c45', true}, 'the first is kept')
    t:is(box.space.sc_meta:get('session_key_id')[2], 'edbffad44be25c45', 'in sc_meta')
    local lsn = box.info.lsn
    r = sc.session_key_check(nil, 'edbffad44be25c45')
    t:is_deeply({r.status, r.first}, {'OK', nil}, 'the same again: OK')
    r = sc.session_key_check(nil, '282a57a80ded0fdb')
    t:is_deeply({r.status, r.expected}, {'MISMATCH', 'edbffad44be25c45'}, 'another: MISMATCH naming the kept one')
    t:is(box.info.lsn, lsn, 'neither writes')
    t:is(sc.session_key_check(nil, 'xyz').status, 'BAD_REQUEST', 'not 16 hex characters')
    local original = util.set_writable(function() return false end)
    box.space.sc_meta:delete('session_key_id')
    r = sc.session_key_check(nil, 'edbffad44be25c45')
    util.set_writable(original)
    t:is(r.status, 'NOT_LEADER', 'none kept and not writable: NOT_LEADER')
end)

test:test('a raw-keyed session is renamed to its stored id with its cache and rotations', function(t)
    t:plan(10)
    local raw = sc.session_create(nil, nil, 'client-rekey', nil, 60, {n = 1}).session_id
    sc.cache_put(nil, raw, 'k', 0, 60, 'v')
    local stored = uuid()
    local r = sc.session_rekey(nil, raw, stored)
    t:is(r.status, 'OK', 'renamed')
    t:is_deeply({r.cache_moved, r.absolute_expires_in_ms > 0}, {1, true}, 'its cache moved, its absolute deadline set')
    t:is(box.space.sessions:get(raw), nil, 'the raw id is gone from storage')
    t:is_deeply({sc.session_get(nil, stored).data.n, sc.cache_get(nil, stored, 'k').data}, {1, 'v'},
        'the session and its cache under the stored id')
    t:is(box.space.sessions:get(stored)[F.stored], true, 'marked as a stored id')
    t:is(sc.session_rekey(nil, raw, uuid()).status, 'NOT_FOUND', 'again: NOT_FOUND (rekeyed)')
    t:is(sc.session_rekey(nil, stored, uuid()).status, 'NOT_FOUND', 'a stored-keyed row is never renamed')
    local raw2 = sc.session_create(nil, nil, 'client-rekey', nil, 60).session_id
    t:is(sc.session_rekey(nil, raw2, stored).status, 'ALREADY_EXISTS', 'onto a session that exists: ALREADY_EXISTS')
    local v8 = require('smartcache.sharding').session_id(uuid(), 7)
    t:is(sc.session_rekey(nil, raw2, v8).status, 'BAD_REQUEST', 'another version: BAD_REQUEST')
    t:is(sc.session_rekey(nil, raw2, raw2:upper()).status, 'BAD_REQUEST', 'not canonical: BAD_REQUEST')
end)

test:test('a raw-keyed session past its absolute deadline is not renamed; it ends with reason absolute', function(t)
    t:plan(4)
    local raw, now = uuid(), util.now_ms()
    box.space.sessions:insert({raw, 'client-rekey-old', '', 1, now, 3600000, now + 3600000, nil,
                               now - config.session_max_lifetime_ms - 1})
    local stored = uuid()
    t:is(sc.session_rekey(nil, raw, stored).status, 'NOT_FOUND', 'NOT_FOUND')
    t:is(box.space.sessions:get(stored), nil, 'nothing renamed')
    local before = head()
    box.space.sessions:update(raw, {{'=', F.expires_at, now - 1}})  -- its idle deadline: the sweeper's turn
    expiry.sweep_once('sessions')
    local ev = events_since(before, 'session.expired')
    t:is_deeply({#ev, ev[1] and ev[1].payload.reason}, {1, 'absolute'}, 'session.expired, reason absolute')
    t:is(ev[1] and ev[1].key:sub(1, 1), 'r', 'named by the digest of its raw id, never by it')
end)

test:test('sessions_page lists the live raw-keyed sessions only, a page at a time', function(t)
    t:plan(5)
    box.space.sessions:truncate()
    local raws = {}
    for i = 1, 7 do
        raws[i] = sc.session_create(nil, nil, 'client-page', nil, 60).session_id
        helper.session('client-page')  -- stored: never listed
    end
    local dead = sc.session_create(nil, nil, 'client-page', nil, 60).session_id
    box.space.sessions:update(dead, {{'=', F.expires_at, util.now_ms() - 1}})
    local seen, pages, after = {}, 0, nil
    repeat
        local p = sc.sessions_page(nil, after, 3)
        pages = pages + 1
        for _, s in ipairs(p.sessions) do
            seen[s.session_id] = s.client_id
        end
        after = p.last
    until p.done or pages > 20
    local listed = 0
    for _ in pairs(seen) do
        listed = listed + 1
    end
    t:is(listed, 7, 'the seven live raw-keyed sessions')
    t:ok(seen[raws[1]] == 'client-page' and seen[dead] == nil, 'with their client; not the expired one')
    t:ok(pages >= 3, 'in pages of at most three: ' .. pages)
    t:is(sc.sessions_page(nil, nil, 1001).status, 'BAD_REQUEST', 'limit at most 1000')
    t:is(#sc.sessions_page(nil, 'ffffffff-ffff-ffff-ffff-ffffffffffff').sessions, 0, 'after the last id: none')
end)

test:test('the procedures of issue 37 are granted to whom they are for', function(t)
    t:plan(6)
    local api = require('smartcache.api')
    t:ok(api.OPERATOR_ONLY['sc.audit_write'] and api.OPERATOR_ONLY['sc.audit_read'], 'the audit: operators only')
    t:ok(api.OPERATOR_ONLY['sc.sessions_page'], 'the raw ids of the rekey\'s pages: operators only')
    t:ok(api.OPERATOR_TOO['sc.session_rekey'], 'the rekey: the service (lazy) and operators (the CLI)')
    t:ok(api.OPERATOR_TOO['sc.session_key_check'], 'the key check: the service and the CLI\'s rekey')
    t:ok(api.ROUTE.session_rekey ~= nil and api.UNROUTED.session_key_check and api.UNROUTED.sessions_page,
         'the rekey routes by the raw id; the key check and the pages are the shard\'s')
    local kind, value = api.ROUTE.session_delete(nil, nil, handle(uuid()), 'client-x')
    t:is_deeply({kind, value}, {'key', 'client-x'}, 'a delete by handle routes by its client')
end)

test:test('the rotations and audit spaces are guarded, and rotations move with their bucket', function(t)
    t:plan(3)
    local guarded = {}
    for _, name in ipairs(require('smartcache.quorum').GUARDED) do
        guarded[name] = true
    end
    t:ok(guarded.rotations and guarded.audit, 'both in quorum.GUARDED')
    local sharded = false
    for _, name in ipairs(schema.SHARDED) do
        sharded = sharded or name == 'rotations'
    end
    t:ok(sharded, 'rotations is a sharded space (its rows move with their session\'s bucket)')
    t:is(schema.current_version(), 9, 'schema version 9')
end)

helper.finish(test)
