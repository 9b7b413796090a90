-- The moves' state machine as data (smartcache.sharding.moves makes the moves):
-- EDGES, every change a bucket's row may go through; STEPS, the transitions made
-- in one checked transaction; and the checks and answers they share.
--
--   source: active --send_start--> sending --send_done--> sent --gc--> garbage --gc--> (row gone)
--                      \--send_abort (generation + 1)--> active
--   destination: (none) --recv_start--> receiving --recv_done--> active
--                                          \--recv_abort--> aborting --> (rows and row gone)
--
-- Every change of a row goes through set() or unset(), which raise on an edge
-- that is not in EDGES (a bug: never a state written). A transition checks the
-- row's status and generation first, in the transaction that changes it (a
-- compare-and-set): a repeat of one already made answers OK, one from the wrong
-- state or generation changes nothing and answers BUCKET_STATE.
local fiber = require('fiber')
local schema = require('smartcache.schema')
local util = require('smartcache.util')
local quorum = require('smartcache.quorum')
local events = require('smartcache.events')
local buckets = require('smartcache.sharding.buckets')
local BUCKET = require('smartcache.sharding.consts').BUCKET

local M = {}

local F = schema.F.sc_buckets  -- id, status, generation, peer, since

-- How long a transition waits for a pending write of its bucket's row to get its quorum.
M.PENDING_WAIT_S = 5

-- The row's absence, as a state of EDGES.
local NONE = 'none'

-- Every change a bucket's row may go through here, from -> to, and what makes it.
M.EDGES = {
    [NONE] = {[BUCKET.ACTIVE] = 'buckets_init', [BUCKET.ABORTING] = 'recv_start'},
    [BUCKET.ACTIVE] = {[BUCKET.SENDING] = 'send_start'},
    [BUCKET.SENDING] = {[BUCKET.ACTIVE] = 'send_abort', [BUCKET.SENT] = 'send_done'},
    [BUCKET.SENT] = {[BUCKET.GARBAGE] = 'gc', [BUCKET.ABORTING] = 'recv_start (an older move back here)'},
    [BUCKET.GARBAGE] = {[NONE] = 'gc', [BUCKET.ABORTING] = 'recv_start (an older move back here)'},
    [BUCKET.RECEIVING] = {[BUCKET.RECEIVING] = 'recv (a chunk: since moves on)', [BUCKET.ACTIVE] = 'recv_done',
                          [BUCKET.ABORTING] = 'recv_abort, or recv_start of a newer copy'},
    [BUCKET.ABORTING] = {[BUCKET.RECEIVING] = 'recv_start', [BUCKET.ABORTING] = 'recv_start of a newer copy',
                         [NONE] = 'recv_abort'},
}

local function edge(bucket, t, to)
    local from = t and t[F.status] or NONE
    if M.EDGES[from] == nil or M.EDGES[from][to] == nil then
        error(string.format('bucket %d: no transition %s -> %s', bucket, from, to))
    end
end

-- The row's new state (t: the row read in the same transaction, nil when there is none).
local function set(bucket, t, status, generation, peer)
    edge(bucket, t, status)
    box.space.sc_buckets:replace({bucket, status, generation, peer or box.NULL, util.now_ms()})
end

-- The row gone (its rows are, already).
local function unset(bucket, t)
    edge(bucket, t, NONE)
    box.space.sc_buckets:delete(bucket)
end

local function is(t, status, generation)
    return t ~= nil and t[F.status] == status and t[F.generation] == generation
end

local function row(bucket)
    return box.space.sc_buckets:get(bucket)
end

local function describe(t)
    if t == nil then
        return {state = box.NULL}
    end
    return {state = t[F.status], generation = t[F.generation], peer = t[F.peer] or box.NULL,
            since = t[F.since] or box.NULL}
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
        t and string.format('%s (generation %d)', t[F.status], t[F.generation]) or 'not held', wanted)})
end

