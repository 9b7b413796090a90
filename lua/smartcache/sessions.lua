-- Sessions: create, get-and-refresh (sliding expiry), touch, update with
-- compare-and-set, delete (cascading to the session's cache), list by client.
--
-- A session whose deadline has passed is NOT_FOUND at once, swept or not.
local log = require('log')
local util = require('smartcache.util')
local config = require('smartcache.config')
local events = require('smartcache.events')
local F = require('smartcache.schema').F.sessions

local M = {}

local function live(id, now)
    local t = box.space.sessions:get(id)
    if t == nil or t[F.expires_at] <= now then
        return nil
    end
    return t
end
M.live = live

local function ttl_ms(ttl_s)
    if ttl_s == nil then
        return config.session_ttl_ms, nil
    end
    local err = util.check_positive(ttl_s, 'ttl_s', config.max_ttl_ms / 1000)
    return ttl_s * 1000, err
end

-- The payload of an event about a session: {client_id}, filled anew for each
-- event (the event's insert encodes it at once), so a write allocates none.
local about = {client_id = ''}
local function of_client(client_id)
    about.client_id = client_id
    return about
end

-- id nil: a new random (version 4) UUID, returned as session_id. Generated
-- here, so a repeat under an idempotency key has the same arguments.
function M.create(id, client_id, version, ttl_s, data)
    local err = util.check(id, 'string', 'session id', true) or util.check(client_id, 'string', 'client_id')
        or util.check(version, 'string', 'version', true)
    local ttl
    if err == nil then
        ttl, err = ttl_ms(ttl_s)
    end
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    id = util.opt(id, nil) or util.uuid()
    return util.atomic(function()
        local t = box.space.sessions:get(id)
        if t ~= nil then
            if t[F.expires_at] > now then
                return util.result('ALREADY_EXISTS')
            end
            events.write('session.expired', id, of_client(t[F.client_id]))  -- expired, not swept yet: it ends here
        end
        util.replace(box.space.sessions, {id, client_id, util.opt(version, ''), 1, now, ttl, now + ttl, data})
        events.write('session.created', id, of_client(client_id))
        return util.result('OK', {session_id = id, expires_in_ms = ttl, rev = 1})
    end)
end

-- Push the deadline to now + ttl. Within refresh_granularity_ms of the last
-- refresh nothing is written: a hot session costs no WAL write per read, and
-- its deadline is at most that much earlier than exact sliding would make it.
local function refresh(id, now)
    local t = live(id, now)
    if t == nil or now - t[F.updated_at] < config.refresh_granularity_ms then
        return t
    end
    return box.space.sessions:update(id, {{'=', F.updated_at, now}, {'=', F.expires_at, now + t[F.ttl_ms]}})
end

-- Refresh failures seen by reads (no lease, disk or memory full), logged once per streak.
M.refresh_failures = 0

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
        failed = t ~= nil and now - t[F.updated_at] >= config.refresh_granularity_ms or nil
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

function M.update(id, data, expected_rev, version)
    local err = util.check_positive(expected_rev, 'expected_rev', 2 ^ 53, true)
        or util.check(version, 'string', 'version', true)
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    return util.atomic(function()
        local t = live(id, now)
        if t == nil then
            return util.result('NOT_FOUND')
        end
        if expected_rev ~= nil and t[F.rev] ~= expected_rev then
            return util.result('CONFLICT', {rev = t[F.rev]})
        end
        local ops = {{'=', F.data, data}, {'+', F.rev, 1}, {'=', F.updated_at, now},
                     {'=', F.expires_at, now + t[F.ttl_ms]}}
        if version ~= nil then
            table.insert(ops, {'=', F.version, version})
        end
        t = box.space.sessions:update(id, ops)
        events.write('session.updated', id, {client_id = t[F.client_id], rev = t[F.rev]})
        return util.result('OK', {rev = t[F.rev], expires_in_ms = t[F.ttl_ms]})
    end)
end

-- Delete a session tuple and its cache entries, with its event (session.expired
-- past its deadline, else session.deleted); call inside a transaction.
local function drop(id)
    local entries = box.space.cache.index.primary:select({id}, {iterator = 'EQ'})
    for _, c in ipairs(entries) do
        box.space.cache:delete({c[1], c[2]})
    end
    local t = box.space.sessions:delete(id)
    if t ~= nil then
        local topic = t[F.expires_at] <= util.now_ms() and 'session.expired' or 'session.deleted'
        events.write(topic, id, of_client(t[F.client_id]))
    end
    return #entries
end
M.drop = drop

function M.delete(id)
    local now = util.now_ms()
    return util.atomic(function()
        if live(id, now) == nil then
            -- An expired leftover still goes, with its cache, but the answer is NOT_FOUND.
            if box.space.sessions:get(id) ~= nil then
                drop(id)
            end
            return util.result('NOT_FOUND')
        end
        return util.result('OK', {cache_deleted = drop(id)})
    end)
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
                               updated_at_ms = t[F.updated_at], expires_in_ms = t[F.expires_at] - now})
        end
    end
    return util.result('OK', {sessions = out})
end

return M
