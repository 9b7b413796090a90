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
--                                          \--recv_abort--> aborting --> (rows and row gone)
--
-- Every deletion of a bucket's rows (a stale copy, the garbage of a sent bucket) first
-- marks the row (aborting, garbage) in a checked transaction, and each batch it deletes
-- checks the mark again in its own transaction: no purge deletes rows of a copy that
-- another step has taken over since. A transition reads the bucket's row only once no
-- write of it waits for its quorum (Tarantool 2.6 has no MVCC: a read would see it).
--
-- The order that keeps a bucket active on at most one shard: the destination
-- turns active only after the source is sent (the driver's rule, checked by the
-- generation both carry), and the source copy goes only after the destination
-- is active, its rows on its quorum.
local fiber = require('fiber')
local key_def = require('key_def')
local schema = require('smartcache.schema')
local util = require('smartcache.util')
local buckets = require('smartcache.sharding.buckets')
local quorum = require('smartcache.quorum')
local events = require('smartcache.events')

local M = {}

-- Rows per chunk of a copy, and per transaction of a deletion.
M.CHUNK_MAX = 2000
M.DELETE_BATCH = 500

local STATUS, GEN, PEER, SINCE = 2, 3, 4, 5

-- How long a transition waits for a pending write of its bucket's row to get its quorum.
M.PENDING_WAIT_S = 5

-- Who wakes its waiters when a bucket begins to move here (send_start): each fn(match) wakes
-- the fibers waiting on an object whose key `match` says is of the bucket (the coordination
-- waitlists, the prewarm waits), which then answer BUCKET_MOVING. The rooms register at load.
local on_moving = {}

function M.on_moving(fn)
    table.insert(on_moving, fn)
end

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

local NOT_SHARDED = {status = 'NOT_SHARDED', message = 'this replica set is not a shard of a sharded cluster'}

-- The checks every transition makes first: a sharded shard, a bucket in range, its leader, and no
-- write of the bucket's row waiting for its quorum (what follows reads the row, and commits nothing
-- between that read and its own write: no yield).
local function check(bucket, generation)
    local count = buckets.count()
    if count == nil then
        return NOT_SHARDED
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
    if not quorum.wait_key('sc_buckets', bucket, fiber.time() + M.PENDING_WAIT_S) then
        return util.result('BUCKET_STATE', {bucket = bucket, message = 'a write of the bucket\'s row still waits '
            .. 'for its quorum: ask again'})
    end
    if not util.writable() then
        return util.result('NOT_LEADER')
    end
    return nil
end

local function set(bucket, status, generation, peer)
    box.space.sc_buckets:replace({bucket, status, generation, peer or box.NULL, util.now_ms()})
end

local function is(t, status, generation)
    return t ~= nil and t[STATUS] == status and t[GEN] == generation
end

local key_defs = {}
local function pk_of(space)
    local kd = key_defs[space.id]
    if kd == nil then
        kd = key_def.new(space.index.primary.parts)
        key_defs[space.id] = kd
    end
    return kd
end

-- Delete up to limit rows of bucket, space after space, in one transaction, while the bucket's row
-- is still marked (status, generation) (checked in that transaction); how many, or nil when the mark
-- is gone (another step took the bucket over: stop).
local function delete_some(bucket, limit, status, generation)
    return util.atomic(function()
        if not is(box.space.sc_buckets:get(bucket), status, generation) then
            return nil
        end
        local deleted = 0
        buckets.purging = bucket
        local ok, err = pcall(function()
            for _, name in ipairs(schema.SHARDED) do
                local space = box.space[name]
                local pk = pk_of(space)
                local keys = {}
                for _, t in space.index.by_bucket:pairs({bucket}, {iterator = 'EQ'}) do
                    if deleted + #keys >= limit then
                        break
                    end
                    table.insert(keys, pk:extract_key(t))
                end
                for _, key in ipairs(keys) do
                    space:delete(key)
                end
                deleted = deleted + #keys
                if deleted >= limit then
                    return
                end
            end
        end)
        buckets.purging = nil  -- before the commit yields
        if not ok then
            error(err, 0)
        end
        return deleted
    end)
end

