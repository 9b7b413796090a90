#!/usr/bin/env tarantool
-- What a bank's front tier needs of sessions at login and logout (smartcache.sessions): rotation,
-- log out everywhere, a limit per client, attribute merges, reads that stay reads, the list.
local tap = require('tap')
local fiber = require('fiber')
local helper = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'helper.lua')
helper.start()
local config = require('smartcache.config')
local sessions = require('smartcache.sessions')
local reads = require('smartcache.sessions.reads')  -- the refresh rule and its counter
local F = require('smartcache.schema').F.sessions
local uuid = require('smartcache.util').uuid  -- a stored id, as the service derives them (random to storage)

local test = tap.test('session lifecycle')
test:plan(12)

-- Events of a topic written since seq (the event log: smartcache.events).
local function events_since(seq, topic)
    local out = {}
    for _, e in ipairs(sc.events_read(nil, seq, {topic}, 1000, 0).events) do
        table.insert(out, e)
    end
    return out
end

local function head()
    return sc.events_read(nil, nil, nil, 1, 0).head_seq
end

test:test('rotation with no grace moves the session, its cache and its deadline to the new id; the old is gone',
    function(t)
    t:plan(11)
    local old = helper.session('client-rot', {step = 1})
    sc.session_update(nil, old, {step = 2})
    sc.cache_put(nil, old, 'wizard', 0, 60, 'page 3')
    local before, left = head(), sc.session_get(nil, old).expires_in_ms
    local new = uuid()
    local r = sc.session_rotate(nil, old, new, 0)
    t:is(r.status, 'OK', 'rotated')
    t:is_deeply({r.session_id, r.handle}, {nil, helper.handle(new)}, 'to the id the service gave: its handle')
    t:is(sc.session_get(nil, old).status, 'NOT_FOUND', 'the old id is NOT_FOUND at once')
    local got = sc.session_get(nil, new)
    t:is_deeply({got.client_id, got.data.step, got.rev}, {'client-rot', 2, 2}, 'client, data and rev moved')
    t:ok(math.abs(got.expires_in_ms - left) < 1000, 'the remaining lifetime moved too')
    t:is(sc.cache_get(nil, new, 'wizard').data, 'page 3', 'the cache entry moved')
    t:is(sc.cache_get(nil, old, 'wizard').status, 'NOT_FOUND', 'and is gone from the old id')
    t:is(r.cache_moved, 1, 'cache entries counted')
    local ev = events_since(before, 'session.rotated')
    t:is_deeply({#ev, ev[1] and ev[1].key, ev[1] and ev[1].payload.old_handle},
        {1, helper.handle(new), helper.handle(old)}, 'one session.rotated event, keyed by the new handle, naming the old')
    t:is(sc.session_rotate(nil, old, uuid(), 0).status, 'NOT_FOUND', 'rotating a gone id: NOT_FOUND')
    t:is(box.space.rotations:get(old), nil, 'no grace: no rotation row')
end)

test:test('a rotation repeated under its idempotency key answers the same', function(t)
    t:plan(3)
    local old, new = helper.session('client-rot2'), uuid()
    local a = sc.session_rotate({idempotency_key = 'rot-1'}, old, new)
    local b = sc.session_rotate({idempotency_key = 'rot-1'}, old, new)
    t:is(a.status, 'OK', 'rotated')
    t:is(b.rev, a.rev, 'the repeat answers the same')
    t:ok(b.replayed, 'as a replay')
end)

test:test('log out everywhere ends every live session of the client, with its cache, an event each', function(t)
    t:plan(6)
    local ids = {}
    for i = 1, 7 do
        ids[i] = helper.session('client-out', {i = i})
        sc.cache_put(nil, ids[i], 'k', 0, 60, i)
    end
    local other = helper.session('client-stays')
    local before = head()
    local r = sc.session_delete_client(nil, 'client-out')
    t:is_deeply({r.status, r.deleted, r.cache_deleted, r.more}, {'OK', 7, 7, nil}, 'seven sessions, seven entries')
    t:is(#sc.session_list(nil, 'client-out').sessions, 0, 'none left')
    t:is(box.space.cache.index.primary:count({ids[3]}), 0, 'their cache went with them')
    t:is(#events_since(before, 'session.deleted'), 7, 'session.deleted for each')
    t:is(sc.session_get(nil, other).status, 'OK', "another client's session stays")
    t:is(sc.session_delete_client(nil, 'client-out').deleted, 0, 'nothing left to end: 0')
end)

test:test('log out everywhere but here keeps the caller session', function(t)
    t:plan(2)
    local here = helper.session('client-but')
    helper.session('client-but')
    helper.session('client-but')
    t:is(sc.session_delete_client(nil, 'client-but', here).deleted, 2, 'the two others')
    t:is(sc.session_get(nil, here).status, 'OK', 'the caller session lives')
end)

test:test('log out everywhere works in batches, stops at the deadline, and replays under its key', function(t)
    t:plan(5)
    local batch = config.delete_batch
    config.delete_batch = 3
    for _ = 1, 10 do
        helper.session('client-many')
    end
    local r = sc.session_delete_client({idempotency_key = 'out-1'}, 'client-many')
    t:is(r.deleted, 10, 'all ten, in four transactions of at most three')
    local again = sc.session_delete_client({idempotency_key = 'out-1'}, 'client-many')
    t:is_deeply({again.deleted, again.replayed}, {10, true}, 'a repeat under the key answers the first count')
    for _ = 1, 5 do
        helper.session('client-late')
    end
    local past = require('smartcache.util').now_ms() - 1
    local stopped = sessions.delete_client(past, nil, 'client-late')
    t:is_deeply({stopped.deleted, stopped.more}, {0, true}, 'past its deadline: more = true, call again')
    t:is(sc.session_delete_client(nil, 'client-late').deleted, 5, 'the next call ends them')
    config.delete_batch = batch
    t:is(sc.session_delete_client(nil, 7).status, 'BAD_REQUEST', 'client_id must be a string')
end)

test:test('a client limited to n sessions: refuse answers LIMIT_REACHED and changes nothing', function(t)
    t:plan(4)
    local a = sc.session_create(nil, uuid(), 'client-lim', nil, 60, nil, 2, 'refuse')
    local b = sc.session_create(nil, uuid(), 'client-lim', nil, 60, nil, 2, 'refuse')
    local c = sc.session_create(nil, uuid(), 'client-lim', nil, 60, nil, 2, 'refuse')
    t:is_deeply({a.status, b.status}, {'OK', 'OK'}, 'two fit')
    t:is(c.status, 'LIMIT_REACHED', 'the third is refused')
    t:is(c.session_id, nil, 'and names no session')
    t:is(#sc.session_list(nil, 'client-lim').sessions, 2, 'still two')
end)

test:test('evict_oldest ends the least recently used session of the client, with its event', function(t)
    t:plan(5)
    local first, second = uuid(), uuid()
    sc.session_create(nil, first, 'client-ev', nil, 60, nil, 2, 'evict_oldest')
    sc.session_create(nil, second, 'client-ev', nil, 60, nil, 2, 'evict_oldest')
    box.space.sessions:update(second, {{'-', F.updated_at, 10000}})  -- second is now the least recently used
    local before = head()
    local third = sc.session_create(nil, uuid(), 'client-ev', nil, 60, nil, 2, 'evict_oldest')
    t:is_deeply({third.status, third.evicted}, {'OK', 1}, 'created, one evicted')
    t:is(sc.session_get(nil, second).status, 'NOT_FOUND', 'the least recently used one ended')
    t:is(sc.session_get(nil, first).status, 'OK', 'the other stays')
    local ev = events_since(before, 'session.evicted')
    t:is_deeply({#ev, ev[1] and ev[1].key}, {1, helper.handle(second)}, 'session.evicted for it, by handle')
    t:is(sc.session_create(nil, uuid(), 'client-ev', nil, 60, nil, 0).status, 'BAD_REQUEST', 'max_sessions >= 1')
end)

test:test('concurrent creates for one client limited to one leave exactly one live session', function(t)
    t:plan(2)
    local done, statuses = fiber.channel(50), {}
    for _ = 1, 50 do
        fiber.create(function()
            done:put(sc.session_create(nil, uuid(), 'client-race', nil, 60, nil, 1, 'refuse').status)
        end)
    end
    for _ = 1, 50 do
        local s = done:get(5)
        statuses[s] = (statuses[s] or 0) + 1
    end
    t:is_deeply(statuses, {OK = 1, LIMIT_REACHED = 49}, 'one created, 49 refused')
    t:is(#sc.session_list(nil, 'client-race').sessions, 1, 'one live session')
end)

test:test('set and unset merge attributes into map data; two changes of different attributes both survive', function(t)
    t:plan(7)
    local sid = helper.session('client-merge', {a = 1, b = 2})
    local r1 = sc.session_update(nil, sid, nil, nil, nil, {c = 3})
    local r2 = sc.session_update(nil, sid, nil, nil, nil, {a = 10}, {'b'})
    t:is_deeply({r1.status, r2.status, r2.rev}, {'OK', 'OK', 3}, 'two merges, each a revision')
    t:is_deeply(sc.session_get(nil, sid).data, {a = 10, c = 3}, 'a changed, b unset, c set: both survived')
    local empty = helper.session('client-merge')
    sc.session_update(nil, empty, nil, nil, nil, {x = 1})
    t:is_deeply(sc.session_get(nil, empty).data, {x = 1}, 'no data yet counts as an empty map')
    local scalar = helper.session('client-merge', 'just a string')
    t:is(sc.session_update(nil, scalar, nil, nil, nil, {x = 1}).status, 'BAD_REQUEST', 'data that is not a map')
    t:is(sc.session_update(nil, sid, {whole = true}, nil, nil, {x = 1}).status, 'BAD_REQUEST', 'data with set')
    t:is(sc.session_update(nil, sid, nil, 2, nil, {x = 1}).status, 'CONFLICT', 'expected_rev guards a merge too')
    t:is(sc.session_update(nil, sid).status, 'BAD_REQUEST', 'neither data nor set/unset')
end)

test:test('a read refreshes the deadline only once a tenth of the TTL has passed since the last refresh', function(t)
    t:plan(5)
    t:is(reads.refresh_after_ms(1800 * 1000), 180 * 1000, 'a tenth of 30 min: 3 min')
    t:is(reads.refresh_after_ms(5 * 1000), 1000, 'never below 1 s')
    t:is(reads.refresh_after_ms(30 * 86400 * 1000), 300 * 1000, 'never above 5 min')
    local sid = uuid()
    sc.session_create(nil, sid, 'client-read', nil, 600, 'x')
    local writes = reads.refreshes
    for _ = 1, 20 do
        sc.session_get(nil, sid)
    end
    t:is(reads.refreshes, writes, '20 reads within a minute of a 10 min session write nothing')
    box.space.sessions:update(sid, {{'-', F.updated_at, 61000}})
    sc.session_get(nil, sid)
    t:is(reads.refreshes, writes + 1, 'one past a tenth of its TTL writes once')
end)

test:test('the list shows handles, created-at, last refresh, both expiries, version and device, never the data',
    function(t)
    t:plan(6)
    local sid = uuid()
    sc.session_create(nil, sid, 'client-where', 'ios-5.2', 60, {secret = 1}, nil, nil, 'iPhone 15')
    local s = sc.session_list(nil, 'client-where').sessions[1]
    t:is_deeply({s.handle, s.version, s.device}, {helper.handle(sid), 'ios-5.2', 'iPhone 15'},
        'handle, version, device')
    t:is(s.session_id, nil, 'never the id: "list my devices" hands out no credential')
    t:ok(s.created_at_ms > 0 and s.updated_at_ms >= s.created_at_ms and s.expires_in_ms > 0, 'times')
    t:ok(s.absolute_expires_in_ms > s.expires_in_ms, 'the absolute deadline too')
    t:is(s.data, nil, 'no data')
    t:is(sc.session_create(nil, uuid(), 'client-where', nil, 60, nil, nil, nil, string.rep('d', 129)).status,
        'BAD_REQUEST', 'a device name is at most 128 bytes')
end)

test:test('a rotation keeps the creation time', function(t)
    t:plan(1)
    local old = helper.session('client-keep')
    local created = sc.session_list(nil, 'client-keep').sessions[1].created_at_ms
    box.space.sessions:update(old, {{'-', F.created_at, 5000}})
    sc.session_rotate(nil, old, uuid())
    t:is(sc.session_list(nil, 'client-keep').sessions[1].created_at_ms, created - 5000, 'created_at moved with it')
end)

helper.finish(test)