local NOT_SHARDED = {status = 'NOT_SHARDED', message = 'this replica set is not a shard of a sharded cluster'}

-- A sharded shard, and a bucket in range.
local function check_bucket(bucket)
    local count = buckets.count()
    if count == nil then
        return NOT_SHARDED
    end
    if type(bucket) ~= 'number' or bucket ~= math.floor(bucket) or bucket < 0 or bucket >= count then
        return util.bad_request(string.format('bucket must be an integer in 0..%d', count - 1))
    end
    return nil
end

-- The checks every transition makes first: a sharded shard, a bucket in range, its leader, and no
-- write of the bucket's row waiting for its quorum (what follows reads the row, and commits nothing
-- between that read and its own write: no yield).
local function check(bucket, generation)
    local bad = check_bucket(bucket)
    if bad ~= nil then
        return bad
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

-- The transitions made in one checked transaction: from `from` at the call's generation to `to`
-- at generation + bump. A row already where the transition leads (one of `made`, at generation +
-- bump, and with the peer asked for when the call names one) is a repeat: OK, nothing changes.
-- Anything else is refused (BUCKET_STATE, nothing changes). peer: the new row's peer, the one the
-- call names ('call') or the row's own ('row'; else none). event(bucket, t, generation): the
-- topic and payload written with the change, whose sequence the answer carries.
M.STEPS = {
    send_start = {from = BUCKET.ACTIVE, to = BUCKET.SENDING, bump = 1, peer = 'call', made = {BUCKET.SENDING}},
    send_abort = {from = BUCKET.SENDING, to = BUCKET.ACTIVE, bump = 1, made = {BUCKET.ACTIVE}},
    send_done = {from = BUCKET.SENDING, to = BUCKET.SENT, bump = 0, peer = 'row', made = {BUCKET.SENT, BUCKET.GARBAGE},
                 -- The last event of the bucket's keys in this shard's log (docs/design/resharding.md, "Events").
                 event = function(bucket, t, generation)
                     return 'bucket.sent', {bucket = bucket, to = t[F.peer], generation = generation}
                 end},
    recv_done = {from = BUCKET.RECEIVING, to = BUCKET.ACTIVE, bump = 0, made = {BUCKET.ACTIVE},
                 -- Before the first event of the bucket's keys in this shard's log.
                 event = function(bucket, t, generation)
                     return 'bucket.received', {bucket = bucket, from = t[F.peer], generation = generation}
                 end},
}
for _, step in pairs(M.STEPS) do
    local made = {}
    for _, status in ipairs(step.made) do
        made[status] = true
    end
    step.made_set = made
end

-- STEPS[name] on bucket at generation (peer: the one the call names), in one transaction.
local function transit(name, bucket, generation, peer)
    local step = M.STEPS[name]
    local at = generation + step.bump
    return util.atomic(function()
        local t = row(bucket)
        if t ~= nil and step.made_set[t[F.status]] and t[F.generation] == at
                and (step.peer ~= 'call' or t[F.peer] == peer) then
            return answer('OK', bucket, t)  -- a repeat
        end
        if not is(t, step.from, generation) then
            return refused(bucket, t, string.format('%s at generation %d', step.from, generation))
        end
        local new_peer = nil
        if step.peer == 'call' then
            new_peer = peer
        elseif step.peer == 'row' then
            new_peer = t[F.peer]
        end
        set(bucket, t, step.to, at, new_peer)
        local fields = nil
        if step.event ~= nil then
            local topic, payload = step.event(bucket, t, generation)
            fields = {seq = events.write(topic, tostring(bucket), payload) or box.NULL}
        end
        return answer('OK', bucket, row(bucket), fields)
    end)
end

M.NONE = NONE
M.set = set
M.unset = unset
M.is = is
M.row = row
M.describe = describe
M.answer = answer
M.refused = refused
M.NOT_SHARDED = NOT_SHARDED
M.check_bucket = check_bucket
M.check = check
M.transit = transit

return M
