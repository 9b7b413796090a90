-- Cache: arbitrary data under (session, key); session '' is the global
-- namespace. Expired entries, and entries of a session that is not live, are
-- absent. A session-scoped call names the request's binding (a bound session
-- refuses any other: BINDING_MISMATCH, nothing done); a read by the old id of a
-- rotated session, within its grace window, reads the rotated session's cache
-- (writes with it are NOT_FOUND).
local util = require('smartcache.util')
local config = require('smartcache.config')
local access = require('smartcache.sessions.access')
local memory = require('smartcache.memory')
local F = require('smartcache.schema').F.cache

local M = {}

local GLOBAL = ''

local function check_args(session_id, key, binding)
    local err = util.check(session_id, 'string', 'session id') or util.check(key, 'string', 'key')
        or access.check_binding(binding)
    if err ~= nil then
        return util.bad_request(err)
    end
    return nil
end

-- For a write, inside its transaction: nil when the session may be written (or the global namespace),
-- else the answer (NOT_FOUND: not live; BINDING_MISMATCH, with its event).
local function refused(session_id, binding, now)
    if session_id == GLOBAL then
        return nil
    end
    local t = access.live(session_id, now)
    if t == nil then
        return util.result('NOT_FOUND', {message = 'session is not live'})
    end
    if not access.bound(t, binding) then
        return access.mismatch(t)
    end
    return nil
end

function M.put(session_id, key, data_type, ttl_s, data, binding)
    binding = util.opt(binding, nil)
    local now = util.now_ms()
    local bad = check_args(session_id, key, binding)
    if bad ~= nil then
        return bad
    end
    local err = util.check(data_type, 'number', 'data_type', true)
        or util.check_positive(ttl_s, 'ttl_s', config.max_ttl_ms / 1000, true)
    if err ~= nil then
        return util.bad_request(err)
    end
    local ttl = util.opt(ttl_s, config.cache_ttl_ms / 1000) * 1000
    return util.atomic(function()
        local no = refused(session_id, binding, now)
        if no ~= nil then
            return no
        end
        box.space.cache:replace({session_id, key, util.opt(data_type, 0), now, ttl, now + ttl, data})
        memory.check_lossy('cache_put')  -- past the cache's share of memtx: ER_MEMORY_ISSUE, rolled back
        return util.result('OK', {expires_in_ms = ttl})
    end)
end

function M.get(session_id, key, binding)
    binding = util.opt(binding, nil)
    local bad = check_args(session_id, key, binding)
    if bad ~= nil then
        return bad
    end
    local now = util.now_ms()
    local owner = session_id
    if session_id ~= GLOBAL then
        local t = access.resolve(session_id, now)
        if t == nil then
            return util.result('NOT_FOUND', {message = 'session is not live'})
        end
        if not access.bound(t, binding) then
            return access.mismatch_read(t)
        end
        owner = t[1]  -- the rotated session's id, for an old id within its grace window
    end
    local t = box.space.cache:get({owner, key})
    if t == nil or t[F.expires_at] <= now then
        return util.result('NOT_FOUND')
    end
    return util.result('OK', {data = t[F.data], data_type = t[F.data_type], updated_at_ms = t[F.updated_at],
                              expires_in_ms = t[F.expires_at] - now})
end

function M.delete(session_id, key, binding)
    binding = util.opt(binding, nil)
    local bad = check_args(session_id, key, binding)
    if bad ~= nil then
        return bad
    end
    local now = util.now_ms()
    -- Never a delete of a key that is not there: Tarantool writes such a delete to the WAL, fires no
    -- trigger (so smartcache.quorum cannot make it synchronous) and, on a leader with synchronous
    -- writes in flight, the asynchronous row behind them in the limbo is the 2.6.0 bug
    -- compat.ASYNC_BEHIND_SYNC_ROLLS_BACK (the fault suite's fuzz mix: followers stopped for good).
    return util.atomic(function()
        local no = refused(session_id, binding, now)
        if no ~= nil then
            return no
        end
        local t = box.space.cache:get({session_id, key})
        if t == nil then
            return util.result('NOT_FOUND')
        end
        box.space.cache:delete({session_id, key})
        if t[F.expires_at] <= now then
            return util.result('NOT_FOUND')
        end
        return util.result('OK')
    end)
end

return M
