-- Instance statistics: tuples per space, expirations, replication, schema.
local schema = require('smartcache.schema')
local expiry = require('smartcache.expiry')
local util = require('smartcache.util')
local quorum = require('smartcache.quorum')
local compat = require('smartcache.compat')
local disk = require('smartcache.disk')
local failover = require('smartcache.failover')
local coordination = require('smartcache.coordination')
local sessions = require('smartcache.sessions')
local audit = require('smartcache.audit')

local M = {}

M.SPACES = {'sessions', 'cache', 'device', 'prewarm', 'counters', 'registers', 'sequences', 'semaphore_holders',
            'latches', 'queue_tasks', 'rotations', 'audit'}

function M.stats()
    local spaces = {}
    for _, name in ipairs(M.SPACES) do
        spaces[name] = box.space[name] and box.space[name]:len() or 0
    end
    return util.result('OK', {
        spaces = spaces,
        expired = expiry.expired,
        expiry_errors = expiry.errors,
        wal_errors = disk.wal_errors,
        schema_version = schema.current_version(),
        read_only = box.info.ro,
        status = box.info.status,
        instance_id = box.info.id,
        instance_uuid = box.info.uuid,
        replication = failover.replication(),
        now_ms = util.now_ms(),
        coordination = coordination.stats(),  -- waiters now, what ran out
        -- deadlines moved by reads and touches (a write each; smartcache.sessions refresh_after_ms)
        session_refreshes = sessions.refreshes(),
        synchronous = quorum.stats(),
        workarounds = compat.active(),  -- the Tarantool version workarounds on (smartcache.compat)
        audit = audit.stats(),  -- the operators' audit log: its head, the retention's deletions and errors
    })
end

return M
