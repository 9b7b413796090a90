-- The event log (issue 16): what front servers need to drop what they hold
-- locally, at once, without polling, and without the weak points of the
-- original design (every server's clock must agree, an event sent in a
-- separate transaction can be lost, pollers load the database).
--
--   * Same transaction. write() is called inside the transaction of the change
--     it reports (sessions, device, prewarm) and adds its event there: the
--     event exists exactly when the change does. A change that fails writes
--     no event; an event is never written for a change that did not happen.
--   * A sequence number, not a clock. Each event gets the number after the
--     last event's (the newest partition's last tuple, read in the same
--     transaction); a rolled-back transaction takes its number back with it.
--     Readers keep the last number they saw: a cursor. No clock agreement, no
--     lag window, no de-duplication.
--   * Readers see committed events only. On 2.6 a change waiting for its WAL
--     write or its synchronous quorum is already visible (no MVCC:
--     compat.NO_MVCC_DIRTY_READS); a reader
--     here is bounded by the oldest event of a transaction not yet ended, so
--     it never sees an event that may still be rolled back, and never skips
--     one that commits later. The end of a transaction util.atomic opened is
--     reported by util.atomic itself, from the fiber that committed it; any
--     other gets an on_commit / on_rollback trigger (a Lua trigger costs 2.6
--     a coroutine per run: compat.LUA_TRIGGER_COSTS_A_COROUTINE).
--   * Push, not polling. A reader with nothing to read waits on a fiber.cond
--     broadcast by the commit of a new event (PostgreSQL's LISTEN/NOTIFY,
--     inside the database), up to wait_ms.
--   * Day partitions (smartcache.events.partitions): one space per UTC day,
--     dropped whole after SC_EVENTS_RETENTION_DAYS. A cursor older than what
--     is kept gets CURSOR_TOO_OLD with the oldest sequence still there, never
--     a silent gap.
--
-- The partition an event goes to is the newest of today's and the previous
-- event's (sticky): a leader whose clock is behind its predecessor's never
-- puts a higher sequence in an older day, so partitions are ordered by
-- sequence and a read walks them in name order.
local fiber = require('fiber')
local msgpack = require('msgpack')
local util = require('smartcache.util')
local config = require('smartcache.config')
local partitions = require('smartcache.events.partitions')

local M = {}

local F = partitions.F
M.MAX_TOPIC_BYTES = 128
M.MAX_KEY_BYTES = 256
M.MAX_PAYLOAD_BYTES = 64 * 1024
M.MAX_TOPICS = 64
M.MAX_LIMIT = 1000
M.DEFAULT_LIMIT = 100
-- A read looks at no more events than this (a narrow topic filter over a long
-- log), then answers with what it found and the cursor to go on from.
M.SCAN_MAX = 10000
-- Application topics live under this prefix: they can never pass for a change of state.
M.APP_PREFIX = 'app.'
-- A waiting reader stops config.WAIT_MARGIN_MS before the call's deadline and looks at
-- util.writable() at least every config.WRITABLE_CHECK_S (the deadline budget).

-- SC_EVENTS=false: changes of state write no events (application events still do).
M.enabled = config.events_enabled

-- Broadcast by the commit of each event; readers with nothing to read wait on it.
M.cond = fiber.cond()
M.waiters = 0
-- Events of transactions not yet ended, oldest first: a ring of three arrays
-- (sequence, topic, ended), nothing allocated per event. Positions are
-- absolute (head_pos..tail_pos); slot(p) is where position p lives.
local cap = 1024
local ring_seq, ring_topic, ring_ended = {}, {}, {}
local head_pos, tail_pos = 1, 0
-- Events committed on this instance since start, per topic (app.* as one).
M.written = {}

local function slot(p)
    return p % cap + 1
end

