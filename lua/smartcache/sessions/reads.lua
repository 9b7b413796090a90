-- Session reads, and the sliding deadline they move: get (read and refresh),
-- touch (refresh only), locate (where an unsharded id lives), list (a client's
-- sessions). A session whose deadline has passed is NOT_FOUND at once, swept or
-- not. A read slides the deadline at most once per tenth of the session's TTL
-- (refresh_after_ms): a session read every few seconds costs a synchronous
-- write per tenth of its life, not per read.
local log = require('log')
local util = require('smartcache.util')
local config = require('smartcache.config')
local sharding = require('smartcache.sharding')
local F = require('smartcache.schema').F.sessions

local M = {}

local function live(id, now)
    return util.live(box.space.sessions, id, F.expires_at, now)
end
M.live = live

-- How stale a session's last refresh may be before a read writes a new one:
-- a tenth of its TTL (SC_REFRESH_FRACTION), within SC_REFRESH_GRANULARITY_MS ..
-- SC_REFRESH_MAX_MS. Its deadline is at most that much earlier than exact
-- sliding would make it.
local function refresh_after_ms(ttl)
    return math.min(math.max(ttl * config.refresh_fraction, config.refresh_granularity_ms), config.refresh_max_ms)
end
M.refresh_after_ms = refresh_after_ms

-- Push the deadline to now + ttl, unless the last refresh is recent enough: a
-- session read every few seconds costs a (synchronous) write per tenth of its
-- life, not per read.
local function refresh(id, now)
    local t = live(id, now)
    if t == nil or now - t[F.updated_at] < refresh_after_ms(t[F.ttl_ms]) then
        return t
    end
    M.refreshes = M.refreshes + 1
    return box.space.sessions:update(id, {{'=', F.updated_at, now}, {'=', F.expires_at, now + t[F.ttl_ms]}})
end
-- Refreshes written (reads and touches that moved a deadline), for sc.stats: writes per read.
M.refreshes = 0

-- Refresh failures seen by reads (no lease, disk or memory full), logged once per streak.
M.refresh_failures = 0

-- Where a session lives, for an id made before sharding (version 4: it carries no
-- bucket): its bucket here, if this shard has it live. A read that writes nothing
-- (no refresh), asked of every shard by the service (docs/design/sharding.md).
function M.locate(id)
    local err = util.check(id, 'string', 'session id')
    if err ~= nil then
        return util.bad_request(err)
    end
    local t = live(id, util.now_ms())
    if t == nil then
        return util.result('NOT_FOUND')
    end
    local count = sharding.count()
    return util.result('OK', {bucket = count and sharding.of(t[F.client_id], count) or box.NULL})
end

-- A read slides the deadline when it can. When the refresh cannot be written
-- (not writable, disk or memory full) the read still answers the data, with
-- refresh_failed = true: the deadline did not move.
function M.get(id)
    local now = util.now_ms()
    local t, failed
    if util.writable() then
        local ok, res = pcall(refresh, id, now)
        if ok then
            t = res
        else
            failed = true
            if M.refresh_failures == 0 then
                log.warn('session refresh failed, reads go on without sliding: %s', tostring(res))
            end
            M.refresh_failures = M.refresh_failures + 1
        end
    else
        failed = true
    end
    if failed then
        t = live(id, now)
        failed = t ~= nil and now - t[F.updated_at] >= refresh_after_ms(t[F.ttl_ms]) or nil
    elseif M.refresh_failures > 0 then
        log.info('session refresh works again after %d failed reads', M.refresh_failures)
        M.refresh_failures = 0
    end
    if t == nil then
        return util.result('NOT_FOUND')
    end
    return util.result('OK', {
        client_id = t[F.client_id], version = t[F.version], data = t[F.data], rev = t[F.rev],
        updated_at_ms = t[F.updated_at], expires_in_ms = t[F.expires_at] - now, refresh_failed = failed,
    })
end

function M.touch(id)
    local now = util.now_ms()
    local t = refresh(id, now)
    if t == nil then
        return util.result('NOT_FOUND')
    end
    return util.result('OK', {expires_in_ms = t[F.expires_at] - now})
end

function M.list(client_id)
    local err = util.check(client_id, 'string', 'client_id')
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    local out = {}
    for _, t in box.space.sessions.index.by_client:pairs({client_id}, {iterator = 'EQ'}) do
        if t[F.expires_at] > now then
            table.insert(out, {session_id = t[F.id], version = t[F.version], rev = t[F.rev],
                               created_at_ms = t[F.created_at] or t[F.updated_at], updated_at_ms = t[F.updated_at],
                               expires_in_ms = t[F.expires_at] - now, device = t[F.device]})
        end
    end
    return util.result('OK', {sessions = out})
end

return M
