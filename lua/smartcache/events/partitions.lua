-- Where the event log lives (smartcache.events): one space per UTC day,
-- events_YYYYMMDD, created ahead and dropped whole after
-- SC_EVENTS_RETENTION_DAYS by a fiber on the writable instance only (the
-- leader: no lock row, unlike the original's partition_update table).
--
-- The sequence needs no counter row: the last event is the last tuple of the
-- newest partition that has one (read inside the writer's transaction it
-- includes events not committed yet, and a rollback takes them back with their
-- tuples), and retention never drops that partition. One sc_meta row,
-- {'events_floor', seq}, remembers the highest sequence dropped with a
-- partition: older cursors get CURSOR_TOO_OLD.
--
-- Dropping a day is a few _space/_index deletes in one transaction; memtx frees
-- the tuples in the background (measured: a million events, 0.2 ms, no stall
-- of the event loop above 0.2 ms), so retention costs no sweep.
--
-- Writes to partitions are synchronous like the other data spaces' (HA with
-- SC_SYNC, through sc_quorum: smartcache.quorum; no space is is_sync on 2.6.0),
-- so an acknowledged event is on a quorum like the change it reports. init.lua
-- guards partitions as their creation commits; create() guards at once, so
-- the first event of a partition made inside a write is guarded too.
local fiber = require('fiber')
local clock = require('clock')
local log = require('log')
local util = require('smartcache.util')
local config = require('smartcache.config')
local quorum = require('smartcache.quorum')

local M = {}

M.PREFIX = 'events_'
M.FORMAT = {
    {name = 'seq', type = 'unsigned'},         -- gap-free, strictly increasing: the cursor
    {name = 'time', type = 'unsigned'},        -- ms since the epoch on the leader's clock (information only)
    {name = 'topic', type = 'string'},         -- session.created ..., or app.<name>
    {name = 'key', type = 'string'},           -- what the event is about: session, device or client id
    {name = 'payload', type = 'any', is_nullable = true},
}
M.F = {seq = 1, time = 2, topic = 3, key = 4, payload = 5}
M.META_FLOOR = 'events_floor'
-- Partitions exist from today to this many days ahead.
M.AHEAD_DAYS = 1
M.DAY_MS = 86400 * 1000

M.retention_days = config.events_retention_days
M.maintenance_interval_s = config.events_maintenance_s
-- The clock of partitions (ms since the epoch); tests replace it.
M.clock = util.now_ms
-- Called when this instance stops being writable: smartcache.events registers the
-- wake-up of its readers (set_on_demote).
local on_demote = nil

function M.set_on_demote(fn)
    on_demote = fn
end
-- Since start, on this instance.
M.counters = {created = 0, created_in_write = 0, dropped = 0, maintenance_errors = 0}
M.last_drop = nil

-- The UTC day of a time, as a partition names it (YYYYMMDD). The last day
-- asked is kept with its bounds: every event of a day asks for the same one.
local day_from, day_to, day_name = 0, 0, nil

function M.day_of(ms)
    if ms >= day_from and ms < day_to then
        return day_name
    end
    local name = os.date('!%Y%m%d', math.floor(ms / 1000))
    day_from = ms - ms % M.DAY_MS
    day_to, day_name = day_from + M.DAY_MS, name
    return name
end

-- The partition of a day (nil while it does not exist), its name made once per day.
local part_day, part_name = nil, nil

function M.space_of(day)
    if day ~= part_day then
        part_day, part_name = day, M.PREFIX .. day
    end
    return box.space[part_name]
end

