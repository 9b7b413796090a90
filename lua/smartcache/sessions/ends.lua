-- How sessions end: delete (one session, cascading to its cache; by its id, or by
-- handle with its client's id: "sign out that device"), delete_client (log out
-- everywhere, in batches), and drop, the one deletion the others, an eviction and
-- expiry use, with the session's last event (keyed by its handle).
local util = require('smartcache.util')
local config = require('smartcache.config')
local events = require('smartcache.events')
local idempotency = require('smartcache.idempotency')
local sharding = require('smartcache.sharding')
local access = require('smartcache.sessions.access')
local handles = require('smartcache.sessions.handles')
local schema = require('smartcache.schema')
local F = schema.F.sessions
local FR = schema.F.rotations

local M = {}

local live = access.live

-- Delete a session tuple, its cache entries and the old ids of its rotations (their grace ends
-- with it), with its event (session.expired past its deadline, with its reason, else `topic`,
-- session.deleted by default); call inside a transaction, for a row that is there.
local function drop(id, topic)
    local entries = box.space.cache.index.primary:select({id}, {iterator = 'EQ'})
    for _, c in ipairs(entries) do
        box.space.cache:delete({c[1], c[2]})
    end
    local rotations = box.space.rotations
    if rotations ~= nil then
        for _, r in ipairs(rotations.index.by_new:select({id}, {iterator = 'EQ'})) do
            rotations:delete(r[FR.old_id])
        end
    end
    local t = box.space.sessions:delete(id)
    if t ~= nil then
        local now = util.now_ms()
        if not access.alive(t, now) then
            events.write('session.expired', access.name(t), access.expired(t, now))
        else
            events.write(topic or 'session.deleted', access.name(t), access.of_client(t[F.client_id]))
        end
    end
    return #entries
end
M.drop = drop

-- What SESSION_DELETE names: the request's session id (checked against its binding), or a handle
-- with the client it must belong to (a front server or the console ending another device's
-- session: no binding asked). The stored id, or nil and why.
local function target(id, binding, handle, client_id)
    if id ~= nil then
        if handle ~= nil then
            return nil, 'a session id or a handle (with client_id), not both'
        end
        return id, util.check(id, 'string', 'session id') or access.check_binding(binding)
    end
    if handle == nil or client_id == nil then
        return nil, 'a session id, or a handle with its client_id'
    end
    local err = util.check(client_id, 'string', 'client_id')
    if err ~= nil then
        return nil, err
    end
    return handles.parse(handle)
end

-- sc.session_delete(id, binding?, handle?, client_id?): OK {cache_deleted} · NOT_FOUND ·
-- BINDING_MISMATCH. By handle, a session of another client, or a raw-keyed row (it has no
-- handle), is NOT_FOUND.
function M.delete(id, binding, handle, client_id)
    id, binding, handle, client_id = util.opt(id, nil), util.opt(binding, nil), util.opt(handle, nil),
        util.opt(client_id, nil)
    local stored, err = target(id, binding, handle, client_id)
    if stored == nil or err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    return util.atomic(function()
        local t = live(stored, now)
        if id == nil then
            if t == nil or not access.is_stored(t) or t[F.client_id] ~= client_id then
                return util.result('NOT_FOUND')
            end
            return util.result('OK', {cache_deleted = drop(stored)})
        end
        if t == nil then
            -- An expired leftover still goes, with its cache, but the answer is NOT_FOUND.
            if box.space.sessions:get(id) ~= nil then
                drop(id)
            end
            return util.result('NOT_FOUND')
        end
        if not access.bound(t, binding) then
            return access.mismatch(t)
        end
        return util.result('OK', {cache_deleted = drop(id)})
    end)
end

-- Log out everywhere: every live session of a client (but `except`, the
-- caller's own, when given) ends with its cache entries, session.deleted each,
-- in transactions of SC_DELETE_BATCH sessions, so a client with 10,000 sessions
-- never holds the transaction thread for long. A session created meanwhile may
-- survive. Stops at the call's deadline with more = true (call again); under an
-- idempotency key a repeat answers the first call's count once it completed.
function M.delete_client(deadline_ms, key, client_id, except)
    local err = util.check(client_id, 'string', 'client_id') or util.check(except, 'string', 'except', true)
    if err == nil and key ~= nil then
        err = idempotency.check_key(key)
    end
    if err ~= nil then
        return util.bad_request(err)
    end
    if not util.writable() then
        return {status = 'NOT_LEADER'}
    end
    if key ~= nil then
        local stored = idempotency.stored(key, 'session_delete_client', client_id, except)
        if stored ~= nil then
            return stored
        end
    end
    local deleted, cache_deleted = 0, 0
    while true do
        if deadline_ms ~= nil and util.now_ms() >= deadline_ms then
            return util.result('OK', {deleted = deleted, cache_deleted = cache_deleted, more = true})
        end
        -- Each batch is its own transaction and the batches yield between them: a move of the client's
        -- bucket may begin meanwhile. Then the rest is the new shard's to delete (asked again there).
        if deleted > 0 and sharding.refusal('key', client_id) ~= nil then
            return util.result('OK', {deleted = deleted, cache_deleted = cache_deleted, more = true})
        end
        local now = util.now_ms()
        local batch = {}
        for _, t in box.space.sessions.index.by_client:pairs({client_id}, {iterator = 'EQ'}) do
            if t[F.id] ~= except and access.alive(t, now) then
                table.insert(batch, t[F.id])
                if #batch >= config.delete_batch then
                    break
                end
            end
        end
        local last = #batch < config.delete_batch
        local result = util.atomic(function()
            for _, sid in ipairs(batch) do
                cache_deleted = cache_deleted + drop(sid)
            end
            deleted = deleted + #batch
            local r = util.result('OK', {deleted = deleted, cache_deleted = cache_deleted})
            if last and key ~= nil then
                idempotency.store(key, 'session_delete_client', r, client_id, except)
            end
            return r
        end)
        if last then
            return result
        end
    end
end

return M
