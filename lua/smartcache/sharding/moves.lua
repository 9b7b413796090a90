-- Moves of buckets between shards (online resharding). docs/storage-sharding.md,
-- "Moving a bucket", lists the states and every transition with who makes it and
-- what each failure leaves; docs/design/resharding.md is the design.
--
-- A bucket's row in sc_buckets is {id, status, generation, peer, since}; answers
-- call its status `state` (`status` is the answer's own). Every
-- transition is one synchronous transaction on the shard's leader that checks
-- the row's status and generation first (a compare-and-set), so a repeat of a
-- transition already made answers OK and a transition from the wrong state or
-- generation changes nothing: any number of drivers (the operator's command, the
-- settler of every service instance) may drive one move at once.
--
-- smartcache.sharding.transitions holds the states' diagram as data (EDGES) and the
-- transitions made in one checked transaction (STEPS: send_start, send_abort,
-- send_done, recv_done); gc, recv_start and recv_abort mark the row, delete its
-- rows while the mark holds (smartcache.sharding.rows), then finish.
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
local schema = require('smartcache.schema')
local util = require('smartcache.util')
local quorum = require('smartcache.quorum')
local buckets = require('smartcache.sharding.buckets')
local rows = require('smartcache.sharding.rows')
local transitions = require('smartcache.sharding.transitions')
local BUCKET = require('smartcache.sharding.consts').BUCKET

local M = {}

-- Rows per chunk of a copy, and per transaction of a deletion.
M.CHUNK_MAX = 2000
M.DELETE_BATCH = 500

local F = schema.F.sc_buckets  -- id, status, generation, peer, since
local set, is, row, answer, refused = transitions.set, transitions.is, transitions.row, transitions.answer,
    transitions.refused
local check, transit = transitions.check, transitions.transit

-- Who wakes its waiters when a bucket begins to move here (send_start): each fn(match) wakes
-- the fibers waiting on an object whose key `match` says is of the bucket (the coordination
-- waitlists, the prewarm waits), which then answer BUCKET_MOVING. The rooms register at load.
local on_moving = {}

function M.on_moving(fn)
    table.insert(on_moving, fn)
end

local function check_shard(name, what)
    if type(name) ~= 'string' or name == '' then
        return util.bad_request(what .. ' must be a shard name')
    end
    return nil
end

-- Delete bucket's rows while its row stays marked (status, generation); how many, and whether
-- the mark held to the end.
local function purge(bucket, status, generation)
    return rows.purge(bucket, M.DELETE_BATCH, function()
        return is(row(bucket), status, generation)
    end)
end

-- The row gone once a purge under the mark (status, generation) held to the end.
local function unset_if(bucket, status, generation)
    util.atomic(function()
        local t = row(bucket)
        if is(t, status, generation) then
            transitions.unset(bucket, t)
        end
    end)
end

-- A marked copy deleted, rows then row: its rows while its row stays marked (status, generation), then
-- the row when the mark held to the end (gc's garbage, recv_abort's aborting copy). OK {deleted, done}.
local function purged(bucket, status, generation)
    local deleted, held = purge(bucket, status, generation)
    if held then
        unset_if(bucket, status, generation)
    end
    return answer('OK', bucket, row(bucket), {deleted = deleted, done = held})
end

-- sc.bucket_state(bucket): the bucket's row here, how many rows it has (every space), the numbers
-- this shard's sequences handed out, and this instance's clock. NOT_LEADER off the leader (a
-- follower's or a deposed leader's row may lag: nobody decides on it).
function M.state(bucket)
    local bad = transitions.check_bucket(bucket)
    if bad ~= nil then
        return bad
    end
    if not util.writable() then
        return util.result('NOT_LEADER')
    end
    local settled = quorum.wait_key('sc_buckets', bucket, fiber.time() + transitions.PENDING_WAIT_S)
    return answer('OK', bucket, row(bucket), {rows = rows.count(bucket), now_ms = util.now_ms(),
                                              numbers = rows.numbers(), pending = not settled})
end

-- sc.buckets_held(): the buckets active here ({bucket, generation} each), and every bucket in
-- another state with its row, marked pending while a write of it waits for its quorum (what the
-- settler and `cluster status` read). NOT_LEADER off the leader.
function M.held()
    local count = buckets.count()
    if count == nil then
        return transitions.NOT_SHARDED
    end
    if not util.writable() then
        return util.result('NOT_LEADER')
    end
    local active, moving = {}, {}
    for _, t in box.space.sc_buckets:pairs() do
        if t[F.status] == BUCKET.ACTIVE then
            table.insert(active, {t[F.id], t[F.generation]})
        else
            local d = transitions.describe(t)
            d.bucket = t[F.id]
            d.pending = quorum.is_pending('sc_buckets', t[F.id])
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
    local bad = check(bucket, generation) or check_shard(destination, 'destination')
    if bad ~= nil then
        return bad
    end
    local r = transit('send_start', bucket, generation, destination)
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
    return check(bucket, generation) or transit('send_abort', bucket, generation)
end

-- sc.bucket_send_done(bucket, generation): sending -> sent (the copy is complete on
-- the destination's quorum). Calls of the bucket are answered WRONG_BUCKET with
-- the destination as its owner from then on.
function M.send_done(bucket, generation)
    return check(bucket, generation) or transit('send_done', bucket, generation)
end

-- sc.bucket_gc(bucket, generation): a sent bucket's rows deleted (it turns garbage
-- first), DELETE_BATCH per transaction; then its row goes too. Answers OK {deleted, done}.
function M.gc(bucket, generation)
    local bad = check(bucket, generation)
    if bad ~= nil then
        return bad
    end
    local t = row(bucket)
    if t == nil then
        return answer('OK', bucket, t, {deleted = 0, done = true})
    end
    if not (is(t, BUCKET.SENT, generation) or is(t, BUCKET.GARBAGE, generation)) then
        return refused(bucket, t, string.format('sent at generation %d', generation))
    end
    if t[F.status] == BUCKET.SENT then
        util.atomic(function()
            local now = row(bucket)
            if is(now, BUCKET.SENT, generation) then
                set(bucket, now, BUCKET.GARBAGE, generation, t[F.peer])
            end
        end)
    end
    return purged(bucket, BUCKET.GARBAGE, generation)
end

-- What recv_start may take over: nothing, or an older copy or the garbage of a move away.
local STALE = {[BUCKET.RECEIVING] = true, [BUCKET.ABORTING] = true, [BUCKET.SENT] = true, [BUCKET.GARBAGE] = true}

-- sc.bucket_recv_start(bucket, source, generation, numbers?): receiving from source at
-- generation. Whatever of the bucket is here already (a copy of an earlier, given-up
-- move; the garbage of a move away from here; rows of a bucket not held) is deleted
-- first. numbers: the source's sequences ({sc_fence, sc_task_id}), raised to here.
-- A recv_start cut short by a failover leaves the row aborting at this generation from
-- this source (its own mark, committed before the purge): asked again, it purges on
-- from that mark. Taking over a recv_abort's mark of the same copy is as safe: nothing
-- makes a copy active but the source sent at its generation.
function M.recv_start(bucket, source, generation, nums)
    local bad = check(bucket, generation) or check_shard(source, 'source')
    if bad ~= nil then
        return bad
    end
    nums = util.opt(nums, {})
    if type(nums) ~= 'table' then
        return util.bad_request('numbers must be a map {sc_fence, sc_task_id}')
    end
    local first = util.atomic(function()
        local t = row(bucket)
        if is(t, BUCKET.RECEIVING, generation) and t[F.peer] == source then
            return answer('OK', bucket, t)  -- a repeat
        end
        if is(t, BUCKET.ABORTING, generation) and t[F.peer] == source then
            return nil  -- a repeat of one cut short: its purge goes on
        end
        if not (t == nil or (t[F.generation] < generation and STALE[t[F.status]])) then
            return refused(bucket, t, 'absent (or an older copy or garbage)')
        end
        set(bucket, t, BUCKET.ABORTING, generation, source)  -- what is here goes first
        return nil
    end)
    if first ~= nil then
        return first
    end
    local _, held = purge(bucket, BUCKET.ABORTING, generation)
    if not held then
        return refused(bucket, row(bucket), 'as it was (taken over while purging)')
    end
    return util.atomic(function()
        local t = row(bucket)
        if not is(t, BUCKET.ABORTING, generation) then
            return refused(bucket, t, 'as it was (taken over while purging)')
        end
        rows.raise('sc_fence', nums.sc_fence)
        rows.raise('sc_task_id', nums.sc_task_id)
        set(bucket, t, BUCKET.RECEIVING, generation, source)
        return answer('OK', bucket, row(bucket))
    end)
end

local function sharded_space(space_name)
    local space = box.space[space_name]
    if schema.F[space_name] == nil or schema.F[space_name].bucket == nil or space == nil then
        return nil, util.bad_request('space must be a sharded space')
    end
    return space
end

-- sc.bucket_recv(bucket, generation, space, rows): a chunk of the copy, written as
-- it is (one transaction). Each row must be of this bucket by storage's own
-- computation, and must not take the key of another bucket's row here.
function M.recv(bucket, generation, space_name, chunk)
    local bad = check(bucket, generation)
    if bad ~= nil then
        return bad
    end
    local space, not_sharded = sharded_space(space_name)
    if space == nil then
        return not_sharded
    end
    if type(chunk) ~= 'table' or #chunk > M.CHUNK_MAX then
        return util.bad_request(string.format('rows must be a list of at most %d rows', M.CHUNK_MAX))
    end
    local count, pos = buckets.count(), schema.F[space_name].bucket
    local pk = rows.pk_of(space)
    local t = row(bucket)
    if not is(t, BUCKET.RECEIVING, generation) then
        return refused(bucket, t, string.format('receiving at generation %d', generation))
    end
    local tuples = {}
    for i, r in ipairs(chunk) do
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
        local now = row(bucket)
        if not is(now, BUCKET.RECEIVING, generation) then
            return refused(bucket, now, BUCKET.RECEIVING)
        end
        rows.write(bucket, space_name, tuples)
        set(bucket, now, BUCKET.RECEIVING, generation, t[F.peer])
        return util.result('OK', {bucket = bucket, written = #tuples})
    end)
end

-- sc.bucket_recv_done(bucket, generation): receiving -> active at generation. The
-- driver calls it only once the source is sent at that generation.
function M.recv_done(bucket, generation)
    return check(bucket, generation) or transit('recv_done', bucket, generation)
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
        local t = row(bucket)
        if t == nil then
            return {done = answer('OK', bucket, t, {deleted = 0})}
        end
        if (t[F.status] ~= BUCKET.RECEIVING and t[F.status] ~= BUCKET.ABORTING) or t[F.generation] > generation then
            return {done = refused(bucket, t, string.format('receiving at generation %d or lower', generation))}
        end
        if t[F.status] == BUCKET.RECEIVING then
            set(bucket, t, BUCKET.ABORTING, t[F.generation], t[F.peer])
        end
        return {generation = t[F.generation]}
    end)
    if mark.done ~= nil then
        return mark.done
    end
    return purged(bucket, BUCKET.ABORTING, mark.generation)
end

-- sc.bucket_rows(bucket, generation, space, after, limit): a page of the rows of a
-- sending bucket in one space, in primary key order after the key `after` (nil:
-- from the first). The bucket's rows do not change while it is sending: writes and
-- deletes are refused (the stamping trigger), expiry and queue timeouts pass over them.
-- A page after a key scans the bucket's rows before it (O(rows of the bucket) a page).
function M.rows(bucket, generation, space_name, after, limit)
    local count = buckets.count()
    if count == nil then
        return transitions.NOT_SHARDED
    end
    local space, not_sharded = sharded_space(space_name)
    if space == nil then
        return not_sharded
    end
    limit = util.opt(limit, M.CHUNK_MAX)
    if type(limit) ~= 'number' or limit < 1 or limit > M.CHUNK_MAX then
        return util.bad_request(string.format('limit must be 1..%d', M.CHUNK_MAX))
    end
    if not util.writable() then
        return util.result('NOT_LEADER')
    end
    local t = row(bucket)
    if not is(t, BUCKET.SENDING, generation) or quorum.is_pending('sc_buckets', bucket) then
        return refused(bucket, t, string.format('sending at generation %d, committed', generation))
    end
    return rows.page(bucket, space, util.opt(after, nil), limit)
end

return M
