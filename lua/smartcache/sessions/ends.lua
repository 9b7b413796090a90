-- How sessions end: delete (one session, cascading to its cache), delete_client
-- (log out everywhere, in batches), and drop, the one deletion the others, an
-- eviction and expiry use, with the session's last event.
local util = require('smartcache.util')
local config = require('smartcache.config')
local events = require('smartcache.events')
local idempotency = require('smartcache.idempotency')
local sharding = require('smartcache.sharding')
local reads = require('smartcache.sessions.reads')
local F = require('smartcache.schema').F.sessions

local M = {}

local live = reads.live

-- The payload of an event about a session: {client_id}, filled anew for each
-- event (the event's insert encodes it at once), so a write allocates none.
local about = {client_id = ''}
local function of_client(client_id)
    about.client_id = client_id
    return about
end
M.of_client = of_client

-- Delete a session tuple and its cache entries, with its event (session.expired
-- past its deadline, else `topic`, session.deleted by default); call inside a
-- transaction.
local function drop(id, topic)
    local entries = box.space.cache.index.primary:select({id}, {iterator = 'EQ'})
    for _, c in ipairs(entries) do
        box.space.cache:delete({c[1], c[2]})
    end
    local t = box.space.sessions:delete(id)
    if t ~= nil then
        local ended = t[F.expires_at] <= util.now_ms() and 'session.expired' or topic or 'session.deleted'
        events.write(ended, id, of_client(t[F.client_id]))
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
            if t[F.id] ~= except and t[F.expires_at] > now then
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
