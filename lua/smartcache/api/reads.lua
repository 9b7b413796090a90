-- The reads the service calls (registered by smartcache.api): they change no data,
-- but for reads that write only opportunistically (session_get slides the
-- deadline when it can, and answers the data when it cannot). Each is wrapped as a
-- read: past its deadline it does nothing, a call of a bucket not served here is
-- refused (WRONG_BUCKET, BUCKET_MOVING), and a read of one key of a KEYED space
-- waits for a pending write of that key.
local fiber = require('fiber')
local util = require('smartcache.util')
local config = require('smartcache.config')
local sessions = require('smartcache.sessions')
local coordination = require('smartcache.coordination')
local events = require('smartcache.events')
local failover = require('smartcache.failover')
local stats = require('smartcache.stats')

local M = {}

local function ping()
    return util.result('OK', {time_ms = util.now_ms(), read_only = box.info.ro})
end

M.procedures = {
    ping = ping,
    session_get = sessions.get,
    session_locate = sessions.locate,  -- where a version 4 id lives (sharding); unrouted: asked of every shard
    session_list = sessions.list,
    cache_get = sessions.cache_get,
    device_lookup = sessions.device_lookup,
    prewarm_wait = sessions.prewarm_wait,
    stats = stats.stats,
    counter_get = coordination.counter_get,
    register_get = coordination.register_get,
    sequence_get = coordination.sequence_get,
    semaphore_get = coordination.semaphore_get,
    latch_get = coordination.latch_get,
    queue_stats = coordination.queue_stats,
    events_stats = events.stats,
    -- Failover (smartcache.failover): what the service polls every <= 500 ms.
    role = failover.role,
}

-- Only with SC_DEBUG_PROCEDURES=1 (tests): a deliberately slow procedure.
if config.debug_procedures then
    M.procedures.debug_sleep = function(ms)
        fiber.sleep((tonumber(ms) or 0) / 1000)
        return util.result('OK', {slept_ms = ms})
    end
end

-- Single-key reads of guarded spaces: the space whose key is the first argument.
-- They wait for a pending write of that key (smartcache.quorum: no dirty reads,
-- compat.NO_MVCC_DIRTY_READS).
M.KEYED = {session_get = 'sessions', device_lookup = 'device', counter_get = 'counters',
           register_get = 'registers', sequence_get = 'sequences', semaphore_get = 'semaphore_holders',
           latch_get = 'latches'}

return M
