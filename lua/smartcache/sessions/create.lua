-- Session creation: a per-client limit of live sessions (refuse, or evict the
-- least recently used), decided in the transaction that inserts, so concurrent
-- creates cannot both pass; and the ids (version 8, carrying the client's
-- bucket, in a sharded cluster).
local util = require('smartcache.util')
local config = require('smartcache.config')
local events = require('smartcache.events')
local sharding = require('smartcache.sharding')
local ends = require('smartcache.sessions.ends')
local F = require('smartcache.schema').F.sessions

local M = {}

local of_client = ends.of_client

-- The limit of live sessions per client and what a create beyond it does.
M.POLICIES = {refuse = true, evict_oldest = true}
M.MAX_DEVICE_BYTES = 128

local function ttl_ms(ttl_s)
    if ttl_s == nil then
        return config.session_ttl_ms, nil
    end
    local err = util.check_positive(ttl_s, 'ttl_s', config.max_ttl_ms / 1000)
    return ttl_s * 1000, err
end

-- Called with each new session's deadline (ms since the epoch), inside its
-- transaction: smartcache.expiry registers the wake-up of its sweeper, which
-- may sleep past it (set_on_deadline).
local on_deadline = nil

function M.set_on_deadline(fn)
    on_deadline = fn
end

-- The client's live sessions, least recently used first (at most `limit`
-- looked at beyond the first `limit`: enough to decide a limit of that size).
local function live_of(client_id, now)
    local out = {}
    for _, t in box.space.sessions.index.by_client:pairs({client_id}, {iterator = 'EQ'}) do
        if t[F.expires_at] > now then
            table.insert(out, t)
        end
    end
    table.sort(out, function(a, b) return a[F.updated_at] < b[F.updated_at] end)
    return out
end

local function check_limit(max_sessions, policy)
    if max_sessions == nil then
        return config.max_sessions_per_client, policy or config.session_limit_policy, nil
    end
    local err = util.check_positive(max_sessions, 'max_sessions', 10000)
    if err == nil and policy ~= nil and not M.POLICIES[policy] then
        err = 'limit_policy must be refuse or evict_oldest'
    end
    return max_sessions, policy or config.session_limit_policy, err
end

-- A new session id of a client: version 4 (random), or in a sharded cluster
-- version 8 carrying the client's bucket (smartcache.sharding), so that every
-- later call on it routes with no lookup.
local function new_id(client_id)
    local id = util.uuid()
    local count = sharding.count()
    if count ~= nil then
        return sharding.session_id(id, sharding.of(client_id, count))
    end
    return id
end
M.new_id = new_id  -- a rotation's new id too (smartcache.sessions.update)

-- An id the caller chose must carry its client's bucket, if it carries one.
local function id_of_another_bucket(id, client_id)
    local count = sharding.count()
    local carried = count ~= nil and sharding.of_session(id) or nil
    if carried ~= nil and carried ~= sharding.of(client_id, count) then
        return string.format('session id carries bucket %d, client_id\'s bucket is %d', carried,
            sharding.of(client_id, count))
    end
    return nil
end

-- id nil: a new random (version 4) UUID, returned as session_id. Generated
-- here, so a repeat under an idempotency key has the same arguments.
-- max_sessions (default SC_MAX_SESSIONS_PER_CLIENT, 0 = none): the client's
-- live sessions after this one; beyond it, limit_policy 'refuse' answers
-- LIMIT_REACHED (saying nothing of the other sessions) and 'evict_oldest' ends
-- the least recently used ones (session.evicted each). Counted and decided in
-- the transaction that inserts, so concurrent creates cannot both pass.
function M.create(id, client_id, version, ttl_s, data, max_sessions, policy, device)
    local err = util.check(id, 'string', 'session id', true) or util.check(client_id, 'string', 'client_id')
        or util.check(version, 'string', 'version', true) or util.check(device, 'string', 'device', true)
    local ttl, limit
    if err == nil and device ~= nil and #device > M.MAX_DEVICE_BYTES then
        err = string.format('device must be a string of 0..%d bytes', M.MAX_DEVICE_BYTES)
    end
    if err == nil then
        ttl, err = ttl_ms(ttl_s)
    end
    if err == nil then
        limit, policy, err = check_limit(util.opt(max_sessions, nil), util.opt(policy, nil))
    end
    if err == nil and util.opt(id, nil) ~= nil then
        err = id_of_another_bucket(id, client_id)
    end
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    id = util.opt(id, nil) or new_id(client_id)
    return util.atomic(function()
        local t = box.space.sessions:get(id)
        if t ~= nil then
            if t[F.expires_at] > now then
                return util.result('ALREADY_EXISTS')
            end
            events.write('session.expired', id, of_client(t[F.client_id]))  -- expired, not swept yet: it ends here
        end
        local evicted = 0
        if limit > 0 then
            local others = live_of(client_id, now)
            if #others >= limit then
                if policy == 'refuse' then
                    return util.result('LIMIT_REACHED', {max_sessions = limit})
                end
                for i = 1, #others - limit + 1 do
                    ends.drop(others[i][F.id], 'session.evicted')
                    evicted = evicted + 1
                end
            end
        end
        util.replace(box.space.sessions, {id, client_id, util.opt(version, ''), 1, now, ttl, now + ttl,
                                          util.opt(data, box.NULL), now, util.opt(device, box.NULL)})
        events.write('session.created', id, of_client(client_id))
        if on_deadline ~= nil then
            on_deadline(now + ttl)
        end
        return util.result('OK', {session_id = id, expires_in_ms = ttl, rev = 1,
                                  evicted = evicted > 0 and evicted or nil})
    end)
end

return M
