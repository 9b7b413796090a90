-- What the coordination primitives (smartcache.coordination) share: limits,
-- argument checks, deadlines, the wait budget of a waiting procedure.
local clock = require('clock')
local config = require('smartcache.config')
local util = require('smartcache.util')

local M = {}

-- "No deadline": far in the future, yet small enough that Tarantool hands the
-- field back as a Lua number (above 2^47 it comes back as a 64-bit cdata).
M.NEVER = 2 ^ 46
-- Largest magnitude of a counter value or sequence id: exact in a Lua number
-- (and in JavaScript).
M.MAX_SAFE = util.MAX_SAFE
M.MAX_NAME_BYTES = 256
M.MAX_HOLDER_BYTES = 128
-- A waiting procedure gives up config.WAIT_MARGIN_MS before its call's
-- deadline (wait_end), and its waiters look at util.writable() at least every
-- config.WRITABLE_CHECK_S (the deadline budget, in smartcache.config).

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
-- from now, and config.WAIT_MARGIN_MS before the call's deadline (ms on this
-- instance's clock; nil = none). Uncached clocks: fiber.clock() and
-- fiber.time() are those of the event loop's turn, which may be old by
-- whatever ran since.
function M.wait_end(wait_ms, deadline_ms)
    local budget = wait_ms
    if deadline_ms ~= nil then
        budget = math.min(budget, deadline_ms - config.WAIT_MARGIN_MS - clock.time() * 1000)
    end
    return clock.monotonic() + math.max(budget, 0) / 1000
end

-- A positional argument from msgpack: box.NULL (a nil in the caller's array) is nil.
function M.arg(value)
    if value == nil then
        return nil
    end
    return util.plain(value)
end

M.NOT_LEADER = {status = 'NOT_LEADER'}

return M
