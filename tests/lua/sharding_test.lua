#!/usr/bin/env tarantool
-- Storage is authoritative over its buckets (docs/design/sharding.md): every
-- procedure of a sharded space checks its key's bucket before it does anything,
-- and a cluster that is not sharded (sc_buckets empty) works as before.
-- Runnable alone: `tarantool tests/lua/sharding_test.lua`.
local tap = require('tap')
local helper = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'helper.lua')
helper.start()
local api = require('smartcache.api')
local buckets = require('smartcache.sharding.buckets')

local test = tap.test('sharding')
test:plan(10)

local COUNT = 16
local FAR = 'client-far'      -- its bucket was sent to shard s2
local NEAR = 'client-near'    -- its bucket is active here

-- Arguments that route a procedure to a key's bucket (the check comes before any
-- validation of the rest, so nothing else needs to be right).
local function args_for(name, key, sid)
    local route = api.ROUTE[name]
    if name == 'session_create' then
        return {nil, key, nil, 60, nil}
    end
    local kind = route(sid, key)  -- what kind of value the procedure routes by
    if kind == 'session' then
        return {sid, 'k'}
    end
    if name == 'event_publish' then
        return {'app.t', key, nil}
    end
    if name:sub(1, 6) == 'cache_' then
        return {'', key}
    end
    return {key}
end

local function lens()
    local out = {}
    for _, s in box.space._space:pairs() do
        local name = s[3]
        if name:sub(1, 1) ~= '_' and box.space[name] ~= nil and box.space[name].engine == 'memtx' then
            out[name] = box.space[name]:len()
        end
    end
    return out
end

-- Not sharded: no buckets, no bucket count.
local function unshard()
    box.space.sc_buckets:truncate()
    box.space.sc_meta:delete('bucket_count')
end

local function shard(active_except)
    box.space.sc_buckets:truncate()
    box.space.sc_meta:replace({'bucket_count', COUNT})
    for b = 0, COUNT - 1 do
        if b == active_except then
            box.space.sc_buckets:insert({b, 'sent', 2, 's2'})
        else
            box.space.sc_buckets:insert({b, 'active', 1})
        end
    end
end

test:test('every procedure routes by its key, or is listed as not about one key', function(t)
    local missing = {}
    for _, full in ipairs(api.names) do
        local name = full:sub(4)
        if api.ROUTE[name] == nil and not api.UNROUTED[name] then
            table.insert(missing, name)
        end
    end
    t:plan(2)
    t:is_deeply(missing, {}, 'no procedure without a routing rule')
    local both = {}
    for name in pairs(api.UNROUTED) do
        if api.ROUTE[name] ~= nil then
            table.insert(both, name)
        end
    end
    t:is_deeply(both, {}, 'none in both')
end)

