-- Session creation: a per-client limit of live sessions (refuse, or evict the
-- least recently used), decided in the transaction that inserts, so concurrent
-- creates cannot both pass; the absolute deadline and the binding (issue 37).
--
-- The id is the service's: the stored id it derives from the raw id it made
-- (proto/PROTOCOL.md; storage never sees the raw id nor the key). Only a service
-- of revision 10, during a rolling upgrade, still creates without one: then the id
-- is made here as before (version 8, carrying the client's bucket, in a sharded
-- cluster) and the row is raw-keyed (no `stored` mark) until it is rekeyed.
local util = require('smartcache.util')
local config = require('smartcache.config')
local events = require('smartcache.events')
local sharding = require('smartcache.sharding')
local access = require('smartcache.sessions.access')
local handles = require('smartcache.sessions.handles')
local ends = require('smartcache.sessions.ends')
local F = require('smartcache.schema').F.sessions

local M = {}

local of_client = access.of_client

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
        if access.alive(t, now) then
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

-- A new session id of a client (only for a service of revision 10: see above):
-- version 4 (random), or in a sharded cluster version 8 carrying the client's
-- bucket (smartcache.sharding), so that every later call on it routes with no lookup.
local function new_id(client_id)
    local id = util.uuid()
    local count = sharding.count()
    if count ~= nil then
        return sharding.session_id(id, sharding.of(client_id, count))
    end
    return id
end
M.new_id = new_id  -- a rotation's new id too, for such a service (smartcache.sessions.rotations)

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
M.id_of_another_bucket = id_of_another_bucket

-- A stored id as the service gives it: canonical UUID text (lowercase), of its client's bucket.
function M.check_id(id, client_id, name)
    if not handles.is_uuid(id) then
        return string.format('%s must be canonical UUID text (lowercase)', name or 'session id')
    end
    return id_of_another_bucket(id, client_id)
end

-- max_lifetime_s: nil (the cluster's SC_SESSION_MAX_LIFETIME_S) or whole seconds in range; the ms.
local function lifetime_ms(max_lifetime_s)
    if max_lifetime_s == nil then
        return config.session_max_lifetime_ms, nil
    end
    if type(max_lifetime_s) ~= 'number' or max_lifetime_s ~= math.floor(max_lifetime_s)
            or max_lifetime_s < config.limits.lifetime_s.min or max_lifetime_s > config.limits.lifetime_s.max then
        return nil, string.format('max_lifetime_s must be an integer in %d..%d', config.limits.lifetime_s.min,
            config.limits.lifetime_s.max)
    end
    return max_lifetime_s * 1000, nil
end

-- id: the stored id (nil: made here, see above; returned as session_id). Generated
-- here, so a repeat under an idempotency key has the same arguments.
-- max_sessions (default SC_MAX_SESSIONS_PER_CLIENT, 0 = none): the client's
-- live sessions after this one; beyond it, limit_policy 'refuse' answers
-- LIMIT_REACHED (saying nothing of the other sessions) and 'evict_oldest' ends
-- the least recently used ones (session.evicted each). Counted and decided in
-- the transaction that inserts, so concurrent creates cannot both pass.
-- max_lifetime_s: the absolute lifetime (default SC_SESSION_MAX_LIFETIME_S): no
-- refresh moves the deadline past now + it. binding: the SHA-256 (hex) of the
-- request's binding, kept; every later request on the session must name the same
-- (smartcache.sessions.access). OK {expires_in_ms, absolute_expires_in_ms, rev,
-- handle, evicted?, session_id (only when made here)}.
function M.create(id, client_id, version, ttl_s, data, max_sessions, policy, device, max_lifetime_s, binding)
    id, binding = util.opt(id, nil), util.opt(binding, nil)
    local err = util.check(client_id, 'string', 'client_id')
        or util.check(version, 'string', 'version', true) or util.check(device, 'string', 'device', true)
        or access.check_binding(binding)
    local ttl, limit, lifetime
    if err == nil and device ~= nil and #device > M.MAX_DEVICE_BYTES then
        err = string.format('device must be a string of 0..%d bytes', M.MAX_DEVICE_BYTES)
    end
    if err == nil then
        ttl, err = ttl_ms(ttl_s)
    end
    if err == nil then
        lifetime, err = lifetime_ms(util.opt(max_lifetime_s, nil))
    end
    if err == nil then
        limit, policy, err = check_limit(util.opt(max_sessions, nil), util.opt(policy, nil))
    end
    if err == nil and id ~= nil then
        err = M.check_id(id, client_id)
    end
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    local made = id == nil
    id = id or new_id(client_id)
    return util.atomic(function()
        local t = box.space.sessions:get(id)
        if t ~= nil then
            if access.alive(t, now) then
                return util.result('ALREADY_EXISTS')
            end
            ends.drop(id)  -- expired, not swept yet: it ends here (session.expired), with its cache
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
        local absolute = now + lifetime
        local deadline = math.min(now + ttl, absolute)
        util.replace(box.space.sessions, {id, client_id, util.opt(version, ''), 1, now, ttl, deadline,
                                          util.opt(data, box.NULL), now, util.opt(device, box.NULL), box.NULL,
                                          absolute, binding or box.NULL, not made or box.NULL})
        local name = handles.name(id, not made)
        events.write('session.created', name, of_client(client_id))
        if on_deadline ~= nil then
            on_deadline(deadline)
        end
        return util.result('OK', {session_id = made and id or nil, expires_in_ms = deadline - now,
                                  absolute_expires_in_ms = lifetime, rev = 1, handle = name,
                                  evicted = evicted > 0 and evicted or nil})
    end)
end

return M
