-- Session reads, and the sliding deadline they move: get (read and refresh),
-- touch (refresh only), locate (where an unsharded id lives), list (a client's
-- sessions). A session whose deadline has passed is NOT_FOUND at once, swept or
-- not. A read slides the deadline at most once per tenth of the session's TTL
-- (refresh_after_ms): a session read every few seconds costs a synchronous
-- write per tenth of its life, not per read; and never past the session's
-- absolute deadline (smartcache.sessions.access), where it writes nothing more.
-- A read by the old id of a rotated session, within its grace window, answers the
-- session it was rotated to (rotated = true) and never refreshes it.
local log = require('log')
local util = require('smartcache.util')
local config = require('smartcache.config')
local sharding = require('smartcache.sharding')
local access = require('smartcache.sessions.access')
local events = require('smartcache.events')
local F = require('smartcache.schema').F.sessions

local M = {}

local live = access.live
M.live = live

-- How stale a session's last refresh may be before a read writes a new one:
-- a tenth of its TTL (SC_REFRESH_FRACTION), within SC_REFRESH_GRANULARITY_MS ..
-- SC_REFRESH_MAX_MS. Its deadline is at most that much earlier than exact
-- sliding would make it.
local function refresh_after_ms(ttl)
    return math.min(math.max(ttl * config.refresh_fraction, config.refresh_granularity_ms), config.refresh_max_ms)
end
M.refresh_after_ms = refresh_after_ms

-- Whether a read or touch at now writes a refresh: the last one is old enough, and the deadline is
-- not at the absolute one already (then a refresh would move nothing: no write).
local function due(t, now)
    if now - t[F.updated_at] < refresh_after_ms(t[F.ttl_ms]) then
        return false
    end
    local absolute = t[F.absolute_at]
    return absolute == nil or t[F.expires_at] < absolute
end

-- In how many ms a read or touch of t would write a refresh (0: the next one does); nil when none will (the
-- deadline is the absolute one). Revision 12: a client's near cache sends SESSION_TOUCH on that schedule.
local function refresh_in_ms(t, now)
    local absolute = t[F.absolute_at]
    if absolute ~= nil and t[F.expires_at] >= absolute then
        return nil
    end
    return math.max(0, refresh_after_ms(t[F.ttl_ms]) - (now - t[F.updated_at]))
end

-- Push the deadline to now + ttl (never past the absolute one); the refreshed tuple.
local function refresh(t, now)
    M.refreshes = M.refreshes + 1
    return box.space.sessions:update(t[F.id], access.refresh_ops(t, now))
end
-- Refreshes written (reads and touches that moved a deadline), for sc.stats: writes per read.
M.refreshes = 0

-- Refresh failures seen by reads (no lease, disk or memory full), logged once per streak.
M.refresh_failures = 0

-- Where a session lives, for an id made before sharding (version 4: it carries no
-- bucket): its bucket here, if this shard has it live (or, within a rotation's grace
-- window, the session it was rotated to). A read that writes nothing (no refresh),
-- asked of every shard by the service (docs/design/sharding.md).
function M.locate(id)
    local err = util.check(id, 'string', 'session id')
    if err ~= nil then
        return util.bad_request(err)
    end
    local t = access.resolve(id, util.now_ms())
    if t == nil then
        return util.result('NOT_FOUND')
    end
    local count = sharding.count()
    return util.result('OK', {bucket = count and sharding.of(t[F.client_id], count) or box.NULL})
end

-- A read slides the deadline when it can. When the refresh cannot be written
-- (not writable, disk or memory full) the read still answers the data, with
-- refresh_failed = true: the deadline did not move. A binding that does not match
-- refuses it before anything is refreshed.
function M.get(id, binding)
    binding = util.opt(binding, nil)
    local err = util.check(id, 'string', 'session id') or access.check_binding(binding)
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    -- The read's position in the shard's event log (revision 12), taken with no yield before the tuple is read:
    -- every change this read does not see has a later sequence, so a client's near cache drops its copy at the
    -- first event of the session after it. None with events off (nothing would ever invalidate a copy).
    local seq = events.enabled() and events.visible() or nil
    local t, rotated = access.resolve(id, now)
    if t == nil then
        return util.result('NOT_FOUND')
    end
    if not access.bound(t, binding) then
        return access.mismatch_read(t)
    end
    local failed = nil
    if not rotated and due(t, now) then
        local ok, res = false, nil
        if util.writable() then
            ok, res = pcall(refresh, t, now)
            if not ok and M.refresh_failures == 0 then
                log.warn('session refresh failed, reads go on without sliding: %s', tostring(res))
            end
        end
        if ok then
            t = res
            if M.refresh_failures > 0 then
                log.info('session refresh works again after %d failed reads', M.refresh_failures)
                M.refresh_failures = 0
            end
        else
            failed = true
            M.refresh_failures = M.refresh_failures + (res ~= nil and 1 or 0)
        end
    end
    return util.result('OK', access.expiry_fields(t, now, {
        client_id = t[F.client_id], version = t[F.version], data = t[F.data], rev = t[F.rev],
        updated_at_ms = t[F.updated_at], refresh_failed = failed, rotated = rotated or nil,
        handle = (not rotated) and access.name(t) or nil, seq = (not rotated) and seq or nil,
        refresh_in_ms = (not rotated) and refresh_in_ms(t, now) or nil,
    }))
end

-- A refresh only (a write: the old id of a rotated session is NOT_FOUND).
function M.touch(id, binding)
    binding = util.opt(binding, nil)
    local err = util.check(id, 'string', 'session id') or access.check_binding(binding)
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    return util.atomic(function()
        local t, refused = access.acting_on(id, binding, now)
        if t == nil then
            return refused
        end
        if due(t, now) then
            t = refresh(t, now)
        end
        return util.result('OK', access.expiry_fields(t, now, {refresh_in_ms = refresh_in_ms(t, now)}))
    end)
end

-- A client's live sessions, each named by its handle (never its id: "list my devices" must not
-- hand out the other devices' credentials), without their data.
function M.list(client_id)
    local err = util.check(client_id, 'string', 'client_id')
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    local out = {}
    for _, t in box.space.sessions.index.by_client:pairs({client_id}, {iterator = 'EQ'}) do
        if access.alive(t, now) then
            table.insert(out, access.expiry_fields(t, now, {
                handle = access.name(t), version = t[F.version], rev = t[F.rev],
                created_at_ms = access.created_at(t), updated_at_ms = t[F.updated_at],
                device = t[F.device]}))
        end
    end
    return util.result('OK', {sessions = out})
end

return M
