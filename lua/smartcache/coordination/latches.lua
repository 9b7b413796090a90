-- Count-down latches (Ignite's IgniteCountDownLatch).
--
-- create(name, count, ttl_ms) makes a latch of `count`; count_down(name, n)
-- takes n off (never below 0); await(name, wait_ms) returns as soon as the
-- count is 0. Awaiters wait on a fiber.cond woken by an on_replace trigger,
-- so a count-down that arrives by replication wakes them as well as a local
-- one (Ignite pushes the change to every node with a continuous query; here
-- the replication stream is that push), on any instance, read-only included.
-- A latch lives until its TTL, zero or not, so a late awaiter still sees it
-- open; when it expires, its awaiters get NOT_FOUND.
local util = require('smartcache.util')
local config = require('smartcache.config')
local coord = require('smartcache.coordination.common')
local waitlist = require('smartcache.coordination.waitlist')
local sharding = require('smartcache.sharding')
local clock = require('clock')
local F = require('smartcache.schema').F.latches

local M = {}

M.MAX_COUNT = 1000000000
M.DEFAULT_TTL_MS = 3600 * 1000
M.waiters = waitlist.new()

local function live(name, now)
    return util.live(box.space.latches, name, F.expires_at, now)
end

-- OK {count, expires_in_ms} · ALREADY_EXISTS {count, expires_in_ms}: a live latch of that name exists.
function M.create(name, count, ttl_ms)
    ttl_ms = util.opt(ttl_ms, M.DEFAULT_TTL_MS)
    local err = coord.check_name(name) or coord.check_int(count, 'count', 1, M.MAX_COUNT)
        or coord.check_int(ttl_ms, 'ttl_ms', 1, config.max_ttl_ms)
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    return util.atomic(function()
        local t = live(name, now)
        if t ~= nil then
            return util.result('ALREADY_EXISTS', {count = t[F.count], expires_in_ms = t[F.expires_at] - now})
        end
        box.space.latches:replace({name, count, count, now, now + ttl_ms})
        return util.result('OK', {count = count, expires_in_ms = ttl_ms})
    end)
end

-- OK {count}: the count after taking n (default 1) off · NOT_FOUND.
function M.count_down(name, n)
    n = util.opt(n, 1)
    local err = coord.check_name(name) or coord.check_int(n, 'n', 1, M.MAX_COUNT)
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    return util.atomic(function()
        local t = live(name, now)
        if t == nil then
            return util.result('NOT_FOUND')
        end
        local count = math.max(t[F.count] - n, 0)
        if count ~= t[F.count] then
            box.space.latches:update(name, {{'=', F.count, count}})
        end
        return util.result('OK', {count = count})
    end)
end

local function wait_open(w, name, stop)
    while true do
        local moving = w.list ~= nil and sharding.refusal('key', name)  -- its bucket began to move: not here now
        if moving then
            return moving
        end
        local now = util.now_ms()
        local t = live(name, now)
        if t == nil then
            return util.result('NOT_FOUND')
        end
        if t[F.count] == 0 then
            return util.result('OK', {count = 0})
        end
        local left = stop - clock.monotonic()
        if left <= 0 then
            return util.result('TIMEOUT', {count = t[F.count], message = 'the latch did not reach 0 within wait_ms'})
        end
        if w.list == nil then
            w.list = M.waiters:join(name)
        end
        -- Woken by the change; the timer only for the wait's end or the latch's expiry.
        M.waiters:wait(w.list, math.min(left, (t[F.expires_at] - now + 1) / 1000))
    end
end

-- OK {count = 0} · TIMEOUT {count} · NOT_FOUND (no such latch, or it expired meanwhile).
-- A read: runs on any instance; the idempotency key is not used.
function M.await(deadline_ms, _, name, wait_ms)
    wait_ms = util.opt(wait_ms, 0)
    local err = coord.check_name(name) or coord.check_int(wait_ms, 'wait_ms', 0, config.max_wait_ms)
    if err ~= nil then
        return util.bad_request(err)
    end
    local w = {}
    local ok, res = pcall(wait_open, w, name, coord.wait_end(wait_ms, deadline_ms))
    if w.list ~= nil then
        M.waiters:leave(w.list)
    end
    if not ok then
        error(res)
    end
    return res
end

-- OK {count, initial, expires_in_ms, waiters} · NOT_FOUND (for operators).
function M.get(name)
    local err = coord.check_name(name)
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    local t = live(name, now)
    if t == nil then
        return util.result('NOT_FOUND')
    end
    return util.result('OK', {count = t[F.count], initial = t[F.initial], expires_in_ms = t[F.expires_at] - now,
                              waiters = M.waiters:count(name)})
end

-- Reached zero or went away (a local write or a replicated one): wake every awaiter.
local function on_replace(old, new)
    if new == nil then
        M.waiters:wake_all(old[F.name])
    elseif new[F.count] == 0 then
        M.waiters:wake_all(new[F.name])
    end
end

function M.install()
    box.space.latches:on_replace(on_replace, M.installed)
    M.installed = on_replace
end

return M
