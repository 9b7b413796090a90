#!/usr/bin/env tarantool
-- Moves of buckets (smartcache.sharding.moves): every transition, its repeat, the
-- transitions from a wrong state or generation (which change nothing), the fence
-- on writes of a bucket that is not active, and the cases of vshard's issues.
-- One instance plays the source of one bucket and the destination of another.
-- Runnable alone: `tarantool tests/lua/moves_test.lua`.
local tap = require('tap')
local fiber = require('fiber')
local helper = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'helper.lua')
helper.start()
local buckets = require('smartcache.sharding.buckets')
local moves = require('smartcache.sharding.moves')
local schema = require('smartcache.schema')

local COUNT = 16
local test = tap.test('moves')
test:plan(19)

-- A shard holding every bucket but `away` (not held: it will be received).
local function shard(away)
    box.space.sc_buckets:truncate()
    box.space.sc_meta:replace({'bucket_count', COUNT})
    for b = 0, COUNT - 1 do
        if b ~= away then
            box.space.sc_buckets:insert({b, 'active', 1})
        end
    end
    buckets.install()
end

-- A client id of bucket b (the first of client-0, client-1, ... there).
local function client_of(b, skip)
    local i = 0
    while true do
        local c = 'client-' .. i
        if buckets.of(c, COUNT) == b and c ~= skip then
            return c
        end
        i = i + 1
    end
end

local function rows_of(b)
    local n = 0
    for _, name in ipairs(schema.SHARDED) do
        n = n + box.space[name].index.by_bucket:count({b})
    end
    return n
end

local function status(b)
    local t = box.space.sc_buckets:get(b)
    return t and t[2] or nil, t and t[3] or nil
end

local SRC, DST = 3, 5
shard(DST)
local client = client_of(SRC)
local sid = sc.session_create(nil, nil, client, nil, 600, {v = 1}).session_id
sc.cache_put(nil, sid, 'k', 1, 600, {1})
sc.counter_add(nil, client_of(SRC, client), 7)

test:test('send_start: active at the generation given -> sending at the next; a repeat is OK', function(t)
    t:plan(6)
    t:is(sc.bucket_send_start(nil, SRC, 's2', 7).status, 'BUCKET_STATE', 'another generation: refused')
    t:is_deeply({status(SRC)}, {'active', 1}, 'and nothing changed')
    local r = sc.bucket_send_start(nil, SRC, 's2', 1)
    t:is_deeply({r.status, r.generation, r.peer}, {'OK', 2, 's2'}, 'sending to s2 at generation 2')
    t:is(sc.bucket_send_start(nil, SRC, 's2', 1).status, 'OK', 'the same again: OK (a driver retrying)')
    t:is(sc.bucket_send_start(nil, SRC, 's3', 1).status, 'BUCKET_STATE', 'to another shard: refused')
    t:is(box.space.sc_buckets:get(SRC)[5] ~= nil, true, 'since when: recorded')
end)

