-- Buckets: which of a sharded cluster's B buckets a key belongs to, and the
-- bucket a session id carries. docs/design/sharding.md is the design; the
-- service computes the same in service/smartcache/wire/buckets.py, and both are tested
-- against proto/vectors/buckets.json.
--
-- A key's bucket is crc32c(key) mod B: CRC-32C (Castagnoli). Tarantool's
-- digest.crc32 is CRC-32C without the final XOR with 0xFFFFFFFF, so it is done
-- here. A session id of a sharded cluster is a UUID version 8 (RFC 9562) whose
-- first two bytes are its bucket, big-endian; version 4 ids carry none.
local bit = require('bit')
local digest = require('digest')
local fiber = require('fiber')
local schema = require('smartcache.schema')
local util = require('smartcache.util')
local BUCKET = require('smartcache.sharding.consts').BUCKET

local M = {}

local FB = schema.F.sc_buckets  -- a bucket's row: id, status, generation, peer, since

M.MAX_BUCKETS = 65536

-- CRC-32C of s, as an unsigned number.
function M.crc32c(s)
    local v = bit.bxor(digest.crc32(s), 0xFFFFFFFF)  -- a signed 32-bit result
    if v < 0 then
        v = v + 4294967296
    end
    return v
end

-- The bucket of a routing key among count buckets.
function M.of(key, count)
    return M.crc32c(key) % count
end

-- The bucket a session id (canonical UUID text) carries; nil for one of
-- version 4 (made before sharding) or text that is not a UUID.
function M.of_session(id)
    if type(id) ~= 'string' or #id ~= 36 then
        return nil
    end
    local version = tonumber(id:sub(15, 15), 16)
    local variant = tonumber(id:sub(20, 20), 16)
    if version ~= 8 or variant == nil or bit.rshift(variant, 2) ~= 2 then
        return nil
    end
    return tonumber(id:sub(1, 4), 16)
end

-- A version 8 id carrying bucket, the rest of it from a version 4 id (random).
function M.session_id(v4, bucket)
    local variant = tonumber(v4:sub(20, 20), 16)
    return string.format('%04x', bucket) .. v4:sub(5, 14) .. '8' .. v4:sub(16, 19) ..
        string.format('%x', bit.bor(bit.band(variant, 3), 8)) .. v4:sub(21)
end

-- The bucket count of a sharded cluster (sc_meta 'bucket_count', written by
-- buckets_init), or nil: not sharded. A shard that holds no bucket (a new one
-- before its first move, or one drained) is sharded all the same: it serves none.
function M.count()
    local meta = box.space.sc_meta
    local t = meta ~= nil and meta:get('bucket_count') or nil
    return t and t[2] or nil
end

-- The bucket of what a procedure is called with: a routing key (kind 'key'), or
-- a session id (kind 'session': the bucket it carries; an id made before
-- sharding, its row's client id; nil when there is no such row, so the
-- procedure answers as for a missing session).
function M.of_call(kind, value, count)
    if kind == 'key' then
        return M.of(tostring(value), count)
    end
    local b = M.of_session(value)
    if b ~= nil then
        return b
    end
    local row = type(value) == 'string' and box.space.sessions:get(value) or nil
    return row and M.of(row[2], count) or nil  -- sessions' field 2: client_id
end

-- nil when this shard may serve a call on (kind, value): the cluster is not
-- sharded, or the bucket is active here. Else the WRONG_BUCKET answer (nothing
-- done): the bucket, and where it went when this shard knows (peer of a sent one).
function M.refusal(kind, value)
    local count = M.count()
    if count == nil then
        return nil
    end
    local bucket = M.of_call(kind, value, count)
    if bucket == nil then
        return nil
    end
    local t = box.space.sc_buckets:get(bucket)
    local status = t and t[FB.status]
    if status == BUCKET.ACTIVE then
        return nil
    end
    if status == BUCKET.SENDING or status == BUCKET.RECEIVING then
        return {status = 'BUCKET_MOVING', bucket = bucket}  -- paused for a moment: retryable, nothing done
    end
    local owner = (status == BUCKET.SENT or status == BUCKET.GARBAGE) and t[FB.peer] or nil
    return {status = 'WRONG_BUCKET', bucket = bucket, owner = owner or box.NULL}
end