local function grow()
    local size = cap * 2
    local seqs, topics, ended = {}, {}, {}
    for p = head_pos, tail_pos do
        local from, to = p % cap + 1, p % size + 1
        seqs[to], topics[to], ended[to] = ring_seq[from], ring_topic[from], ring_ended[from]
    end
    ring_seq, ring_topic, ring_ended, cap = seqs, topics, ended, size
end

local function push(seq, topic)
    if tail_pos - head_pos + 1 >= cap then
        grow()
    end
    tail_pos = tail_pos + 1
    local i = slot(tail_pos)
    ring_seq[i], ring_topic[i], ring_ended[i] = seq, topic, false
    return tail_pos
end

local function topic_class(topic)
    if topic:find(M.APP_PREFIX, 1, true) == 1 then  -- no substring made
        return 'app'
    end
    return topic
end

-- Forget the oldest events whose transactions have ended: the ring holds
-- only what readers must not pass yet (bounded without any reader too).
local function trim()
    while head_pos <= tail_pos and ring_ended[slot(head_pos)] do
        ring_topic[slot(head_pos)] = nil
        head_pos = head_pos + 1
    end
end

-- The transaction holding the events at positions from..to has ended.
local function settle(from, to, committed)
    for p = from, to do
        local i = slot(p)
        ring_ended[i] = true
        if committed then
            local class = topic_class(ring_topic[i])
            M.written[class] = (M.written[class] or 0) + 1
        end
    end
    trim()
    if committed then
        M.cond:broadcast()
    end
end