-- The sorted names of the partitions (day order is name order).
function M.list()
    local out = {}
    for _, t in box.space._space.index.name:pairs({M.PREFIX}, {iterator = 'GE'}) do
        local name = t[3]
        if name:sub(1, #M.PREFIX) ~= M.PREFIX then
            break
        end
        if name:match('^events_%d%d%d%d%d%d%d%d$') then
            table.insert(out, name)
        end
    end
    return out
end

-- Create a day's partition (idempotent). DDL may run inside a transaction on
-- 2.6 as long as it does not yield (an empty space's index does not).
function M.create(day)
    local name = M.PREFIX .. day
    local s = box.schema.space.create(name, {format = M.FORMAT, if_not_exists = true})
    s:create_index('primary', {parts = {'seq'}, if_not_exists = true})
    quorum.guard(s)
    return s
end

-- The first write of a day whose partition does not exist yet (the maintenance
-- fiber creates them ahead: this is the first write of a new instance, or a
-- clock far ahead) creates it inside the writer's transaction. Its guard comes
-- with the creation's commit: the transaction is made synchronous now.
function M.create_in_write(day)
    local s = M.create(day)
    M.counters.created_in_write = M.counters.created_in_write + 1
    quorum.join()
    return s
end

-- The partition the last event went to and its day, remembered (checked at
-- each use: a rollback may have emptied it).
local head_space, head_day = nil, nil

-- The last sequence written, committed or not, and its partition's day (the floor and nil
-- while no event is kept).
function M.head()
    local s = head_space
    local top = s ~= nil and box.space[s.name] == s and s.index.primary:max() or nil
    if top == nil then
        local names = M.list()
        for i = #names, 1, -1 do
            s = box.space[names[i]]
            top = s.index.primary:max()
            if top ~= nil then
                break
            end
        end
        if top == nil then
            head_space, head_day = nil, nil
            return M.floor(), nil
        end
        head_space, head_day = s, s.name:sub(#M.PREFIX + 1)
    end
    return top[M.F.seq], head_day
end

-- An event went to the partition of this day (smartcache.events).
function M.wrote(s, day)
    head_space, head_day = s, day
end

function M.floor()
    local t = box.space.sc_meta:get(M.META_FLOOR)
    return t and t[2] or 0
end

-- Drop one partition whole; the floor moves past its last event in the same transaction.
function M.drop(name)
    local s = box.space[name]
    local top = s.index.primary:max()
    local events = s:len()
    local started = clock.monotonic()
    box.atomic(function()
        quorum.join()  -- synchronous: no asynchronous transaction in the limbo
        if top ~= nil and top[M.F.seq] > M.floor() then
            box.space.sc_meta:replace({M.META_FLOOR, top[M.F.seq]})
        end
        s:drop()
    end)
    local ms = (clock.monotonic() - started) * 1000
    M.counters.dropped = M.counters.dropped + 1
    M.last_drop = {partition = name, events = events, ms = ms}
    log.info('events: dropped partition %s (%d events) in %.2f ms', name, events, ms)
    return ms
end

-- One round on the writable instance: today's and the next days' partitions,
-- and those past retention dropped (never the one holding the newest event: a
-- clock that went back).
function M.maintain()
    local now = M.clock()
    for i = 0, M.AHEAD_DAYS do
        local day = M.day_of(now + i * M.DAY_MS)
        if box.space[M.PREFIX .. day] == nil then
            -- In a synchronous transaction of its own: DDL is a write of the leader too, and on 2.6.0 an
            -- asynchronous one must not meet synchronous writes in the limbo (smartcache.quorum, GUARDED).
            box.atomic(function()
                quorum.join()
                M.create(day)
            end)
            M.counters.created = M.counters.created + 1
            log.info('events: created partition %s%s', M.PREFIX, day)
        end
    end
    local _, newest = M.head()
    local cutoff = M.day_of(now - M.retention_days * M.DAY_MS)
    for _, name in ipairs(M.list()) do
        local day = name:sub(#M.PREFIX + 1)
        if day < cutoff and (newest == nil or day < newest) then
            M.drop(name)
        end
    end
end

-- Seconds until the next round: just past the next UTC midnight (a new day
-- begins, one passes retention), at most SC_EVENTS_MAINTENANCE_S.
local function next_round_s()
    local to_midnight = (M.DAY_MS - M.clock() % M.DAY_MS) / 1000 + 0.01
    return math.min(M.maintenance_interval_s, to_midnight)
end

local function loop()
    fiber.name('events_maintenance')
    local was_writable = false
    while true do
        local writable = util.writable()
        if writable then
            local ok, err = pcall(M.maintain)
            if ok then
                fiber.sleep(next_round_s())
            else
                M.counters.maintenance_errors = M.counters.maintenance_errors + 1
                log.error('events maintenance: %s', tostring(err))
                fiber.sleep(config.ERROR_PAUSE_S)
            end
        else
            if was_writable and on_demote ~= nil then
                on_demote()
            end
            fiber.sleep(config.ERROR_PAUSE_S)  -- a follower looks again soon: a promotion maintains within a second
        end
        was_writable = writable
    end
end

-- Partitions now on a writable instance (the first writes find today's), then the fiber.
function M.start()
    if util.writable() and box.space.sc_meta ~= nil then
        local ok, err = pcall(M.maintain)
        if not ok then
            log.error('events maintenance at start: %s', tostring(err))
        end
    end
    if M.fiber == nil or M.fiber:status() == 'dead' then
        M.fiber = fiber.create(loop)
    end
end

-- Each partition: name, events, first and last sequence, whether its writes are synchronous (sc_quorum).
function M.describe()
    local out = {}
    for _, name in ipairs(M.list()) do
        local s = box.space[name]
        local lo, hi = s.index.primary:min(), s.index.primary:max()
        table.insert(out, {name = name, events = s:len(), first_seq = lo and lo[M.F.seq] or box.NULL,
                           last_seq = hi and hi[M.F.seq] or box.NULL, guarded = quorum.is_guarded(s)})
    end
    return out
end

return M
