-- Coordination primitives (issue 17): what a cluster of front servers needs
-- beside its sessions, as Apache Ignite builds them on its cache, here as
-- stored procedures that each run in one transaction:
--
--   smartcache.atomics     counters (add with bounds and TTL, compare-and-set),
--                          registers (msgpack value, compare-and-set by revision
--                          or value), sequences (id ranges)
--   smartcache.semaphores  semaphores and locks with leases and fencing tokens;
--                          acquire waits in FIFO order on a fiber.cond
--   smartcache.latches     count-down latches; await is woken by the change,
--                          local or replicated
--   smartcache.queues      task queues: ready/taken/delayed, time-to-run, one
--                          fiber for every timeout (after tarantool/queue's fifottl)
--
-- This module holds what they share (limits, argument checks, the wait
-- budget of a waiting procedure) and starts their run-time parts.
local fiber = require('fiber')
local clock = require('clock')

local M = {}

-- "No deadline": far in the future, yet small enough that Tarantool hands the
-- field back as a Lua number (above 2^47 it comes back as a 64-bit cdata).
M.NEVER = 2 ^ 46
-- Largest magnitude of a counter value or sequence id: exact in a Lua number
-- (and in JavaScript).
M.MAX_SAFE = 2 ^ 53 - 1
M.MAX_NAME_BYTES = 256
M.MAX_HOLDER_BYTES = 128
-- A waiting procedure gives up this long before its call's deadline, so its
-- answer reaches the service in time and nothing is granted to a caller that
-- has given up.
M.WAIT_MARGIN_MS = 5
-- Waiters look at util.writable() at least this often: one that sits on an
-- instance that stopped leading answers NOT_LEADER (the service re-sends the
-- call to the new leader) instead of waiting out its time.
M.WRITABLE_CHECK_S = 1

-- Checks: each returns an error message or nil.

function M.check_name(value, what)
    what = what or 'name'
    if type(value) ~= 'string' or #value == 0 or #value > M.MAX_NAME_BYTES then
        return string.format('%s must be a string of 1..%d bytes', what, M.MAX_NAME_BYTES)
    end
    return nil
end

function M.check_holder(value)
    if type(value) ~= 'string' or #value == 0 or #value > M.MAX_HOLDER_BYTES then
        return string.format('holder must be a string of 1..%d bytes', M.MAX_HOLDER_BYTES)
    end
    return nil
end

local function is_integer(v)
    return type(v) == 'number' and v == math.floor(v)
end

-- An integer in lo..hi (nil passes when optional).
function M.check_int(value, name, lo, hi, optional)
    if value == nil and optional then
        return nil
    end
    if not is_integer(value) or value < lo or value > hi then
        return string.format('%s must be an integer in %.0f..%.0f', name, lo, hi)
    end
    return nil
end

-- Milliseconds since the epoch of a deadline `ms` from now, or NEVER for nil.
function M.deadline(now, ms)
    if ms == nil then
        return M.NEVER
    end
    return now + ms
end

-- expires_in_ms for a reply: nil for NEVER.
function M.left(deadline, now)
    if deadline >= M.NEVER then
        return nil
    end
    return math.max(deadline - now, 0)
end

-- The clock.monotonic() moment a waiting procedure stops waiting: wait_ms
-- from now, and WAIT_MARGIN_MS before the call's deadline (ms on this
-- instance's clock; nil = none). Uncached clocks: fiber.clock() and
-- fiber.time() are those of the event loop's turn, which may be old by
-- whatever ran since.
function M.wait_end(wait_ms, deadline_ms)
    local budget = wait_ms
    if deadline_ms ~= nil then
        budget = math.min(budget, deadline_ms - M.WAIT_MARGIN_MS - clock.time() * 1000)
    end
    return clock.monotonic() + math.max(budget, 0) / 1000
end

-- A positional argument from msgpack: box.NULL (a nil in the caller's array) is nil.
function M.arg(value)
    if value == nil then
        return nil
    end
    return value
end

M.NOT_LEADER = {status = 'NOT_LEADER'}

-- Install the triggers (now, or once replication brings the spaces) and start the queue fiber.
function M.start()
    local semaphores = require('smartcache.semaphores')
    local latches = require('smartcache.latches')
    local queues = require('smartcache.queues')
    local function install()
        semaphores.install()
        latches.install()
        queues.install()
    end
    if box.space.queue_tasks ~= nil then
        install()
    else
        fiber.create(function()
            fiber.name('wait_schema_coordination')
            while box.space.queue_tasks == nil do
                fiber.sleep(0.1)
            end
            install()
        end)
    end
    queues.start()
end

-- For sc.stats: waiters right now on this instance, and what ran out.
function M.stats()
    local semaphores = require('smartcache.semaphores')
    local latches = require('smartcache.latches')
    local queues = require('smartcache.queues')
    return {
        semaphore_waiters = semaphores.waiters:total(),
        latch_waiters = latches.waiters:total(),
        queue_waiters = queues.waiters:total(),
        leases_expired = semaphores.expired,
        tasks_ttr_returned = queues.counters.ttr_returned,
        tasks_expired = queues.counters.expired,
        tasks_delay_ended = queues.counters.delay_ended,
    }
end

return M