-- The bucket a move is writing the rows of (smartcache.sharding.moves, while a chunk of a
-- copy is written on the destination): the one write of a bucket not active here.
M.receiving = nil
-- True while buckets_init stamps the rows written before sharding (of every bucket).
M.backfilling = false
-- The bucket whose rows a move deletes now (smartcache.sharding.moves: a given-up copy, a sent bucket's garbage).
M.purging = nil

-- Whether this shard serves the bucket of a row of space_name (true when the cluster is not
-- sharded, for spaces outside buckets and for rows of no bucket): what the background fibers
-- (expiry, queue timeouts) check before they change a row, so that a moving bucket's rows
-- stay as the copy read them.
function M.serves_row(space_name, t)
    local pos = schema.F[space_name] and schema.F[space_name].bucket
    if pos == nil then
        return true
    end
    local count = M.count()
    if count == nil then
        return true
    end
    local b = t[pos]
    if b == nil then
        b = M.of_row(space_name, t, count)
        if b == nil then
            return true
        end
    end
    local state = box.space.sc_buckets:get(b)
    -- No row: a bucket never held here whose rows the backfill found (written before sharding): its
    -- rows are nobody's copy, and expire here as they always did.
    return state == nil or state[FB.status] == BUCKET.ACTIVE
end

-- Raised by a write of a row whose bucket is not active here (a procedure that
-- checked its bucket, then yielded while a move began): the transaction fails,
-- nothing is written, and the caller is answered as for any failed write.
local function not_active(bucket, status)
    box.error({code = 0, reason = string.format('BUCKET_MOVING: bucket %d is %s here: nothing written', bucket,
        status or 'not held')})
end

-- Every row of a sharded space records its bucket (schema version 7): the routing
-- key of each space's rows, by field position ('cache': a session's entry is its
-- session's bucket, the global namespace's its key's; 'rotation': an old id's row is
-- the bucket of the session it was rotated to, schema version 9).
M.ROW_KEY = {sessions = 2, device = 1, prewarm = 1, counters = 1, registers = 1, sequences = 1,
             semaphore_holders = 1, latches = 1, queue_tasks = 2, cache = 'cache', rotations = 'rotation'}

-- The bucket of a row of a sharded space, or nil (a cache entry or a rotation of a session that is gone).
function M.of_row(space_name, t, count)
    local key = M.ROW_KEY[space_name]
    if key == 'cache' then
        if t[1] == '' then
            return M.of(t[2], count)
        end
        return M.of_call('session', t[1], count)
    end
    if key == 'rotation' then
        return M.of_call('session', t[2], count)
    end
    return M.of(t[key], count)
end

-- A before_replace trigger of a sharded space: a row written without its bucket
-- (every procedure writes its fields only) gets it, while the cluster is sharded.
-- A replica receives rows with it already (it does nothing then).
local function stamper(space_name)
    local pos = schema.F[space_name].bucket
    return function(old, new)
        local count = M.count()
        if count == nil then
            return new
        end
        if new == nil then
            -- A delete: of an active bucket's row, or a move's purge (background fibers skip the others:
            -- serves_row); replicated deletes pass.
            local b = old[pos]
            if b == nil then  -- nil or box.NULL: a row written before sharding
                b = M.of_row(space_name, old, count)
            end
            if b ~= nil and b ~= M.purging and box.session.type() ~= 'applier' then
                local state = box.space.sc_buckets:get(b)
                if state ~= nil and state[FB.status] ~= BUCKET.ACTIVE then  -- no row: from before sharding
                    not_active(b, state[FB.status])
                end
            end
            return new
        end
        local b = new[pos]
        local stamped = b ~= nil
        if not stamped then
            b = M.of_row(space_name, new, count)
            if b == nil then
                return new
            end
        end
        -- The fence of a move: this instance's own writes (not what replication applies) go to an active
        -- bucket only, or to the bucket a move is receiving.
        if b ~= M.receiving and not M.backfilling and box.session.type() ~= 'applier' then
            local state = box.space.sc_buckets:get(b)
            if state == nil or state[FB.status] ~= BUCKET.ACTIVE then
                not_active(b, state and state[FB.status])
            end
        end
        if stamped then
            return new
        end
        if #new >= pos - 1 then
            return new:update({{'=', pos, b}})
        end
        local t = new:totable()  -- older tuples lack trailing nullable fields: fill them in
        for i = #t + 1, pos - 1 do
            t[i] = box.NULL
        end
        t[pos] = b
        return box.tuple.new(t)
    end
end

M.installed = {}