test:test('a sending bucket: calls answered BUCKET_MOVING, nothing written; reads of its rows page by key',
    function(t)
    t:plan(7)
    local before = rows_of(SRC)
    t:is(sc.session_get(nil, sid).status, 'BUCKET_MOVING', 'a read: BUCKET_MOVING (retryable)')
    t:is(sc.session_update(nil, sid, {v = 2}).status, 'BUCKET_MOVING', 'a write: BUCKET_MOVING')
    t:is(sc.session_create(nil, nil, client, nil, 60, nil).status, 'BUCKET_MOVING', 'a create: BUCKET_MOVING')
    t:is(rows_of(SRC), before, 'nothing written')
    local all, after = {}, nil
    for _ = 1, 10 do
        local page = sc.bucket_rows(nil, SRC, 2, 'cache', after, 1)
        for _, row in ipairs(page.rows) do
            table.insert(all, row)
        end
        if page.done then
            break
        end
        after = page.last
    end
    t:is(#all, 1, 'the cache entry, by pages of one')
    t:is(sc.bucket_rows(nil, SRC, 1, 'sessions').status, 'BUCKET_STATE', 'at another generation: refused')
    t:is(#sc.bucket_rows(nil, SRC, 2, 'sessions').rows, 1, 'the session')
end)

test:test('the fence: a write that checked its bucket before the move began fails at its write', function(t)
    t:plan(3)
    local other = client_of(SRC, client)
    -- What a procedure does after its check when it yields before writing (a wait, a batch):
    local ok, err = pcall(box.atomic, function()
        box.space.counters:replace({other, 8, 2, 0, 2 ^ 46})
    end)
    t:is(ok, false, 'the write fails')
    t:like(tostring(err), 'BUCKET_MOVING', 'saying why: ' .. tostring(err))
    t:is(box.space.counters:get(other)[2], 7, 'the value unchanged')
end)

test:test('send_abort: sending -> active at generation + 1, so the old copy can never be made active', function(t)
    t:plan(4)
    t:is(sc.bucket_send_abort(nil, SRC, 1).status, 'BUCKET_STATE', 'at another generation: refused')
    local r = sc.bucket_send_abort(nil, SRC, 2)
    t:is_deeply({r.status, r.bucket, (status(SRC))}, {'OK', SRC, 'active'}, 'active again')
    t:is(select(2, status(SRC)), 3, 'at generation 3')
    t:is(sc.session_get(nil, sid).status, 'OK', 'served again')
end)

test:test('send_done after the copy: sent; calls answered WRONG_BUCKET naming the owner', function(t)
    t:plan(6)
    t:is(sc.bucket_send_done(nil, SRC, 3).status, 'BUCKET_STATE', 'active, not sending: refused')
    t:is(sc.bucket_send_start(nil, SRC, 's2', 3).status, 'OK', 'sending again, generation 4')
    local sent = sc.bucket_send_done(nil, SRC, 4)
    t:is(sent.status, 'OK', 'sent')
    local ev = sc.events_read(nil, sent.seq - 1, {'bucket.'}, 1, 0).events[1]
    t:is_deeply({ev and ev.topic, ev and ev.payload.to, ev and ev.payload.generation}, {'bucket.sent', 's2', 4},
                'a bucket.sent event, in the same transaction')
    t:is(sc.bucket_send_done(nil, SRC, 4).status, 'OK', 'again: OK')
    local r = sc.session_get(nil, sid)
    t:is_deeply({r.status, r.bucket, r.owner}, {'WRONG_BUCKET', SRC, 's2'}, 'refused, naming s2')
end)

test:test('gc: a sent bucket\'s rows deleted in batches, then its row', function(t)
    t:plan(5)
    t:is(sc.bucket_gc(nil, SRC, 3).status, 'BUCKET_STATE', 'at another generation: refused')
    local saved = moves.DELETE_BATCH
    moves.DELETE_BATCH = 1
    local r = sc.bucket_gc(nil, SRC, 4)
    moves.DELETE_BATCH = saved
    t:is_deeply({r.status, r.deleted, r.done}, {'OK', 3, true}, 'three rows deleted, one per transaction')
    t:is(rows_of(SRC), 0, 'none left')
    t:is(box.space.sc_buckets:get(SRC), nil, 'the bucket is gone from this shard')
    t:is(sc.bucket_gc(nil, SRC, 4).status, 'OK', 'again: OK (nothing to do)')
end)

-- The destination's side, on bucket DST (not held here).
local far = client_of(DST)
local far_sid = buckets.session_id(require('uuid').str(), DST)
local now = require('smartcache.util').now_ms()
local session_row = {far_sid, far, '1', 1, now, 600000, now + 600000, {v = 9}, now, box.NULL, DST}
local cache_row = {far_sid, 'k', 1, now, 600000, now + 600000, {9}, DST}

test:test('recv_start, recv, recv_done: a copy written as it is, then active', function(t)
    t:plan(10)
    t:is(sc.bucket_recv(nil, DST, 2, 'sessions', {session_row}).status, 'BUCKET_STATE', 'before recv_start: refused')
    t:is(sc.bucket_recv_start(nil, DST, 's1', 2).status, 'OK', 'receiving from s1 at generation 2')
    t:is(sc.session_get(nil, far_sid).status, 'BUCKET_MOVING', 'not served while receiving')
    local wrong = {unpack(session_row, 1, 11)}
    wrong[11] = DST + 1
    t:is(sc.bucket_recv(nil, DST, 2, 'sessions', {wrong}).status, 'BAD_REQUEST', 'a row of another bucket: refused')
    t:is(sc.bucket_recv(nil, DST, 2, 'sessions', {session_row}).written, 1, 'the session written')
    t:is(sc.bucket_recv(nil, DST, 2, 'cache', {cache_row}).written, 1, 'its cache entry written')
    t:is(sc.bucket_recv(nil, DST, 2, 'cache', {cache_row}).written, 1, 'a chunk again (a retried send): the same row')
    local done = sc.bucket_recv_done(nil, DST, 2)
    t:is(done.status, 'OK', 'active')
    local ev = sc.events_read(nil, done.seq - 1, {'bucket.'}, 1, 0).events[1]
    t:is_deeply({ev and ev.topic, ev and ev.key, ev and ev.payload.from}, {'bucket.received', tostring(DST), 's1'},
                'a bucket.received event, in the same transaction')
    local got = sc.session_get(nil, far_sid)
    t:is_deeply({got.status, got.data and got.data.v}, {'OK', 9}, 'served, with its data')
end)

test:test('recv_start refuses a bucket active here: never active twice', function(t)
    t:plan(2)
    t:is(sc.bucket_recv_start(nil, DST, 's1', 5).status, 'BUCKET_STATE', 'active here: refused')
    t:is(sc.bucket_recv_abort(nil, DST, 5).status, 'BUCKET_STATE', 'and an active bucket is not aborted')
end)

test:test('vshard#576/#412: a copy left by a move given up is replaced, not doubled, by the next move', function(t)
    t:plan(6)
    local B = 7
    box.space.sc_buckets:delete(B)  -- not held: it will be received twice
    local c = client_of(B)
    local s7 = buckets.session_id(require('uuid').str(), B)
    local row = {s7, c, '1', 1, now, 600000, now + 600000, {v = 1}, now, box.NULL, B}
    t:is(sc.bucket_recv_start(nil, B, 's1', 2).status, 'OK', 'first move: receiving at 2')
    sc.bucket_recv(nil, B, 2, 'sessions', {row})
    -- The source's leader changed and its new leader rolled the move back (send_abort: generation 3),
    -- then moved the bucket again (generation 4): the copy at 2 must not become active or stay.
    t:is(sc.bucket_recv_done(nil, B, 3).status, 'BUCKET_STATE', 'the old copy is not made active at 3')
    local r = sc.bucket_recv_start(nil, B, 's1', 4)
    t:is_deeply({r.status, r.generation}, {'OK', 4}, 'the next move: receiving at 4, the old copy deleted first')
    t:is(rows_of(B), 0, 'no row of the old copy left')
    t:is(sc.bucket_recv_start(nil, B, 's1', 3).status, 'BUCKET_STATE', 'an older move after it: refused')
    t:is(sc.bucket_recv_abort(nil, B, 4).status, 'OK', 'and given up: rows and row gone')
end)

test:test('vshard#665: a chunk sent to a destination whose leader changed is not lost silently', function(t)
    t:plan(3)
    local B = 9
    box.space.sc_buckets:delete(B)
    t:is(sc.bucket_recv_start(nil, B, 's1', 2).status, 'OK', 'receiving')
    -- This instance stops being writable (a leader change): the chunk is answered NOT_LEADER, not OK,
    -- so the driver sends it again to the new leader instead of counting it as copied.
    local util = require('smartcache.util')
    local was = util.writable
    util.writable = function() return false end
    local row = {buckets.session_id(require('uuid').str(), B), client_of(B), '1', 1, now, 600000, now + 600000,
                 box.NULL, now, box.NULL, B}
    local r = sc.bucket_recv(nil, B, 2, 'sessions', {row})
    util.writable = was
    t:is(r.status, 'NOT_LEADER', 'not the leader: NOT_LEADER')
    t:is(rows_of(B), 0, 'and nothing written')
end)

test:test('waiters on an object of a bucket that begins to move answer BUCKET_MOVING at once', function(t)
    t:plan(4)
    local B = 11
    local latch, queue = client_of(B), client_of(B, client_of(B))
    sc.latch_create(nil, latch, 1, 60000)
    local answers = {}
    local started = fiber.clock()
    fiber.create(function() answers.latch = sc.latch_await(nil, latch, 5000) end)
    fiber.create(function() answers.queue = sc.queue_take(nil, queue, 5000) end)
    sc.prewarm_acquire(nil, latch, 1, 'owner', 60000, 60000, '', '1')
    fiber.create(function() answers.prewarm = sc.prewarm_wait(nil, latch, 1, 5000) end)
    fiber.sleep(0.05)
    t:is(sc.bucket_send_start(nil, B, 's2', 1).status, 'OK', 'the bucket begins to move')
    fiber.sleep(0.05)
    t:is_deeply({answers.latch and answers.latch.status, answers.queue and answers.queue.status},
                {'BUCKET_MOVING', 'BUCKET_MOVING'}, 'the latch and queue waiters: BUCKET_MOVING')
    t:is(answers.prewarm and answers.prewarm.status, 'BUCKET_MOVING', 'the prewarm waiter too')
    t:ok(fiber.clock() - started < 1, 'at once, not at their timeout')
    sc.bucket_send_abort(nil, B, 2)
end)

test:test('recv_abort marks the copy aborting first: no chunk or recv_done is taken while it is deleted', function(t)
    t:plan(5)
    local B = 12
    box.space.sc_buckets:delete(B)
    local row = {buckets.session_id(require('uuid').str(), B), client_of(B), '1', 1, now, 600000, now + 600000,
                 box.NULL, now, box.NULL, B}
    sc.bucket_recv_start(nil, B, 's1', 2)
    sc.bucket_recv(nil, B, 2, 'sessions', {row})
    local row2 = {buckets.session_id(require('uuid').str(), B), client_of(B), '1', 1, now, 600000, now + 600000,
                  box.NULL, now, box.NULL, B}
    sc.bucket_recv(nil, B, 2, 'sessions', {row2})
    local saved = moves.DELETE_BATCH
    moves.DELETE_BATCH = 1
    local aborted
    fiber.create(function() aborted = sc.bucket_recv_abort(nil, B, 2) end)
    t:is(box.space.sc_buckets:get(B)[2], 'aborting', 'marked aborting before its rows go')
    t:is(sc.bucket_recv_done(nil, B, 2).status, 'BUCKET_STATE', 'recv_done refused while it is deleted')
    t:is(sc.bucket_recv(nil, B, 2, 'sessions', {row}).status, 'BUCKET_STATE', 'a chunk refused too')
    fiber.sleep(0.1)
    moves.DELETE_BATCH = saved
    t:is_deeply({aborted and aborted.status, aborted and aborted.done}, {'OK', true}, 'then gone')
    t:is(box.space.sc_buckets:get(B), nil, 'rows and row')
end)

test:test('the fence refuses deletes of a bucket not active here; expiry passes over its rows', function(t)
    t:plan(5)
    local B = 13
    local expiry = require('smartcache.expiry')
    local c = client_of(B)
    local sid13 = sc.session_create(nil, nil, c, nil, 600, {v = 1}).session_id
    box.space.sessions:update(sid13, {{'=', 7, 1}})  -- its deadline passed (active still: written)
    local was = expiry.set_paused(true)
    t:is(sc.bucket_send_start(nil, B, 's2', 1).status, 'OK', 'sending')
    local ok, err = pcall(box.atomic, function() box.space.sessions:delete(sid13) end)
    t:is(ok, false, 'a delete of its row fails: ' .. tostring(err))
    local n = expiry.sweep_once('sessions')
    t:is(box.space.sessions:get(sid13) ~= nil, true, 'the sweeper passed over it (' .. tostring(n) .. ' deleted)')
    t:is(sc.bucket_send_abort(nil, B, 2).status, 'OK', 'active again')
    expiry.sweep_once('sessions')
    t:is(box.space.sessions:get(sid13), nil, 'and then it expires here')
    expiry.set_paused(was)
end)

test:test('numbers: a moved holder\'s token and the source\'s sequences stay below what is handed out next', function(t)
    t:plan(4)
    local B = 14
    box.space.sc_buckets:delete(B)
    local name = client_of(B)
    t:is(sc.bucket_recv_start(nil, B, 's1', 2, {sc_fence = 500, sc_task_id = 700}).status, 'OK', 'receiving')
    local holder = {name, 'h1', 900, 1, now, now + 600000, B}
    t:is(sc.bucket_recv(nil, B, 2, 'semaphore_holders', {holder}).written, 1, 'a holder with token 900 moved in')
    sc.bucket_recv_done(nil, B, 2)
    local st = sc.bucket_state(nil, B)
    t:ok(st.numbers.sc_fence >= 900 and st.numbers.sc_task_id >= 700, 'the sequences raised: '
         .. tostring(st.numbers.sc_fence) .. ', ' .. tostring(st.numbers.sc_task_id))
    local got = sc.semaphore_acquire(nil, client_of(B, name), 1, 'h2', 60000, 0)
    t:ok(got.status == 'OK' and got.token > 900, 'the next token: ' .. tostring(got.token))
end)

test:test('recv_start takes over the garbage of an older move away from here (the bucket comes back)', function(t)
    t:plan(3)
    local B = 15
    box.space.sc_buckets:replace({B, 'garbage', 4, 's2', now})  -- a gc that never finished
    box.space.sc_buckets:replace({B, 'garbage', 4, 's2', now})
    t:is(sc.bucket_recv_start(nil, B, 's2', 5).status, 'OK', 'receiving at 5: the garbage at 4 is stale')
    t:is(box.space.sc_buckets:get(B)[2], 'receiving', 'receiving')
    t:is(sc.bucket_recv_start(nil, B, 's2', 3).status, 'BUCKET_STATE', 'an older move is refused')
end)

test:test('recv_start asked again after a failover cut it short (aborting, its own mark): it purges on', function(t)
    t:plan(5)
    local B = 10
    box.space.sc_buckets:delete(B)
    local row = {buckets.session_id(require('uuid').str(), B), client_of(B), '1', 1, now, 600000, now + 600000,
                 box.NULL, now, box.NULL, B}
    sc.bucket_recv_start(nil, B, 's1', 1)
    sc.bucket_recv(nil, B, 1, 'sessions', {row})  -- a row of an older copy, not yet purged
    -- What the old leader committed before it died: the mark of recv_start at 2 from s1, nothing after.
    box.space.sc_buckets:replace({B, 'aborting', 2, 's1', now})
    t:is(sc.bucket_recv_start(nil, B, 's2', 2).status, 'BUCKET_STATE', 'from another source: refused')
    local r = sc.bucket_recv_start(nil, B, 's1', 2)
    t:is_deeply({r.status, r.state, r.generation}, {'OK', 'receiving', 2}, 'the same again: receiving at 2')
    t:is(rows_of(B), 0, 'what was here purged first')
    t:is(sc.bucket_recv(nil, B, 2, 'sessions', {row}).written, 1, 'and the copy goes on')
    t:is(sc.bucket_recv_abort(nil, B, 2).status, 'OK', 'given up: gone')
end)

test:test('state and held answer NOT_LEADER off the leader: nobody decides on a lagging row', function(t)
    t:plan(2)
    local util = require('smartcache.util')
    local was = util.writable
    util.writable = function() return false end
    local s1, s2 = sc.bucket_state(nil, 1).status, sc.buckets_held(nil).status
    util.writable = was
    t:is(s1, 'NOT_LEADER', 'bucket_state')
    t:is(s2, 'NOT_LEADER', 'buckets_held')
end)

test:test('buckets_held: the active buckets and the moving ones with their rows', function(t)
    t:plan(3)
    local r = sc.buckets_held(nil)
    t:is(r.status, 'OK', 'answered')
    local moving = {}
    for _, m in ipairs(r.moving) do
        moving[m.bucket] = m.state
    end
    t:is(moving[9], 'receiving', 'bucket 9 receiving')
    t:is(#r.active + #r.moving, box.space.sc_buckets:len(), 'every bucket held here, active or moving')
    fiber.yield()
end)

test:test('the transitions are data: every step is an edge, and a change that is no edge is refused', function(t)
    t:plan(4)
    local transitions = require('smartcache.sharding.transitions')
    local BUCKET = require('smartcache.sharding.consts').BUCKET
    local missing = {}
    for name, step in pairs(transitions.STEPS) do
        if transitions.EDGES[step.from][step.to] == nil then
            table.insert(missing, name)
        end
    end
    t:is_deeply(missing, {}, 'every step of STEPS is in EDGES')
    local states = {[transitions.NONE] = true}
    for _, status in pairs(BUCKET) do
        states[status] = true
    end
    local unknown = {}
    for from, tos in pairs(transitions.EDGES) do
        for to in pairs(tos) do
            if not states[from] or not states[to] then
                table.insert(unknown, from .. ' -> ' .. to)
            end
        end
    end
    t:is_deeply(unknown, {}, 'EDGES names the states of BUCKET only')
    local active = box.space.sc_buckets:select({}, {iterator = 'ALL'})
    for _, row in ipairs(active) do
        if row[2] == BUCKET.ACTIVE then
            active = row
            break
        end
    end
    local ok, err = pcall(box.atomic, function()
        transitions.set(active[1], active, BUCKET.SENT, active[3], 's9')  -- active -> sent skips sending
    end)
    t:ok(not ok and tostring(err):find('no transition active -> sent', 1, true) ~= nil, 'active -> sent raises')
    t:is(box.space.sc_buckets:get(active[1])[2], BUCKET.ACTIVE, 'and the row stays as it was')
end)

helper.finish(test)
