-- Cache: arbitrary data under (session, key); session '' is the global
-- namespace. Expired entries, and entries of a session that is not live, are
-- absent.
local util = require('smartcache.util')
local config = require('smartcache.config')
local reads = require('smartcache.sessions.reads')
local memory = require('smartcache.memory')
local F = require('smartcache.schema').F.cache

local M = {}

local GLOBAL = ''

local function check_scope(session_id, key, now)
    local err = util.check(session_id, 'string', 'session id') or util.check(key, 'string', 'key')
    if err ~= nil then
        return util.bad_request(err)
    end
    if session_id ~= GLOBAL and reads.live(session_id, now) == nil then
        return util.result('NOT_FOUND', {message = 'session is not live'})
    end
    return nil
end

function M.put(session_id, key, data_type, ttl_s, data)
    local now = util.now_ms()
    local err = util.check(data_type, 'number', 'data_type', true)
        or util.check_positive(ttl_s, 'ttl_s', config.max_ttl_ms / 1000, true)
    if err ~= nil then
        return util.bad_request(err)
    end
    local ttl = util.opt(ttl_s, config.cache_ttl_ms / 1000) * 1000
    return util.atomic(function()
        local bad = check_scope(session_id, key, now)
        if bad ~= nil then
            return bad
        end
        box.space.cache:replace({session_id, key, util.opt(data_type, 0), now, ttl, now + ttl, data})
        memory.check_lossy('cache_put')  -- past the cache's share of memtx: ER_MEMORY_ISSUE, rolled back
        return util.result('OK', {expires_in_ms = ttl})
    end)
end

function M.get(session_id, key)
    local now = util.now_ms()
    local bad = check_scope(session_id, key, now)
    if bad ~= nil then
        return bad
    end
    local t = box.space.cache:get({session_id, key})
    if t == nil or t[F.expires_at] <= now then
        return util.result('NOT_FOUND')
    end
    return util.result('OK', {data = t[F.data], data_type = t[F.data_type], updated_at_ms = t[F.updated_at],
                              expires_in_ms = t[F.expires_at] - now})
end

function M.delete(session_id, key)
    local now = util.now_ms()
    local bad = check_scope(session_id, key, now)
    if bad ~= nil then
        return bad
    end
    -- Never a delete of a key that is not there: Tarantool writes such a delete to the WAL, fires no
    -- trigger (so smartcache.quorum cannot make it synchronous) and, on a leader with synchronous
    -- writes in flight, the asynchronous row behind them in the limbo is the 2.6.0 bug
    -- compat.ASYNC_BEHIND_SYNC_ROLLS_BACK (the fault suite's fuzz mix: followers stopped for good).
    local t = box.space.cache:get({session_id, key})
    if t == nil then
        return util.result('NOT_FOUND')
    end
    util.atomic(function()
        box.space.cache:delete({session_id, key})
    end)
    if t[F.expires_at] <= now then
        return util.result('NOT_FOUND')
    end
    return util.result('OK')
end

return M