-- Every row of bucket deleted while its row is marked (status, generation), DELETE_BATCH per
-- transaction, yielding between; how many, and whether the mark held to the end.
local function purge(bucket, status, generation)
    local total = 0
    while true do
        local n = delete_some(bucket, M.DELETE_BATCH, status, generation)
        if n == nil then
            return total, false
        end
        total = total + n
        if n == 0 then
            return total, true
        end
        fiber.yield()
    end
end

local function rows_of(bucket)
    local rows = 0
    for _, name in ipairs(schema.SHARDED) do
        rows = rows + box.space[name].index.by_bucket:count({bucket})
    end
    return rows
end

-- What the sequences that rows carry numbers of have handed out here (nil: never used).
local NUMBERED = {semaphore_holders = {'token', 'sc_fence'}, queue_tasks = {'id', 'sc_task_id'}}

local function current(seq_name)
    local seq = box.sequence[seq_name]
    if seq == nil then
        return nil
    end
    local ok, v = pcall(seq.current, seq)  -- raises on a sequence never used (2.6)
    return ok and v or nil
end

local function numbers()
    return {sc_fence = current('sc_fence') or box.NULL, sc_task_id = current('sc_task_id') or box.NULL}
end

-- Raise a sequence to at least v: what this shard hands out next stays above what the rows
-- and the source handed out (a fencing token only grows; a task id is unique).
local function raise(seq_name, v)
    local seq = box.sequence[seq_name]
    if seq ~= nil and type(v) == 'number' then
        local cur = current(seq_name)
        if cur == nil or cur < v then
            seq:set(v)
        end
    end
end

-- sc.bucket_state(bucket): the bucket's row here, how many rows it has (every space), the numbers
-- this shard's sequences handed out, and this instance's clock. NOT_LEADER off the leader (a
-- follower's or a deposed leader's row may lag: nobody decides on it).
function M.state(bucket)
    local count = buckets.count()
    if count == nil then
        return NOT_SHARDED
    end
    if type(bucket) ~= 'number' or bucket ~= math.floor(bucket) or bucket < 0 or bucket >= count then
        return util.bad_request(string.format('bucket must be an integer in 0..%d', count - 1))
    end
    if not util.writable() then
        return util.result('NOT_LEADER')
    end
    local settled = quorum.wait_key('sc_buckets', bucket, fiber.time() + M.PENDING_WAIT_S)
    local t = box.space.sc_buckets:get(bucket)
    return answer('OK', bucket, t, {rows = rows_of(bucket), now_ms = util.now_ms(), numbers = numbers(),
                                    pending = not settled})
end

-- sc.buckets_held(): the buckets active here ({bucket, generation} each), and every bucket in
-- another state with its row, marked pending while a write of it waits for its quorum (what the
-- settler and `cluster status` read). NOT_LEADER off the leader.
function M.held()
    local count = buckets.count()
    if count == nil then
        return NOT_SHARDED
    end
    if not util.writable() then
        return util.result('NOT_LEADER')
    end
    local active, moving = {}, {}
    for _, t in box.space.sc_buckets:pairs() do
        if t[STATUS] == 'active' then
            table.insert(active, {t[1], t[GEN]})
        else
            local d = describe(t)
            d.bucket = t[1]
            d.pending = quorum.is_pending('sc_buckets', t[1])
            table.insert(moving, d)
        end
    end
    return util.result('OK', {count = count, active = active, moving = moving, now_ms = util.now_ms(),
                              writable = true})
end

-- sc.bucket_send_start(bucket, destination, generation): active at generation ->
-- sending to destination at generation + 1. From then on every call of the bucket
-- is answered BUCKET_MOVING (retryable), a write already under way that has not
-- written yet fails at its write (the stamping trigger checks the state), and the
-- fibers waiting on an object of the bucket answer BUCKET_MOVING.
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
        if is(t, 'sending', generation + 1) and t[PEER] == destination then
            return answer('OK', bucket, t)  -- a repeat
        end
        if not is(t, 'active', generation) then
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
        for _, wake in ipairs(on_moving) do
            wake(of_bucket)
        end
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
        if is(t, 'active', generation + 1) then
            return answer('OK', bucket, t)
        end
        if not is(t, 'sending', generation) then
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
        if is(t, 'sent', generation) or is(t, 'garbage', generation) then
            return answer('OK', bucket, t)
        end
        if not is(t, 'sending', generation) then
            return refused(bucket, t, string.format('sending at generation %d', generation))
        end
        set(bucket, 'sent', generation, t[PEER])
        -- The last event of the bucket's keys in this shard's log (docs/design/resharding.md, "Events").
        local seq = events.write('bucket.sent', tostring(bucket), {bucket = bucket, to = t[PEER],
                                                                  generation = generation})
        return answer('OK', bucket, box.space.sc_buckets:get(bucket), {seq = seq or box.NULL})
    end)
