-- Expiry fibers: one per space, sweeping by its by_deadline index.
--
-- Each fiber deletes due tuples in batches of sweep_batch (yielding between
-- batches), then sleeps until the next deadline, read after its batch
-- committed (at most sweep_max_sleep_s). A write that gives a tuple a deadline
-- before the fiber's wake-up says so (deadline_set: sessions.create and a
-- rotation's grace window, through their on_deadline hooks) and wakes it: a session's session.expired event comes
-- at its deadline plus the batches due before it, whatever sweep_max_sleep_s
-- is. (It did not before: with SC_SWEEP_MAX_SLEEP_S = 15 a 1 s session was
-- swept up to 15 s after it was created, measured 12.9 s.) Only a new tuple can
-- be due before the wake-up: a refresh or an update moves a deadline later. It
-- does nothing on a read-only instance, and survives errors (logged, retried
-- after a pause).
local fiber = require('fiber')
local log = require('log')
local util = require('smartcache.util')
local config = require('smartcache.config')
local schema = require('smartcache.schema')
local sessions = require('smartcache.sessions')
local sharding = require('smartcache.sharding')

local M = {}

M.expired = {sessions = 0, cache = 0, prewarm = 0, idempotency = 0, counters = 0, registers = 0, latches = 0,
             semaphore_holders = 0, rotations = 0}
M.errors = 0
-- Due rows of buckets that are moving (not active here) passed over per sweep at most, and how long
-- a sweep that found only those waits before it looks again.
M.SKIP_MAX = 10000
M.SKIP_PAUSE_S = 0.5
-- True while all sweeping is held (set_paused: tests, maintenance); the fibers keep sleeping.
M.paused = false

-- Hold all sweeping (on = true) or let it go on; returns whether it was held before.
function M.set_paused(on)
    local was = M.paused
    M.paused = on and true or false
    return was
end

-- delete(t) for a space whose primary key is these fields of its tuples.
local function by_key(space_name, ...)
    local fields = {...}
    return function(t)
        local key = {}
        for i, f in ipairs(fields) do
            key[i] = t[f]
        end
        box.space[space_name]:delete(key)
    end
end

-- Per space: deadline field and how to delete one due tuple.
local F = schema.F
local spaces = {
    sessions = {deadline = F.sessions.expires_at, delete = function(t)
        sessions.drop(t[F.sessions.id])  -- cascades to the session's cache
    end},
    cache = {deadline = F.cache.expires_at, delete = by_key('cache', F.cache.session_id, F.cache.key)},
    -- The end of a rotated session's grace window: its old id is NOT_FOUND from then on.
    rotations = {deadline = F.rotations.expires_at, delete = by_key('rotations', F.rotations.old_id)},
    prewarm = {deadline = F.prewarm.expires_at, delete = by_key('prewarm', F.prewarm.client_id, F.prewarm.data_type)},
    idempotency = {deadline = F.idempotency.expires_at, delete = by_key('idempotency', F.idempotency.key)},
    -- Coordination (smartcache.coordination): TTLs, and semaphore leases that
    -- ran out (the delete wakes the semaphore's first waiter).
    counters = {deadline = F.counters.expires_at, delete = by_key('counters', F.counters.name)},
    registers = {deadline = F.registers.expires_at, delete = by_key('registers', F.registers.name)},
    latches = {deadline = F.latches.expires_at, delete = by_key('latches', F.latches.name)},
    semaphore_holders = {deadline = F.semaphore_holders.lease_until,
                         delete = by_key('semaphore_holders', F.semaphore_holders.name, F.semaphore_holders.holder)},
}

-- Per space: while its fiber sleeps until the next deadline, when it wakes (ms since the
-- epoch; nil while it sweeps or sleeps for another reason), and the cond it sleeps on.
local wake_at, wake = {}, {}
for name in pairs(spaces) do
    wake[name] = fiber.cond()
end

-- A tuple of space `name` was given deadline `at` (ms since the epoch): wake the fiber
-- if it sleeps past it. A write calls it inside its transaction (nothing yields).
function M.deadline_set(name, at)
    local w = wake_at[name]
    if w ~= nil and at < w then
        wake_at[name] = nil
        wake[name]:signal()
    end
end

sessions.set_on_deadline(function(at)
    M.deadline_set('sessions', at)
end)
sessions.set_on_rotation_deadline(function(at)
    M.deadline_set('rotations', at)
end)

-- Delete up to one batch of due tuples; returns (deleted, seconds until the next deadline).
-- The next deadline is read after the batch committed: a tuple written while the
-- delete waited for its WAL write (or quorum) is seen, with nothing to wake the fiber.
function M.sweep_once(name)
    local spec = spaces[name]
    local index = box.space[name].index.by_deadline
    local now = util.now_ms()
    local due, skipped = {}, 0
    for _, t in index:pairs({}, {iterator = 'GE'}) do
        if t[spec.deadline] > now or #due >= config.sweep_batch or skipped >= M.SKIP_MAX then
            break
        end
        if sharding.serves_row(name, t) then
            table.insert(due, t)
        else
            skipped = skipped + 1  -- a moving bucket's row: left as the copy reads it (the new shard expires it)
        end
    end
    if #due > 0 then
        util.atomic(function()
            for _, t in ipairs(due) do
                spec.delete(t)
            end
        end)
        M.expired[name] = M.expired[name] + #due
    end
    local next_in = config.sweep_max_sleep_s
    local first = index:min()
    if first ~= nil then
        next_in = math.min(next_in, math.max(first[spec.deadline] - util.now_ms(), 0) / 1000)
    end
    if skipped > 0 and #due == 0 then
        next_in = math.max(next_in, M.SKIP_PAUSE_S)  -- only rows of moving buckets are due: no busy loop
    end
    return #due, next_in
end

local function loop(name)
    fiber.name('expiry_' .. name)
    while true do
        if M.paused or not util.writable() or box.space[name] == nil then
            fiber.sleep(config.sweep_max_sleep_s)
        else
            local ok, n, next_in = pcall(M.sweep_once, name)
            if not ok then
                M.errors = M.errors + 1
                log.error('expiry %s: %s', name, tostring(n))
                fiber.sleep(config.ERROR_PAUSE_S)
            elseif next_in > 0 then
                wake_at[name] = util.now_ms() + next_in * 1000
                wake[name]:wait(next_in)
                wake_at[name] = nil
            else
                fiber.yield()
            end
        end
    end
end

M.fibers = {}

function M.start()
    for name in pairs(spaces) do
        if M.fibers[name] == nil or M.fibers[name]:status() == 'dead' then
            M.fibers[name] = fiber.create(loop, name)
        end
    end
end

return M