-- Install the stamping triggers, once each, while the cluster is sharded (at start on every
-- instance: runtime.lua; on the leader after buckets_init; on a replica when sc_buckets
-- replicates). A cluster that is not sharded has none: no cost on its writes. Each space is
-- registered as Lua-triggered, so that util.insert/replace write it through space:insert
-- (compat.FFI_NO_LUA_REENTRY: a Lua trigger must not run under an FFI call).
function M.install()
    if box.space.sc_buckets == nil then
        return false  -- schema older than 6 (a replica before the upgrade reaches it)
    end
    for _, name in ipairs(schema.SHARDED) do
        if box.space[name] == nil or box.space[name].index.by_bucket == nil then
            return false  -- a sharded space of a later schema (7, 9) has not reached this replica yet
        end
    end
    if M.watching == nil then
        -- A replica learns that the cluster is sharded from sc_buckets' first row.
        M.watching = function()
            box.on_commit(function()
                if M.count() ~= nil and next(M.installed) == nil then
                    M.install()
                end
            end)
        end
        box.space.sc_buckets:on_replace(M.watching)
    end
    if M.count() == nil or next(M.installed) ~= nil then
        return true
    end
    for _, name in ipairs(schema.SHARDED) do
        local space = box.space[name]
        local trigger = stamper(name)
        space:before_replace(trigger, M.installed[name])
        M.installed[name] = trigger
        util.register_lua_trigger(space)
    end
    return true
end

-- Rows written before the cluster was sharded get their bucket, BATCH per
-- transaction (each a synchronous write in HA), yielding between: a replace of
-- the row as it is, which the trigger stamps. Returns how many rows it stamped.
M.BACKFILL_BATCH = 500

function M.backfill()
    local stamped = 0
    for _, name in ipairs(schema.SHARDED) do
        local space = box.space[name]
        local pos = schema.F[name].bucket
        local index = space.index.by_bucket
        while true do
            local batch = index:select({box.NULL}, {iterator = 'EQ', limit = M.BACKFILL_BATCH})
            local todo = {}
            for _, t in ipairs(batch) do
                if t[pos] == nil and M.of_row(name, t, M.count()) ~= nil then
                    table.insert(todo, t)
                end
            end
            if #todo == 0 then
                break
            end
            box.atomic(function()
                M.backfilling = true  -- rows of every bucket, held here or not (those not held wait for a move)
                local ok, err = pcall(function()
                    for _, t in ipairs(todo) do
                        space:replace(t)
                    end
                end)
                M.backfilling = false  -- before the commit yields
                if not ok then
                    error(err, 0)
                end
            end)
            stamped = stamped + #todo
            fiber.yield()
        end
    end
    return stamped
end

-- sc.buckets_init(count, held): a shard of a new sharded cluster takes its buckets
-- (smartcache-cli cluster init --shards), all active, and the cluster's bucket
-- count; one transaction, synchronous like every data write (sc_buckets is
-- guarded: smartcache.quorum). Idempotent: the same again answers OK, created
-- false; a shard that holds other buckets already answers ALREADY_EXISTS.
function M.init(count, held)
    if type(count) ~= 'number' or count ~= math.floor(count) or count < 1 or count > M.MAX_BUCKETS then
        return util.bad_request(string.format('count must be an integer in 1..%d', M.MAX_BUCKETS))
    end
    if type(held) ~= 'table' then
        return util.bad_request('held must be a list of buckets (empty: a new shard, which moves fill)')
    end
    local want = {}
    for _, b in ipairs(held) do
        if type(b) ~= 'number' or b ~= math.floor(b) or b < 0 or b >= count or want[b] then
            return util.bad_request(string.format('held must list distinct buckets in 0..%d', count - 1))
        end
        want[b] = true
    end
    if not util.writable() then
        return util.result('NOT_LEADER')
    end
    local r = util.atomic(function()
        local space = box.space.sc_buckets
        if M.count() ~= nil then
            local same = M.count() == count and space:len() == #held
            for _, b in ipairs(held) do
                same = same and space:get(b) ~= nil
            end
            if same then
                return util.result('OK', {created = false, buckets = #held})
            end
            return util.result('ALREADY_EXISTS', {message = 'this shard holds other buckets already'})
        end
        box.space.sc_meta:replace({'bucket_count', count})
        for _, b in ipairs(held) do
            space:insert({b, BUCKET.ACTIVE, 1, box.NULL, util.now_ms()})
        end
        return util.result('OK', {created = true, buckets = #held})
    end)
    if r.status == 'OK' and r.created then
        M.install()
        r.stamped = M.backfill()  -- rows of the cluster before it was sharded get their bucket
    end
    return r
end

return M