-- Events of transactions not yet ended (the ring's length).
function M.unsettled()
    return tail_pos - head_pos + 1
end

-- The newest sequence a reader may see: everything up to it has committed.
local function visible()
    trim()
    if head_pos <= tail_pos then
        return ring_seq[slot(head_pos)] - 1
    end
    return (partitions.head())
end
M.visible = visible

-- The positions of the events written by the transaction util.atomic is building.
local open_first, open_last = nil, nil

util.on_txn_end({
    take = function()
        local a, b = open_first, open_last
        open_first, open_last = nil, nil
        return a, b
    end,
    settle = settle,
})

-- Until its transaction ends: util.atomic reports the end of those it opens,
-- others (box.atomic) get a commit and a rollback trigger.
local function track(seq, topic)
    local p = push(seq, topic)
    if util.building then
        open_first = open_first or p
        open_last = p
        return
    end
    box.on_commit(function()
        settle(p, p, true)
    end)
    box.on_rollback(function()
        settle(p, p, false)
    end)
end

-- The tuple an event is inserted as, filled anew each time (insert copies it).
local row = {}

-- Add one event to the transaction open now (the caller's: util.atomic); returns its sequence.
-- With SC_EVENTS=false changes of state write none (application events still do: publish).
function M.write(topic, key, payload, always)
    if not M.enabled and not always then
        return nil
    end
    assert(box.is_in_txn(), 'events.write outside a transaction')
    local now = partitions.clock()
    local seq, day = partitions.head()
    seq = seq + 1
    local today = partitions.day_of(now)
    if day == nil or today > day then
        day = today
    end
    local space = partitions.space_of(day)
    if space == nil then
        space = partitions.create_in_write(day)
    end
    row[1], row[2], row[3], row[4], row[5] = seq, now, topic, key or '', payload
    util.insert(space, row)
    partitions.wrote(space, day)
    track(seq, topic)
    return seq
end

-- Application events ----------------------------------------------------------

-- A topic is M.APP_PREFIX and a name of at least one byte, M.MAX_TOPIC_BYTES at most in all
-- (the prefix counts), of ASCII letters and digits and . _ : / - (spelled out: no locale).
function M.check_topic(topic)
    if type(topic) ~= 'string' or #topic > M.MAX_TOPIC_BYTES or topic:sub(1, #M.APP_PREFIX) ~= M.APP_PREFIX
            or #topic == #M.APP_PREFIX or not topic:match('^[A-Za-z0-9._:/%-]+$') then
        return string.format('topic must be %s<name>, %d..%d bytes in all of ASCII letters, digits and . _ : / -',
            M.APP_PREFIX, #M.APP_PREFIX + 1, M.MAX_TOPIC_BYTES)
    end
    return nil
end

-- EVENT_PUBLISH: OK {seq}. A write procedure: one transaction, repeated once per idempotency key.
function M.publish(topic, key, payload)
    key = util.opt(key, '')
    local err = M.check_topic(topic)
    if err == nil and (type(key) ~= 'string' or #key > M.MAX_KEY_BYTES) then
        err = string.format('key must be a string of 0..%d bytes', M.MAX_KEY_BYTES)
    end
    if err == nil and #msgpack.encode(payload) > M.MAX_PAYLOAD_BYTES then
        err = string.format('payload must be 0..%d bytes of msgpack', M.MAX_PAYLOAD_BYTES)
    end
    if err ~= nil then
        return util.bad_request(err)
    end
    return util.atomic(function()
        return util.result('OK', {seq = M.write(topic, key, payload, true)})
    end)
end

-- Reading ---------------------------------------------------------------------

-- An empty list goes out as a msgpack array, not a map.
local ARRAY = {__serialize = 'array'}

local function matches(topic, topics)
    if topics == nil then
        return true
    end
    for _, prefix in ipairs(topics) do
        if topic:sub(1, #prefix) == prefix then
            return true
        end
    end
    return false
end

-- Events after `after` up to `upto` matching topics, at most `limit`, looking
-- at no more than SCAN_MAX; returns them and the last sequence looked at. As
-- maps, or with `rows` as the stored tuples themselves ({seq, time_ms, topic,
-- key, payload}: sent as they are stored, no table built and no payload
-- decoded; measured: a fifth of the CPU and garbage of maps per event).
local function scan(after, upto, topics, limit, rows)
    local out, last, looked = setmetatable({}, ARRAY), after, 0
    for _, name in ipairs(partitions.list()) do
        local s = box.space[name]
        local top = s ~= nil and s.index.primary:max() or nil
        if top ~= nil and top[F.seq] > after then
            for _, t in s.index.primary:pairs({after}, {iterator = 'GT'}) do
                local seq = t[F.seq]
                if seq > upto then
                    return out, last
                end
                last, looked = seq, looked + 1
                if topics == nil or matches(t[F.topic], topics) then
                    if rows then
                        table.insert(out, t)
                    else
                        table.insert(out, {seq = seq, time_ms = t[F.time], topic = t[F.topic], key = t[F.key],
                                           payload = t[F.payload]})
                    end
                    if #out >= limit then
                        return out, last
                    end
                end
                if looked >= M.SCAN_MAX then
                    return out, last
                end
            end
        end
    end
    return out, last
end

local function check_read(after_seq, topics, limit, wait_ms, rows)
    if rows ~= nil and type(rows) ~= 'boolean' then
        return 'rows must be a boolean'
    end
    if after_seq ~= nil and (type(after_seq) ~= 'number' or after_seq ~= math.floor(after_seq) or after_seq < 0
            or after_seq > util.MAX_SAFE) then
        return string.format('after_seq must be an integer in 0..%.0f', util.MAX_SAFE)
    end
    if topics ~= nil then
        if type(topics) ~= 'table' or #topics > M.MAX_TOPICS then
            return string.format('topics must be a list of 0..%d topic prefixes', M.MAX_TOPICS)
        end
        for _, p in ipairs(topics) do
            if type(p) ~= 'string' or #p > M.MAX_TOPIC_BYTES then
                return string.format('each topic prefix in topics must be a string of 0..%d bytes', M.MAX_TOPIC_BYTES)
            end
        end
    end
    if type(limit) ~= 'number' or limit ~= math.floor(limit) or limit < 1 or limit > M.MAX_LIMIT then
        return string.format('limit must be an integer in 1..%d', M.MAX_LIMIT)
    end
    if type(wait_ms) ~= 'number' or wait_ms ~= math.floor(wait_ms) or wait_ms < 0 or wait_ms > config.max_wait_ms then
        return string.format('wait_ms must be an integer in 0..%d', config.max_wait_ms)
    end
    return nil
end

local NOT_LEADER = {status = 'NOT_LEADER'}

-- EVENTS_READ: OK {events, last_seq, head_seq, oldest_seq} · CURSOR_TOO_OLD {oldest_seq, head_seq} · NOT_LEADER.
-- Events with seq > after_seq (nil: none, just the head) whose topic starts with
-- one of `topics` (nil or empty: all), at most `limit`; last_seq is the cursor
-- to go on from (the last sequence looked at, matching or not; never beyond
-- head_seq: a cursor beyond the head, from another cluster or from events a
-- leader without SC_SYNC lost, is read from the head, and the events that
-- come after it are new to the reader). With nothing
-- to answer it waits up to wait_ms for a commit (a waiting procedure: api.lua
-- `waits`). Only the writable instance answers: a follower may hold events
-- of a synchronous transaction that is still to be rolled back. rows = true:
-- events as stored tuples {seq, time_ms, topic, key, payload} (the service's
-- publisher; see scan).
function M.read(deadline_ms, _, after_seq, topics, limit, wait_ms, rows)
    after_seq, topics = util.opt(after_seq, nil), util.opt(topics, nil)
    limit, wait_ms, rows = util.opt(limit, M.DEFAULT_LIMIT), util.opt(wait_ms, 0), util.opt(rows, nil)
    local err = check_read(after_seq, topics, limit, wait_ms, rows)
    if err ~= nil then
        return util.bad_request(err)
    end
    if topics ~= nil and #topics == 0 then
        topics = nil
    end
    local budget = wait_ms
    if deadline_ms ~= nil then
        budget = math.min(budget, deadline_ms - config.WAIT_MARGIN_MS - util.now_ms())
    end
    local stop = fiber.clock() + math.max(budget, 0) / 1000
    local cursor = after_seq
    while true do
        if not util.writable() then
            return NOT_LEADER
        end
        local upto, dropped = visible(), partitions.floor()
        if cursor == nil then
            return util.result('OK', {events = setmetatable({}, ARRAY), last_seq = upto, head_seq = upto,
                                      oldest_seq = dropped + 1})
        end
        if cursor < dropped then
            return util.result('CURSOR_TOO_OLD', {oldest_seq = dropped + 1, head_seq = upto,
                message = string.format('events up to %d were dropped with their partitions', dropped)})
        end
        if cursor > upto then
            cursor = upto  -- beyond the head: answering it as last_seq would make the reader skip what comes
        end
        local out, last = scan(cursor, upto, topics, limit, rows)
        local left = stop - fiber.clock()
        if #out > 0 or left <= 0 or last < upto then
            return util.result('OK', {events = out, last_seq = last, head_seq = upto, oldest_seq = dropped + 1})
        end
        cursor = last  -- nothing that matches up to the head: wait for the next commit from here
        M.waiters = M.waiters + 1
        M.cond:wait(math.min(left, config.WRITABLE_CHECK_S))
        M.waiters = M.waiters - 1
    end
end

-- sc.events_stats: the log on this instance (the service's metrics, operators).
function M.stats()
    local seq = partitions.head()
    local written = setmetatable({}, {__serialize = 'map'})
    for topic, n in pairs(M.written) do
        written[topic] = n
    end
    return util.result('OK', {
        enabled = M.enabled, head_seq = visible(), written_seq = seq, oldest_seq = partitions.floor() + 1,
        partitions = partitions.describe(), waiters = M.waiters, retention_days = partitions.retention_days,
        written = written,
        counters = partitions.counters, last_drop = partitions.last_drop or box.NULL,
    })
end

-- Partitions now (on a writable instance) and their fiber; readers wake when this instance stops leading.
function M.start()
    partitions.set_on_demote(function()
        M.cond:broadcast()
    end)
    partitions.start()
end

return M