test:test('not sharded: no bucket table, everything as before', function(t)
    t:plan(4)
    t:is(buckets.count(), nil, 'no bucket count')
    t:is(#box.space.sessions:before_replace(), 0, 'no stamping trigger: nothing added to a write')
    local r = sc.session_create(nil, nil, FAR, nil, 60, {n = 1})
    t:is(r.status, 'OK', 'created')
    t:is(sc.session_get(nil, r.session_id).status, 'OK', 'read')
end)

test:test('sharded: every routed procedure refuses a key whose bucket is not here, doing nothing', function(t)
    local old = helper.session(FAR)  -- an id made before sharding: routed by its row's client
    local far_bucket = buckets.of(FAR, COUNT)
    t:isnt(far_bucket, buckets.of(NEAR, COUNT), 'the two clients are in two buckets')
    shard(far_bucket)
    local v8 = buckets.session_id(require('uuid').str(), far_bucket)
    local names = {}
    for name in pairs(api.ROUTE) do
        table.insert(names, name)
    end
    table.sort(names)
    t:plan(2 + #names * 2 + 1)
    t:is(buckets.count(), COUNT, 'sharded: the bucket count')
    for _, name in ipairs(names) do
        local before = lens()
        local sid = name:sub(1, 8) == 'session_' and old or v8
        local r = sc[name](nil, unpack(args_for(name, FAR, sid), 1, 5))
        t:ok(r ~= nil and r.status == 'WRONG_BUCKET' and r.bucket == far_bucket and r.owner == 's2',
             name .. ': WRONG_BUCKET, its bucket and where it went')
        t:is_deeply(lens(), before, name .. ': nothing written')
    end
    t:is(sc.session_get(nil, v8).status, 'WRONG_BUCKET', 'a version 8 id of that bucket')
end)

test:test('sharded: a key whose bucket is active here is served', function(t)
    t:plan(4)
    shard(buckets.of(FAR, COUNT))
    local r = sc.session_create(nil, nil, NEAR, nil, 60, {n = 1})
    t:is(r.status, 'OK', 'created')
    t:is(sc.session_get(nil, r.session_id).status, 'OK', 'read')
    t:is(sc.counter_add(nil, 'near-counter', 1).status, 'OK', 'a counter of an active bucket')
    t:is(sc.session_get(nil, '00000000-0000-4000-8000-000000000000').status, 'NOT_FOUND',
         'an id made before sharding with no row: NOT_FOUND, as before')
end)

test:test('a bucket that is not in the table at all is not here either', function(t)
    t:plan(1)
    shard(buckets.of(FAR, COUNT))
    box.space.sc_buckets:delete(buckets.of(FAR, COUNT))
    t:is(sc.session_list(nil, FAR).status, 'WRONG_BUCKET', 'never here: WRONG_BUCKET')
end)

test:test('sharded: a new or rotated session id carries its client\'s bucket; a chosen one must', function(t)
    t:plan(6)
    shard(buckets.of(FAR, COUNT))
    local want = buckets.of(NEAR, COUNT)
    local r = sc.session_create(nil, nil, NEAR, nil, 60, nil)
    t:is(r.status, 'OK', 'created')
    t:is(buckets.of_session(r.session_id), want, 'a version 8 id carrying the client\'s bucket')
    local rotated = sc.session_rotate(nil, r.session_id)
    t:is(buckets.of_session(rotated.session_id), want, 'rotated: the new id carries it too')
    t:is(sc.session_get(nil, rotated.session_id).status, 'OK', 'and is served')
    local other = buckets.session_id(require('uuid').str(), (want + 1) % COUNT)
    local refused = sc.session_create(nil, other, NEAR, nil, 60, nil)
    t:is(refused.status, 'BAD_REQUEST', 'a chosen id of another bucket: ' .. tostring(refused.message))
    unshard()
    t:is(buckets.of_session(sc.session_create(nil, nil, NEAR, nil, 60, nil).session_id), nil,
         'not sharded: version 4, as before')
end)

test:test('session_locate says where an id made before sharding lives, writing nothing', function(t)
    t:plan(4)
    unshard()
    local old = helper.session(FAR)
    shard(buckets.of(FAR, COUNT))  -- its bucket is not here any more (the row stays, as before a move's garbage)
    local before = box.space.sessions:get(old)
    local r = sc.session_locate(nil, old)
    t:is(r.status, 'OK', 'found')
    t:is(r.bucket, buckets.of(FAR, COUNT), 'its bucket: its client\'s')
    t:is_deeply(box.space.sessions:get(old):totable(), before:totable(), 'the row unchanged (no refresh)')
    t:is(sc.session_locate(nil, '00000000-0000-4000-8000-000000000000').status, 'NOT_FOUND', 'absent')
end)

test:test('sc.buckets_init: a shard takes its buckets once, synchronously', function(t)
    t:plan(7)
    box.space.sc_buckets:truncate()
    box.space.sc_meta:delete('bucket_count')
    local held = {}
    for b = 0, 7 do
        table.insert(held, b)
    end
    local r = sc.buckets_init(nil, COUNT, held)
    t:is_deeply({r.status, r.created, r.buckets}, {'OK', true, 8}, 'created: 8 buckets')
    t:is_deeply({buckets.count(), box.space.sc_buckets:get(7)[2]}, {COUNT, 'active'}, 'the count, all active')
    r = sc.buckets_init(nil, COUNT, held)
    t:is_deeply({r.status, r.created}, {'OK', false}, 'again: OK, nothing created')
    t:is(sc.buckets_init(nil, COUNT, {8, 9}).status, 'ALREADY_EXISTS', 'other buckets: refused')
    t:is(sc.buckets_init(nil, COUNT, {0, 0}).status, 'BAD_REQUEST', 'a bucket twice: refused')
    t:is(sc.buckets_init(nil, 0, {0}).status, 'BAD_REQUEST', 'no buckets: refused')
    local guarded = false
    for _, name in ipairs(require('smartcache.quorum').GUARDED) do
        guarded = guarded or name == 'sc_buckets'
    end
    t:ok(guarded, 'sc_buckets is written through the synchronous quorum (guarded) in HA')
    unshard()
end)

test:test('every row of a sharded space records its bucket, written by the procedures', function(t)
    t:plan(19)
    unshard()
    local before = helper.session(FAR)  -- written before sharding: no bucket until the backfill
    local schema = require('smartcache.schema')
    t:is(box.space.sessions:get(before)[schema.F.sessions.bucket], nil, 'not sharded: no bucket recorded')
    local held = {}
    for b = 0, COUNT - 1 do
        table.insert(held, b)
    end
    local init = sc.buckets_init(nil, COUNT, held)
    t:ok(init.status == 'OK' and init.stamped >= 1, 'buckets_init stamps the rows already there: '
         .. tostring(init.stamped))
    local s = sc.session_create(nil, nil, NEAR, nil, 60, nil)
    sc.cache_put(nil, s.session_id, 'k', 1, 60, {1})
    sc.cache_put(nil, '', 'otp:1', 1, 60, {1})
    sc.device_bind(nil, 'dev-1', NEAR)
    sc.counter_add(nil, 'ctr-1', 1)
    sc.register_cas(nil, 'reg-1', 'v')
    sc.sequence_reserve(nil, 'seq-1', 1)
    sc.semaphore_acquire(nil, 'sem-1', 1, 'h1', 60000, 0)
    sc.latch_create(nil, 'latch-1', 2, 60000)
    sc.queue_put(nil, 'q-1', {1})
    sc.prewarm_acquire(nil, NEAR, 1, 'owner-1', 1000, 60000, s.session_id, '1')
    local rotated = helper.session(NEAR)
    sc.session_rotate(nil, rotated, buckets.session_id(require('uuid').str(), buckets.of(NEAR, COUNT)), 60000)
    local wrong, empty = {}, {}
    for _, name in ipairs(schema.SHARDED) do
        local pos = schema.F[name].bucket
        if box.space[name]:len() == 0 then
            table.insert(empty, name)
        end
        for _, row in box.space[name]:pairs() do
            if row[pos] == nil or row[pos] ~= buckets.of_row(name, row, COUNT) then
                table.insert(wrong, name .. ': ' .. tostring(row[1]) .. ' bucket ' .. tostring(row[pos]))
            end
        end
        t:ok(box.space[name].index.by_bucket ~= nil, name .. ': indexed by bucket')
    end
    t:is_deeply(empty, {}, 'a row written in every sharded space: ' .. table.concat(empty, ', '))
    t:is_deeply(wrong, {}, 'every row records its routing key\'s bucket')
    t:is(buckets.of_row('cache', box.space.cache:get({s.session_id, 'k'}), COUNT), buckets.of(NEAR, COUNT),
         'a session\'s cache entry is in its client\'s bucket')
    t:is(#box.space.sessions.index.by_bucket:select({buckets.of(NEAR, COUNT)}),
         box.space.sessions.index.by_client:count({NEAR}), 'a bucket\'s sessions by the index: its client\'s')
    t:is(box.space.rotations:get(rotated)[schema.F.rotations.bucket], buckets.of(NEAR, COUNT),
         'an old id\'s rotation row is in its session\'s bucket')
    unshard()
    local plain = sc.session_create(nil, nil, NEAR, nil, 60, nil)
    t:is(box.space.sessions:get(plain.session_id)[schema.F.sessions.bucket], nil, 'not sharded again: none')
end)

test:test('the spaces are sharded or the shard\'s own, none forgotten', function(t)
    local schema = require('smartcache.schema')
    local own = {sc_meta = true, sc_buckets = true, idempotency = true, sc_quorum = true, audit = true}
    local listed = {}
    for _, name in ipairs(schema.SHARDED) do
        listed[name] = true
    end
    local forgotten = {}
    for name in pairs(schema.FORMAT) do
        if not listed[name] and not own[name] then
            table.insert(forgotten, name)
        end
    end
    t:plan(2)
    t:is_deeply(forgotten, {}, 'every space of the schema is sharded or named as the shard\'s own')
    local keyed = {}
    for _, name in ipairs(schema.SHARDED) do
        if buckets.ROW_KEY[name] == nil then
            table.insert(keyed, name)
        end
    end
    t:is_deeply(keyed, {}, 'every sharded space has a routing key for its rows')
end)

helper.finish(test)