end

-- sc.bucket_gc(bucket, generation): a sent bucket's rows deleted (it turns garbage
-- first), DELETE_BATCH per transaction; then its row goes too. Answers OK {deleted, done}.
function M.gc(bucket, generation)
    local bad = check(bucket, generation)
    if bad ~= nil then
        return bad
    end
    local t = box.space.sc_buckets:get(bucket)
    if t == nil then
        return answer('OK', bucket, t, {deleted = 0, done = true})
    end
    if not (is(t, 'sent', generation) or is(t, 'garbage', generation)) then
        return refused(bucket, t, string.format('sent at generation %d', generation))
    end
    if t[STATUS] == 'sent' then
        util.atomic(function()
            if is(box.space.sc_buckets:get(bucket), 'sent', generation) then
                set(bucket, 'garbage', generation, t[PEER])
            end
        end)
    end
    local deleted, held = purge(bucket, 'garbage', generation)
    if held then
        util.atomic(function()
            if is(box.space.sc_buckets:get(bucket), 'garbage', generation) then
                box.space.sc_buckets:delete(bucket)
            end
        end)
    end
    return answer('OK', bucket, box.space.sc_buckets:get(bucket), {deleted = deleted, done = held})
end

-- sc.bucket_recv_start(bucket, source, generation, numbers?): receiving from source at
-- generation. Whatever of the bucket is here already (a copy of an earlier, given-up
-- move; the garbage of a move away from here; rows of a bucket not held) is deleted
-- first. numbers: the source's sequences ({sc_fence, sc_task_id}), raised to here.
-- A recv_start cut short by a failover leaves the row aborting at this generation from
-- this source (its own mark, committed before the purge): asked again, it purges on
-- from that mark. Taking over a recv_abort's mark of the same copy is as safe: nothing
-- makes a copy active but the source sent at its generation.
function M.recv_start(bucket, source, generation, nums)
    local bad = check(bucket, generation)
    if bad ~= nil then
        return bad
    end
    if type(source) ~= 'string' or source == '' then
        return util.bad_request('source must be a shard name')
    end
    nums = util.opt(nums, {})
    if type(nums) ~= 'table' then
        return util.bad_request('numbers must be a map {sc_fence, sc_task_id}')
    end
    local first = util.atomic(function()
        local t = box.space.sc_buckets:get(bucket)
        if is(t, 'receiving', generation) and t[PEER] == source then
            return answer('OK', bucket, t)  -- a repeat
        end
        if is(t, 'aborting', generation) and t[PEER] == source then
            return nil  -- a repeat of one cut short: its purge goes on
        end
        local stale = t == nil or (t[GEN] < generation and (t[STATUS] == 'receiving' or t[STATUS] == 'aborting'
            or t[STATUS] == 'sent' or t[STATUS] == 'garbage'))
        if not stale then
            return refused(bucket, t, 'absent (or an older copy or garbage)')
        end
        set(bucket, 'aborting', generation, source)  -- what is here goes first
        return nil
    end)
    if first ~= nil then
        return first
    end
    local _, held = purge(bucket, 'aborting', generation)
    if not held then
        return refused(bucket, box.space.sc_buckets:get(bucket), 'as it was (taken over while purging)')
    end
    return util.atomic(function()
        local t = box.space.sc_buckets:get(bucket)
        if not is(t, 'aborting', generation) then
            return refused(bucket, t, 'as it was (taken over while purging)')
        end
        raise('sc_fence', nums.sc_fence)
        raise('sc_task_id', nums.sc_task_id)
        set(bucket, 'receiving', generation, source)
        return answer('OK', bucket, box.space.sc_buckets:get(bucket))
    end)
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
    local pk = pk_of(space)
    local t = box.space.sc_buckets:get(bucket)
    if not is(t, 'receiving', generation) then
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
    local numbered = NUMBERED[space_name]
    return util.atomic(function()
        if not is(box.space.sc_buckets:get(bucket), 'receiving', generation) then
            return refused(bucket, box.space.sc_buckets:get(bucket), 'receiving')
        end
        buckets.receiving = bucket
        local ok, err = pcall(function()
            for _, tuple in ipairs(tuples) do
                space:replace(tuple)
                if numbered ~= nil then
                    raise(numbered[2], tuple[schema.F[space_name][numbered[1]]])
                end
            end
        end)
        buckets.receiving = nil  -- before the commit yields
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
        if is(t, 'active', generation) then
            return answer('OK', bucket, t)
        end
        if not is(t, 'receiving', generation) then
            return refused(bucket, t, string.format('receiving at generation %d', generation))
        end
        set(bucket, 'active', generation, nil)
        -- Before the first event of the bucket's keys in this shard's log.
        local seq = events.write('bucket.received', tostring(bucket), {bucket = bucket, from = t[PEER],
                                                                      generation = generation})
        return answer('OK', bucket, box.space.sc_buckets:get(bucket), {seq = seq or box.NULL})
    end)
