-- Counters, registers and sequences: Ignite's IgniteAtomicLong,
-- IgniteAtomicReference and IgniteAtomicSequence, each change one transaction.
--
-- * counter: an integer (|value| <= 2^53 - 1). add(delta) with optional
--   bounds: a change that would leave [min, max] changes nothing and answers
--   CONFLICT with the current value (a rate limit: add 1 with max = N). A
--   counter created with ttl_ms expires that long after its creation (a
--   fixed rate-limit window); later changes keep its deadline. An absent or
--   expired counter counts as 0 (rev 0) for add and compare-and-set.
-- * register: any msgpack value with a revision (1 at create, +1 per write);
--   compare-and-set by expected revision (0 = absent) and/or expected value.
--   Each write sets the TTL anew (none: never expires).
-- * sequence: hands out ranges [first, last]; the next range starts after
--   the last. The range is acknowledged once its write is durable (WAL, and
--   a quorum in HA mode), so ids never repeat across service instances,
--   restarts and leader failover; a range lost with its client leaves a gap.
local util = require('smartcache.util')
local config = require('smartcache.config')
local coord = require('smartcache.coordination.common')
local schema = require('smartcache.schema')
local FC, FR, FS = schema.F.counters, schema.F.registers, schema.F.sequences

local M = {}

local MAX = coord.MAX_SAFE
-- Most ids one reservation may take.
M.MAX_RESERVE = 10000000

local function check_ttl(ttl_ms)
    return coord.check_int(ttl_ms, 'ttl_ms', 1, config.max_ttl_ms, true)
end

-- Counters --------------------------------------------------------------------

local function live_counter(name, now)
    return util.live(box.space.counters, name, FC.expires_at, now)
end

local function counter_fields(t, now)
    if t == nil then
        return {value = 0, rev = 0}
    end
    return {value = tonumber(t[FC.value]), rev = t[FC.rev], expires_in_ms = coord.left(t[FC.expires_at], now)}
end

-- Write value; a counter created here (absent or expired) expires ttl_ms from now.
local function set_counter(t, name, value, ttl_ms, now)
    if t == nil then
        t = box.space.counters:replace({name, value, 1, now, coord.deadline(now, ttl_ms)})
    else
        t = box.space.counters:update(name, {{'=', FC.value, value}, {'+', FC.rev, 1}, {'=', FC.updated_at, now}})
    end
    return counter_fields(t, now)
end

function M.counter_get(name)
    local err = coord.check_name(name)
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    local t = live_counter(name, now)
    if t == nil then
        return util.result('NOT_FOUND')
    end
    return util.result('OK', counter_fields(t, now))
end

-- OK {value, rev, expires_in_ms?}: the value after the change.
-- CONFLICT {value, rev, expires_in_ms?}: the change would leave [min, max]; nothing changed.
function M.counter_add(name, delta, min, max, ttl_ms)
    delta, min, max, ttl_ms = util.opt(delta, 1), coord.arg(min), coord.arg(max), coord.arg(ttl_ms)
    local err = coord.check_name(name) or coord.check_int(delta, 'delta', -MAX, MAX)
        or coord.check_int(min, 'min', -MAX, MAX, true) or coord.check_int(max, 'max', -MAX, MAX, true)
        or check_ttl(ttl_ms)
    if err == nil and min ~= nil and max ~= nil and min > max then
        err = 'min must not be greater than max'
    end
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    return util.atomic(function()
        local t = live_counter(name, now)
        local value = (t and tonumber(t[FC.value]) or 0) + delta
        if (min ~= nil and value < min) or (max ~= nil and value > max) or math.abs(value) > MAX then
            return util.result('CONFLICT', counter_fields(t, now))
        end
        return util.result('OK', set_counter(t, name, value, ttl_ms, now))
    end)
end

-- OK {value, rev}: it was `expected` and is `value` now. CONFLICT {value, rev}: it was not.
function M.counter_cas(name, expected, value, ttl_ms)
    expected, value, ttl_ms = coord.arg(expected), coord.arg(value), coord.arg(ttl_ms)
    local err = coord.check_name(name) or coord.check_int(expected, 'expected', -MAX, MAX)
        or coord.check_int(value, 'value', -MAX, MAX) or check_ttl(ttl_ms)
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    return util.atomic(function()
        local t = live_counter(name, now)
        if (t and tonumber(t[FC.value]) or 0) ~= expected then
            return util.result('CONFLICT', counter_fields(t, now))
        end
        return util.result('OK', set_counter(t, name, value, ttl_ms, now))
    end)
end

-- Registers -------------------------------------------------------------------

local function live_register(name, now)
    return util.live(box.space.registers, name, FR.expires_at, now)
end

-- Equal msgpack values (maps by their keys, numbers by value): the compare of register_cas.
local same = util.same

function M.register_get(name)
    local err = coord.check_name(name)
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    local t = live_register(name, now)
    if t == nil then
        return util.result('NOT_FOUND')
    end
    return util.result('OK', {value = t[FR.value], rev = t[FR.rev], expires_in_ms = coord.left(t[FR.expires_at], now)})
end

-- Write value if the register's revision is expected_rev (0: absent) and its
-- value equals expected_value (each when given). OK {rev}; CONFLICT {rev, value}.
function M.register_cas(name, value, expected_rev, expected_value, ttl_ms)
    expected_rev, expected_value, ttl_ms = coord.arg(expected_rev), coord.arg(expected_value), coord.arg(ttl_ms)
    local err = coord.check_name(name) or coord.check_int(expected_rev, 'expected_rev', 0, MAX, true)
        or check_ttl(ttl_ms)
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    return util.atomic(function()
        local t = live_register(name, now)
        local rev = t and t[FR.rev] or 0
        if (expected_rev ~= nil and expected_rev ~= rev)
                or (expected_value ~= nil and (t == nil or not same(t[FR.value], expected_value))) then
            return util.result('CONFLICT', {rev = rev, value = t and t[FR.value] or nil})
        end
        local expires_at = coord.deadline(now, ttl_ms)
        box.space.registers:replace({name, rev + 1, now, expires_at, value})
        return util.result('OK', {rev = rev + 1, expires_in_ms = coord.left(expires_at, now)})
    end)
end

-- Sequences -------------------------------------------------------------------

-- OK {first, last}: count ids of their own. A new sequence starts at `start`
-- (default 1; ignored once it exists). CONFLICT {next}: past 2^53 - 1.
function M.sequence_reserve(name, count, start)
    count, start = coord.arg(count), util.opt(start, 1)
    local err = coord.check_name(name) or coord.check_int(count, 'count', 1, M.MAX_RESERVE)
        or coord.check_int(start, 'start', 0, MAX)
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    return util.atomic(function()
        local t = box.space.sequences:get(name)
        local first = t and tonumber(t[FS.next]) or start
        -- Compared as first > MAX - (count - 1), exact: first + count - 1 rounds past 2^53 (MAX + 2 - 1
        -- gave MAX: a range of 2 answered as [MAX, MAX]).
        if first > MAX - (count - 1) then
            return util.result('CONFLICT', {next = first})
        end
        local last = first + count - 1
        box.space.sequences:replace({name, last + 1, now})
        return util.result('OK', {first = first, last = last})
    end)
end

-- OK {next}: the first id the next reservation gets. NOT_FOUND: never reserved.
function M.sequence_get(name)
    local err = coord.check_name(name)
    if err ~= nil then
        return util.bad_request(err)
    end
    local t = box.space.sequences:get(name)
    if t == nil then
        return util.result('NOT_FOUND')
    end
    return util.result('OK', {next = tonumber(t[FS.next])})
end

return M
