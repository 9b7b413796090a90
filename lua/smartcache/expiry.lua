-- Expiry fibers: one per space, sweeping by its by_deadline index.
--
-- Each fiber deletes due tuples in batches (yielding between batches), then
-- sleeps until the next deadline (at most sweep_max_sleep_s, so new earlier
-- deadlines are picked up). It does nothing on a read-only instance, and
-- survives errors (logged, retried after a pause).
local fiber = require('fiber')
local log = require('log')
local util = require('smartcache.util')
local config = require('smartcache.config')
local schema = require('smartcache.schema')
local sessions = require('smartcache.sessions')

local M = {}

M.expired = {sessions = 0, cache = 0, prewarm = 0, idempotency = 0, counters = 0, registers = 0, latches = 0,
             semaphore_holders = 0}
M.errors = 0
-- Set to true to hold all sweeping (tests, maintenance); the fibers keep sleeping.
M.paused = false

local ERROR_PAUSE_S = 1

-- Per space: deadline field and how to delete one due tuple.
local spaces = {
    sessions = {
        deadline = schema.F.sessions.expires_at,
        delete = function(t)
            sessions.drop(t[schema.F.sessions.id])  -- cascades to the session's cache
        end,
    },
    cache = {
        deadline = schema.F.cache.expires_at,
        delete = function(t)
            box.space.cache:delete({t[schema.F.cache.session_id], t[schema.F.cache.key]})
        end,
    },
    prewarm = {
        deadline = schema.F.prewarm.expires_at,
        delete = function(t)
            box.space.prewarm:delete({t[schema.F.prewarm.client_id], t[schema.F.prewarm.data_type]})
        end,
    },
    idempotency = {
        deadline = schema.F.idempotency.expires_at,
        delete = function(t)
            box.space.idempotency:delete(t[schema.F.idempotency.key])
        end,
    },
    -- Coordination (smartcache.coordination): TTLs, and semaphore leases that
    -- ran out (the delete wakes the semaphore's first waiter).
    counters = {
        deadline = schema.F.counters.expires_at,
        delete = function(t)
            box.space.counters:delete(t[schema.F.counters.name])
        end,
    },
    registers = {
        deadline = schema.F.registers.expires_at,
        delete = function(t)
            box.space.registers:delete(t[schema.F.registers.name])
        end,
    },
    latches = {
        deadline = schema.F.latches.expires_at,
        delete = function(t)
            box.space.latches:delete(t[schema.F.latches.name])
        end,
    },
    semaphore_holders = {
        deadline = schema.F.semaphore_holders.lease_until,
        delete = function(t)
            box.space.semaphore_holders:delete({t[schema.F.semaphore_holders.name],
                                                t[schema.F.semaphore_holders.holder]})
        end,
    },
}

-- Delete up to one batch of due tuples; returns (deleted, seconds until the next deadline).
function M.sweep_once(name)
    local spec = spaces[name]
    local now = util.now_ms()
    local due = {}
    local next_in = config.sweep_max_sleep_s
    for _, t in box.space[name].index.by_deadline:pairs({}, {iterator = 'GE'}) do
        if t[spec.deadline] > now then
            next_in = math.min(next_in, (t[spec.deadline] - now) / 1000)
            break
        end
        table.insert(due, t)
        if #due >= config.sweep_batch then
            next_in = 0
            break
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
                fiber.sleep(ERROR_PAUSE_S)
            elseif next_in > 0 then
                fiber.sleep(next_in)
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
