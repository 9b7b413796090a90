-- Semaphores and locks with leases (a lock is a semaphore of one permit).
--
-- A semaphore `name` of `permits` permits is held by at most `permits`
-- holders at once, each holding one permit for a lease. Nothing else is
-- stored: a name without holders has no tuple, and every caller states the
-- size (callers of one name must agree on it).
--
-- * acquire(name, permits, holder, lease_ms, wait_ms): a permit for lease_ms,
--   with a fencing token; by a holder that holds one already: the same token,
--   lease renewed (so a repeated acquire is harmless). With no permit free it
--   waits up to wait_ms inside Tarantool on a fiber.cond, in arrival order:
--   a newcomer never overtakes a waiter (fair FIFO). A release hands the
--   permit straight to the first waiter in its own transaction (one durable
--   write per hand-over, not two; in HA mode one quorum round trip), and
--   wakes it once that commits; a lease that runs out frees a permit without
--   any write, so the first waiter's timer is set to the earliest lease end
--   and it takes the permit itself.
-- * renew(name, holder, lease_ms): the lease now runs lease_ms from now;
--   NOT_FOUND when it had passed already (the permit is gone).
-- * release(name, holder): OK, or NOT_FOUND when it was not held (or the
--   lease had passed: someone else may have had the permit since).
--
-- Leases replace membership: a holder that dies (no renewal) loses its permit
-- when its lease ends, without anyone noticing its death (Ignite returns the
-- permits of a node that left the cluster; here the lease is the only rule).
-- A holder passed its lease counts as free at once, swept or not.
--
-- Fencing: tokens come from one sequence for all names, so they grow per name;
-- a resource that remembers the highest token it has seen can refuse a
-- holder whose lease passed while it was paused (Kleppmann's fencing token).
local clock = require('clock')
local util = require('smartcache.util')
local config = require('smartcache.config')
local coord = require('smartcache.coordination.common')
local waitlist = require('smartcache.coordination.waitlist')
local sharding = require('smartcache.sharding')
local idempotency = require('smartcache.idempotency')
local F = require('smartcache.schema').F.semaphore_holders

local M = {}

M.MAX_PERMITS = 100000
-- Waiters per name, in arrival order (on the instance that runs the calls: the leader).
M.waiters = waitlist.new()
-- Leases found passed by a procedure (release, renew, re-acquire); the expiry fiber counts its own.
M.expired = 0

local function space()
    return box.space.semaphore_holders
end

-- Live holders of name, and the earliest end of their leases.
local function live_holders(name, now)
    local n, earliest = 0, nil
    for _, t in space():pairs({name}) do
        local lease_until = t[F.lease_until]
        if lease_until > now then
            n = n + 1
            if earliest == nil or lease_until < earliest then
                earliest = lease_until
            end
        end
    end
    return n, earliest
end

local function check(name, holder, lease_ms)
    return coord.check_name(name) or coord.check_holder(holder)
        or coord.check_int(lease_ms, 'lease_ms', 1, config.max_ttl_ms)
end

-- One transaction: the holder's own live permit (renewed), else a free one
-- when `may_take` (nobody waits ahead); nil when none.
local function grant(name, permits, holder, lease_ms, may_take)
    local now = util.now_ms()
    return util.atomic(function()
        local mine = space():get({name, holder})
        if mine ~= nil and mine[F.lease_until] > now then
            space():update({name, holder}, {{'=', F.lease_until, now + lease_ms}})
            return util.result('OK', {token = mine[F.token], lease_ms = lease_ms})
        end
        if not may_take or live_holders(name, now) >= permits then
            return nil
        end
        if mine ~= nil then
            M.expired = M.expired + 1
        end
        local token = box.sequence.sc_fence:next()
        space():replace({name, holder, token, permits, now, now + lease_ms})
        return util.result('OK', {token = token, lease_ms = lease_ms})
    end)
end

-- In a release's transaction: give the freed permit to the first waiter of
-- name, if it may have it; it learns so when the transaction commits.
local function hand_over(name, now)
    local w = M.waiters:head(name)
    if w == nil or w.handing or w.grant ~= nil or live_holders(name, now) >= w.permits then
        return
    end
    local mine = space():get({name, w.holder})
    if mine ~= nil and mine[F.lease_until] > now then
        return  -- it holds one already (a repeated acquire): it renews its own
    end
    local token = box.sequence.sc_fence:next()
    space():replace({name, w.holder, token, w.permits, now, now + w.lease_ms})
    w.handing = true
    box.on_commit(function()
        w.handing, w.grant = nil, {token = token, lease_ms = w.lease_ms}
        M.waiters:wake(w)
    end)
    box.on_rollback(function()
        w.handing = nil
        M.waiters:wake(w)
    end)
end

local function timeout(name)
    return util.result('TIMEOUT', {holders = live_holders(name, util.now_ms()),
                                   message = 'no permit free within wait_ms'})
end

-- Wait in line until a permit is ours, the wait ends, or this instance stops leading.
-- A permit handed over by a release (committed), or nil. Waits for a hand-over being committed.
local function handed(w)
    while w.handing do
        M.waiters:wait(w, config.WRITABLE_CHECK_S)
    end
    if w.grant ~= nil then
        return util.result('OK', w.grant)
    end
    return nil
end

local function wait_turn(w, name, permits, holder, lease_ms, stop)
    w.holder, w.permits, w.lease_ms = holder, permits, lease_ms  -- for a release that hands over
    local waiters = M.waiters
    while true do
        local left = stop - clock.monotonic()
        if left <= 0 then
            return handed(w) or timeout(name)
        end
        local nap = math.min(left, config.WRITABLE_CHECK_S)
        if waiters:is_head(w) then
            -- A lease that runs out frees a permit without any write: be up by then.
            local now = util.now_ms()
            local _, earliest = live_holders(name, now)
            if earliest ~= nil then
                nap = math.min(nap, (earliest - now + 1) / 1000)
            end
        end
        waiters:wait(w, nap)
        local got = handed(w)
        if got == nil and not util.writable() then
            return coord.NOT_LEADER
        end
        local moving = got == nil and sharding.refusal('key', name)  -- its bucket began to move
        if moving then
            return moving
        end
        if got == nil and waiters:is_head(w) then
            got = grant(name, permits, holder, lease_ms, true)
        end
        if got ~= nil then
            return got
        end
    end
end

-- OK {token, lease_ms} · TIMEOUT {holders} · NOT_LEADER. deadline_ms: the
-- call's (no permit is granted after it). The idempotency key is checked and
-- otherwise unused: the holder makes a repeat harmless (the same token).
function M.acquire(deadline_ms, key, name, permits, holder, lease_ms, wait_ms)
    permits, wait_ms = util.opt(permits, 1), util.opt(wait_ms, 0)
    local err = check(name, holder, lease_ms) or coord.check_int(permits, 'permits', 1, M.MAX_PERMITS)
        or coord.check_int(wait_ms, 'wait_ms', 0, config.max_wait_ms)
        or (key ~= nil and idempotency.check_key(key)) or nil
    if err ~= nil then
        return util.bad_request(err)
    end
    if not util.writable() then
        return coord.NOT_LEADER
    end
    local waiters = M.waiters
    local got = grant(name, permits, holder, lease_ms, waiters:count(name) == 0)
    if got ~= nil then
        return got
    end
    local stop = coord.wait_end(wait_ms, deadline_ms)
    if clock.monotonic() >= stop then
        return timeout(name)
    end
    return waiters:in_line(name, wait_turn, name, permits, holder, lease_ms, stop)
end

-- A holder whose lease had passed: counted, and NOT_FOUND.
local function lease_passed()
    M.expired = M.expired + 1
    return util.result('NOT_FOUND', {message = 'the lease had passed'})
end

-- OK {token, lease_ms} · NOT_FOUND (not held, or the lease had passed).
function M.renew(name, holder, lease_ms)
    local err = check(name, holder, lease_ms)
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    return util.atomic(function()
        local t = space():get({name, holder})
        if t == nil then
            return util.result('NOT_FOUND')
        end
        if t[F.lease_until] <= now then
            space():delete({name, holder})
            return lease_passed()
        end
        space():update({name, holder}, {{'=', F.lease_until, now + lease_ms}})
        return util.result('OK', {token = t[F.token], lease_ms = lease_ms})
    end)
end

-- OK · NOT_FOUND (not held, or the lease had passed).
function M.release(name, holder)
    local err = coord.check_name(name) or coord.check_holder(holder)
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    return util.atomic(function()
        local t = space():get({name, holder})
        if t == nil then
            return util.result('NOT_FOUND')
        end
        space():delete({name, holder})
        hand_over(name, now)
        if t[F.lease_until] <= now then
            return lease_passed()
        end
        return util.result('OK')
    end)
end

-- OK {holders: [{holder, token, permits, acquired_at_ms, lease_left_ms}], waiters} (for operators).
function M.get(name)
    local err = coord.check_name(name)
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    local holders = setmetatable({}, {__serialize = 'array'})
    for _, t in space():pairs({name}) do
        if t[F.lease_until] > now then
            table.insert(holders, {holder = t[F.holder], token = t[F.token], permits = t[F.permits],
                                   acquired_at_ms = t[F.acquired_at], lease_left_ms = t[F.lease_until] - now})
        end
    end
    return util.result('OK', {holders = holders, waiters = M.waiters:count(name)})
end

-- A permit given back (release, or a passed lease swept): the first waiter may take it.
local function on_replace(old, new)
    if old ~= nil and new == nil then
        M.waiters:wake_head(old[F.name])
    end
end

function M.install()
    space():on_replace(on_replace, M.installed)
    M.installed = on_replace
end

return M
