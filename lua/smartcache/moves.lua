-- Moves of buckets between shards (online resharding). lua/README.md, "Moving a
-- bucket", lists the states and every transition with who makes it and what each
-- failure leaves; docs/design/resharding.md is the design.
--
-- A bucket's row in sc_buckets is {id, status, generation, peer, since}; answers
-- call its status `state` (`status` is the answer's own). Every
-- transition is one synchronous transaction on the shard's leader that checks
-- the row's status and generation first (a compare-and-set), so a repeat of a
-- transition already made answers OK and a transition from the wrong state or
-- generation changes nothing: any number of drivers (the operator's command, the
-- settler of every service instance) may drive one move at once.
--
--   source: active --send_start--> sending --send_done--> sent --gc--> garbage --gc--> (row gone)
--                      \--send_abort (generation + 1)--> active
--   destination: (none) --recv_start--> receiving --recv_done--> active
--                                          \--recv_abort--> (rows and row gone)
--
-- The order that keeps a bucket active on at most one shard: the destination
-- turns active only after the source is sent (the driver's rule, checked by the
-- generation both carry), and the source copy goes only after the destination
-- is active, its rows on its quorum.
local fiber = require('fiber')
local key_def = require('key_def')
local schema = require('smartcache.schema')
local util = require('smartcache.util')
local buckets = require('smartcache.buckets')
local events = require('smartcache.events')
local waitlist = require('smartcache.waitlist')
local prewarm = require('smartcache.prewarm')

local M = {}

-- Rows per chunk of a copy, and per transaction of a deletion.
M.CHUNK_MAX = 2000
M.DELETE_BATCH = 500

local STATUS, GEN, PEER, SINCE = 2, 3, 4, 5

local function describe(t)
    if t == nil then
        return {state = box.NULL}
    end
    return {state = t[STATUS], generation = t[GEN], peer = t[PEER] or box.NULL, since = t[SINCE] or box.NULL}
end

local function answer(status, bucket, t, fields)
    local out = describe(t)
    out.bucket = bucket
    for k, v in pairs(fields or {}) do
        out[k] = v
    end
    return util.result(status, out)
end

local function refused(bucket, t, wanted)
    return answer('BUCKET_STATE', bucket, t, {message = string.format('bucket %d is %s here, not %s', bucket,
        t and string.format('%s (generation %d)', t[STATUS], t[GEN]) or 'not held', wanted)})
end

-- The checks every transition makes first: a sharded shard, a bucket in range, its leader.
local function check(bucket, generation)
    local count = buckets.count()
    if count == nil then
        return util.result('NOT_SHARDED', {message = 'this replica set is not a shard of a sharded cluster'})
    end
    if type(bucket) ~= 'number' or bucket ~= math.floor(bucket) or bucket < 0 or bucket >= count then
        return util.bad_request(string.format('bucket must be an integer in 0..%d', count - 1))
    end
    if generation ~= nil and (type(generation) ~= 'number' or generation ~= math.floor(generation)
            or generation < 0) then
        return util.bad_request('generation must be a non-negative integer')
    end
    if not util.writable() then
        return util.result('NOT_LEADER')
    end
    return nil
end

local function set(bucket, status, generation, peer)
    box.space.sc_buckets:replace({bucket, status, generation, peer or box.NULL, util.now_ms()})
end

-- Delete up to limit rows of bucket, space after space, in one transaction; how many.
local function delete_some(bucket, limit)
    local deleted = 0
    util.atomic(function()
        for _, name in ipairs(schema.SHARDED) do
            local space = box.space[name]
            local pk = space.index.primary
            for _, t in space.index.by_bucket:pairs({bucket}, {iterator = 'EQ'}) do
                if deleted >= limit then
                    return
                end
                space:delete(key_def.new(pk.parts):extract_key(t))
                deleted = deleted + 1
            end
        end
    end)
    return deleted
end

-- Every row of bucket deleted, DELETE_BATCH per transaction, yielding between.
local function purge(bucket)
    local total = 0
    while true do
        local n = delete_some(bucket, M.DELETE_BATCH)
        total = total + n
        if n == 0 then
            return total
        end
        fiber.yield()
    end
end

-- sc.bucket_state(bucket): the bucket's row here and how many rows it has in each space.
function M.state(bucket)
    local count = buckets.count()
    if count == nil then
        return util.result('NOT_SHARDED', {message = 'this replica set is not a shard of a sharded cluster'})
    end
    local t = box.space.sc_buckets:get(bucket)
    local rows = 0
    for _, name in ipairs(schema.SHARDED) do
        rows = rows + box.space[name].index.by_bucket:count({bucket})
    end
    return answer('OK', bucket, t, {rows = rows, now_ms = util.now_ms()})
end

-- sc.buckets_held(): the buckets active here ({bucket, generation} each), and
-- every bucket in another state with its row (what the settler and `cluster
-- status` read).
function M.held()
    local count = buckets.count()
    if count == nil then
        return util.result('NOT_SHARDED', {message = 'this replica set is not a shard of a sharded cluster'})
    end
    local active, moving = {}, {}
    for _, t in box.space.sc_buckets:pairs() do
        if t[STATUS] == 'active' then
            table.insert(active, {t[1], t[GEN]})
        else
            local d = describe(t)
            d.bucket = t[1]
            table.insert(moving, d)
        end
    end
    return util.result('OK', {count = count, active = active, moving = moving, now_ms = util.now_ms(),
                              writable = util.writable()})
end

-- sc.bucket_send_start(bucket, destination, generation): active at generation ->
-- sending to destination at generation + 1. From then on every call of the bucket
-- is answered BUCKET_MOVING (retryable) and a write already under way that has not
-- written yet fails at its write (the stamping trigger checks the state).
function M.send_start(bucket, destination, generation)
    local bad = check(bucket, generation)
    if bad ~= nil then
        return bad
    end
    if type(destination) ~= 'string' or destination == '' then
        return util.bad_request('destination must be a shard name')
    end
    local r = util.atomic(function()
        local t = box.space.sc_buckets:get(bucket)
        if t ~= nil and t[STATUS] == 'sending' and t[PEER] == destination and t[GEN] == generation + 1 then
            return answer('OK', bucket, t)  -- a repeat
        end
        if t == nil or t[STATUS] ~= 'active' or t[GEN] ~= generation then
            return refused(bucket, t, string.format('active at generation %d', generation))
        end
        set(bucket, 'sending', generation + 1, destination)
        return answer('OK', bucket, box.space.sc_buckets:get(bucket))
    end)
    if r.status == 'OK' then
        -- Those waiting here on an object of the bucket (a latch, a permit, a task, a prewarm) answer
        -- BUCKET_MOVING now, and the service asks again where the bucket goes, instead of waiting here on.
        local count = buckets.count()
        local function of_bucket(key)
            return type(key) == 'string' and buckets.of(key, count) == bucket
        end
        waitlist.wake_keys(of_bucket)
        prewarm.wake_clients(of_bucket)
    end
    return r
end

-- sc.bucket_send_abort(bucket, generation): sending at generation -> active at
-- generation + 1 (a move given up: the destination's copy, at generation, can no
-- longer be made active by anyone, since this shard will never be sent at it).
function M.send_abort(bucket, generation)
    local bad = check(bucket, generation)
    if bad ~= nil then
        return bad
    end
    return util.atomic(function()
        local t = box.space.sc_buckets:get(bucket)
        if t ~= nil and t[STATUS] == 'active' and t[GEN] == generation + 1 then
            return answer('OK', bucket, t)
        end
        if t == nil or t[STATUS] ~= 'sending' or t[GEN] ~= generation then
            return refused(bucket, t, string.format('sending at generation %d', generation))
        end
        set(bucket, 'active', generation + 1, nil)
        return answer('OK', bucket, box.space.sc_buckets:get(bucket))
    end)
end

-- sc.bucket_send_done(bucket, generation): sending -> sent (the copy is complete on
-- the destination's quorum). Calls of the bucket are answered WRONG_BUCKET with
-- the destination as its owner from then on.
function M.send_done(bucket, generation)
    local bad = check(bucket, generation)
    if bad ~= nil then
        return bad
    end
    return util.atomic(function()
        local t = box.space.sc_buckets:get(bucket)
        if t ~= nil and (t[STATUS] == 'sent' or t[STATUS] == 'garbage') and t[GEN] == generation then
            return answer('OK', bucket, t)
        end
        if t == nil or t[STATUS] ~= 'sending' or t[GEN] ~= generation then
            return refused(bucket, t, string.format('sending at generation %d', generation))
        end
        set(bucket, 'sent', generation, t[PEER])
        -- The last event of the bucket's keys in this shard's log (docs/design/resharding.md, "Events").
        local seq = events.write('bucket.sent', tostring(bucket), {bucket = bucket, to = t[PEER],
                                                                  generation = generation})
        return answer('OK', bucket, box.space.sc_buckets:get(bucket), {seq = seq or box.NULL})
    end)
end

-- sc.bucket_gc(bucket, generation): a sent bucket's rows deleted, DELETE_BATCH per
-- transaction (the first turns it garbage); when none is left its row goes too.
-- Answers OK {deleted, done}; done once the bucket is gone from this shard.
function M.gc(bucket, generation)
    local bad = check(bucket, generation)
    if bad ~= nil then
        return bad
    end
    local t = box.space.sc_buckets:get(bucket)
    if t == nil then
        return answer('OK', bucket, t, {deleted = 0, done = true})
    end
    if (t[STATUS] ~= 'sent' and t[STATUS] ~= 'garbage') or t[GEN] ~= generation then
        return refused(bucket, t, string.format('sent at generation %d', generation))
    end
    if t[STATUS] == 'sent' then
        util.atomic(set, bucket, 'garbage', generation, t[PEER])
    end
    local deleted = purge(bucket)
    util.atomic(function()
        local now = box.space.sc_buckets:get(bucket)
        if now ~= nil and now[STATUS] == 'garbage' and now[GEN] == generation then
            box.space.sc_buckets:delete(bucket)
        end
    end)
    return answer('OK', bucket, nil, {deleted = deleted, done = true})
end

-- sc.bucket_recv_start(bucket, source, generation): receiving from source at
-- generation. A stale copy of an earlier, given-up move (receiving at a lower
-- generation) is deleted first.
function M.recv_start(bucket, source, generation)
    local bad = check(bucket, generation)
    if bad ~= nil then
        return bad
    end
    if type(source) ~= 'string' or source == '' then
        return util.bad_request('source must be a shard name')
    end
    local t = box.space.sc_buckets:get(bucket)
    if t ~= nil and t[STATUS] == 'receiving' and t[GEN] == generation and t[PEER] == source then
        return answer('OK', bucket, t)
    end
    if t ~= nil and not (t[STATUS] == 'receiving' and t[GEN] < generation) then
        return refused(bucket, t, 'absent (or receiving at a lower generation)')
    end
    if t ~= nil then
        purge(bucket)
    end
    if box.space.sc_buckets:get(bucket) ~= nil and box.space.sc_buckets:get(bucket)[GEN] >= generation then
        return refused(bucket, box.space.sc_buckets:get(bucket), 'absent')  -- changed while purging
    end
    util.atomic(set, bucket, 'receiving', generation, source)
    return answer('OK', bucket, box.space.sc_buckets:get(bucket))
end

-- The sequences whose numbers rows carry: a moved row's number must stay below
-- what this shard hands out next (a fencing token only grows; a task id is unique).
local NUMBERED = {semaphore_holders = {'token', 'sc_fence'}, queue_tasks = {'id', 'sc_task_id'}}

local function advance(name, t)
    local numbered = NUMBERED[name]
    if numbered == nil then
        return
    end
    local seq = box.sequence[numbered[2]]
    local v = t[schema.F[name][numbered[1]]]
    if seq ~= nil and type(v) == 'number' and seq:current() < v then
        seq:set(v)
    end
end

-- sc.bucket_recv(bucket, generation, space, rows): a chunk of the copy, written as
-- it is (one transaction). Each row must be of this bucket by storage's own
-- computation, and must not take the key of another bucket's row here.
function M.recv(bucket, generation, space_name, rows)
    local bad = check(bucket, generation)
    if bad ~= nil then
        return bad
    end
    local space = box.space[space_name]
    if schema.F[space_name] == nil or schema.F[space_name].bucket == nil or space == nil then
        return util.bad_request('space must be a sharded space')
    end
    if type(rows) ~= 'table' or #rows > M.CHUNK_MAX then
        return util.bad_request(string.format('rows must be a list of at most %d rows', M.CHUNK_MAX))
    end
    local count, pos = buckets.count(), schema.F[space_name].bucket
    local pk = key_def.new(space.index.primary.parts)
    local t = box.space.sc_buckets:get(bucket)
    if t == nil or t[STATUS] ~= 'receiving' or t[GEN] ~= generation then
        return refused(bucket, t, string.format('receiving at generation %d', generation))
    end
    local tuples = {}
    for i, r in ipairs(rows) do
        local ok, tuple = pcall(box.tuple.new, r)
        if not ok or type(r) ~= 'table' or r[pos] ~= bucket or buckets.of_row(space_name, tuple, count) ~= bucket then
            return util.bad_request(string.format('row %d is not a row of bucket %d', i, bucket))
        end
        local there = space:get(pk:extract_key(tuple))
        if there ~= nil and there[pos] ~= bucket then
            return util.result('CONFLICT', {bucket = bucket, message = string.format(
                'row %d of %s takes the key of a row of bucket %s here', i, space_name, tostring(there[pos]))})
        end
        tuples[i] = tuple
    end
    return util.atomic(function()
        buckets.receiving = bucket
        local ok, err = pcall(function()
            for _, tuple in ipairs(tuples) do
                space:replace(tuple)
                advance(space_name, tuple)
            end
        end)
        buckets.receiving = nil
        if not ok then
            error(err, 0)
        end
        set(bucket, 'receiving', generation, t[PEER])
        return util.result('OK', {bucket = bucket, written = #tuples})
    end)
end

-- sc.bucket_recv_done(bucket, generation): receiving -> active at generation. The
-- driver calls it only once the source is sent at that generation.
function M.recv_done(bucket, generation)
    local bad = check(bucket, generation)
    if bad ~= nil then
        return bad
    end
    return util.atomic(function()
        local t = box.space.sc_buckets:get(bucket)
        if t ~= nil and t[STATUS] == 'active' and t[GEN] == generation then
            return answer('OK', bucket, t)
        end
        if t == nil or t[STATUS] ~= 'receiving' or t[GEN] ~= generation then
            return refused(bucket, t, string.format('receiving at generation %d', generation))
        end
        set(bucket, 'active', generation, nil)
        -- Before the first event of the bucket's keys in this shard's log.
        local seq = events.write('bucket.received', tostring(bucket), {bucket = bucket, from = t[PEER],
                                                                      generation = generation})
        return answer('OK', bucket, box.space.sc_buckets:get(bucket), {seq = seq or box.NULL})
    end)
end

-- sc.bucket_recv_abort(bucket, generation): a copy receiving at generation or
-- lower deleted, rows and row (the source gave the move up, or rolled it back).
function M.recv_abort(bucket, generation)
    local bad = check(bucket, generation)
    if bad ~= nil then
        return bad
    end
    local t = box.space.sc_buckets:get(bucket)
    if t == nil then
        return answer('OK', bucket, t, {deleted = 0})
    end
    if t[STATUS] ~= 'receiving' or t[GEN] > generation then
        return refused(bucket, t, string.format('receiving at generation %d or lower', generation))
    end
    local deleted = purge(bucket)
    util.atomic(function()
        local now = box.space.sc_buckets:get(bucket)
        if now ~= nil and now[STATUS] == 'receiving' and now[GEN] <= generation then
            box.space.sc_buckets:delete(bucket)
        end
    end)
    return answer('OK', bucket, nil, {deleted = deleted})
end

-- sc.bucket_rows(bucket, generation, space, after, limit): a page of the rows of a
-- sending bucket in one space, in primary key order after the key `after` (nil:
-- from the first). The bucket's rows do not change while it is sending (writes
-- are refused; expiry may delete, which a page after a key does not skip over).
function M.rows(bucket, generation, space_name, after, limit)
    local count = buckets.count()
    if count == nil then
        return util.result('NOT_SHARDED', {message = 'this replica set is not a shard of a sharded cluster'})
    end
    local space = box.space[space_name]
    if schema.F[space_name] == nil or schema.F[space_name].bucket == nil or space == nil then
        return util.bad_request('space must be a sharded space')
    end
    limit = util.opt(limit, M.CHUNK_MAX)
    if type(limit) ~= 'number' or limit < 1 or limit > M.CHUNK_MAX then
        return util.bad_request(string.format('limit must be 1..%d', M.CHUNK_MAX))
    end
    local t = box.space.sc_buckets:get(bucket)
    if t == nil or t[STATUS] ~= 'sending' or t[GEN] ~= generation then
        return refused(bucket, t, string.format('sending at generation %d', generation))
    end
    local pk = key_def.new(space.index.primary.parts)
    local out, last = {}, box.NULL
    after = util.opt(after, nil)
    for _, row in space.index.by_bucket:pairs({bucket}, {iterator = 'EQ'}) do
        if after == nil or pk:compare_with_key(row, after) > 0 then
            if #out >= limit then
                return util.result('OK', {rows = out, last = last, done = false})
            end
            table.insert(out, row)
            last = pk:extract_key(row)
        end
    end
    return util.result('OK', {rows = out, last = last, done = true})
end

return M