end

-- sc.bucket_recv_abort(bucket, generation): a copy receiving (or being deleted) at
-- generation or lower deleted, rows and row: the source gave the move up, or rolled it
-- back. It is marked aborting first (no chunk and no recv_done is taken from then on).
function M.recv_abort(bucket, generation)
    local bad = check(bucket, generation)
    if bad ~= nil then
        return bad
    end
    local mark = util.atomic(function()
        local t = box.space.sc_buckets:get(bucket)
        if t == nil then
            return {done = answer('OK', bucket, t, {deleted = 0})}
        end
        if (t[STATUS] ~= 'receiving' and t[STATUS] ~= 'aborting') or t[GEN] > generation then
            return {done = refused(bucket, t, string.format('receiving at generation %d or lower', generation))}
        end
        if t[STATUS] == 'receiving' then
            set(bucket, 'aborting', t[GEN], t[PEER])
        end
        return {generation = t[GEN]}
    end)
    if mark.done ~= nil then
        return mark.done
    end
    local deleted, held = purge(bucket, 'aborting', mark.generation)
    if held then
        util.atomic(function()
            if is(box.space.sc_buckets:get(bucket), 'aborting', mark.generation) then
                box.space.sc_buckets:delete(bucket)
            end
        end)
    end
    return answer('OK', bucket, box.space.sc_buckets:get(bucket), {deleted = deleted, done = held})
end

-- sc.bucket_rows(bucket, generation, space, after, limit): a page of the rows of a
-- sending bucket in one space, in primary key order after the key `after` (nil:
-- from the first). The bucket's rows do not change while it is sending: writes and
-- deletes are refused (the stamping trigger), expiry and queue timeouts pass over them.
-- A page after a key scans the bucket's rows before it (O(rows of the bucket) a page).
function M.rows(bucket, generation, space_name, after, limit)
    local count = buckets.count()
    if count == nil then
        return NOT_SHARDED
    end
    local space = box.space[space_name]
    if schema.F[space_name] == nil or schema.F[space_name].bucket == nil or space == nil then
        return util.bad_request('space must be a sharded space')
    end
    limit = util.opt(limit, M.CHUNK_MAX)
    if type(limit) ~= 'number' or limit < 1 or limit > M.CHUNK_MAX then
        return util.bad_request(string.format('limit must be 1..%d', M.CHUNK_MAX))
    end
    if not util.writable() then
        return util.result('NOT_LEADER')
    end
    local t = box.space.sc_buckets:get(bucket)
    if not is(t, 'sending', generation) or quorum.is_pending('sc_buckets', bucket) then
        return refused(bucket, t, string.format('sending at generation %d, committed', generation))
    end
    local pk = pk_of(space)
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
