-- A bucket's rows, as a move handles them (smartcache.sharding.moves decides
-- when): counted, read a page at a time in primary key order, written a chunk
-- at a time, deleted in batches while the bucket's row keeps its mark; and the
-- sequences whose numbers rows carry, raised so that the destination never
-- hands out a number the source did. Nothing here reads or writes sc_buckets:
-- the caller says which bucket, and gives the check that its mark still holds.
local fiber = require('fiber')
local key_def = require('key_def')
local schema = require('smartcache.schema')
local util = require('smartcache.util')
local buckets = require('smartcache.sharding.buckets')

local M = {}

local key_defs = {}
local function pk_of(space)
    local kd = key_defs[space.id]
    if kd == nil then
        kd = key_def.new(space.index.primary.parts)
        key_defs[space.id] = kd
    end
    return kd
end
M.pk_of = pk_of

-- How many rows of bucket are here, every sharded space.
function M.count(bucket)
    local rows = 0
    for _, name in ipairs(schema.SHARDED) do
        rows = rows + box.space[name].index.by_bucket:count({bucket})
    end
    return rows
end

-- Delete up to limit rows of bucket, space after space, in one transaction, while marked()
-- (the bucket's row still carries the mark of this deletion: checked in that transaction);
-- how many, or nil when the mark is gone (another step took the bucket over: stop).
local function delete_some(bucket, limit, marked)
    return util.atomic(function()
        if not marked() then
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

-- Every row of bucket deleted while marked(), batch per transaction, yielding between;
-- how many, and whether the mark held to the end.
function M.purge(bucket, batch, marked)
    local total = 0
    while true do
        local n = delete_some(bucket, batch, marked)
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

-- A page of the rows of bucket in space, in primary key order after the key `after` (nil: from
-- the first), at most limit: OK {rows, last, done}. A page after a key scans the bucket's rows
-- before it (O(rows of the bucket) a page).
function M.page(bucket, space, after, limit)
    local pk = pk_of(space)
    local out, last = {}, box.NULL
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

-- The numbers this shard's sequences handed out: what a destination raises its own to.
function M.numbers()
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
M.raise = raise

-- Write tuples (rows of bucket, checked) into space, inside the caller's transaction: the
-- one write of a bucket not active here that the stamping trigger lets through.
function M.write(bucket, space_name, tuples)
    local space = box.space[space_name]
    local numbered = NUMBERED[space_name]
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
end

return M
