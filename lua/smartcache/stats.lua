-- Instance statistics: tuples per space, expirations, replication, schema.
local schema = require('smartcache.schema')
local expiry = require('smartcache.expiry')
local util = require('smartcache.util')

local M = {}

M.SPACES = {'sessions', 'cache', 'device', 'prewarm', 'counters', 'registers', 'sequences', 'semaphore_holders',
            'latches', 'queue_tasks'}
M.wal_errors = 0

function M.replication()
    local out = {}
    for _, r in pairs(box.info.replication) do
        if r.id ~= box.info.id then
            local up, down = r.upstream, r.downstream
            table.insert(out, {
                id = r.id, uuid = r.uuid, lsn = r.lsn,
                upstream_status = up and up.status or nil, upstream_lag_s = up and up.lag or nil,
                upstream_idle_s = up and up.idle or nil, upstream_message = up and up.message or nil,
                downstream_status = down and down.status or nil, downstream_idle_s = down and down.idle or nil,
            })
        end
    end
    return out
end

function M.stats()
    local spaces = {}
    for _, name in ipairs(M.SPACES) do
        spaces[name] = box.space[name] and box.space[name]:len() or 0
    end
    return util.result('OK', {
        spaces = spaces,
        expired = expiry.expired,
        expiry_errors = expiry.errors,
        wal_errors = M.wal_errors,
        schema_version = schema.current_version(),
        read_only = box.info.ro,
        status = box.info.status,
        instance_id = box.info.id,
        instance_uuid = box.info.uuid,
        replication = M.replication(),
        now_ms = util.now_ms(),
        coordination = require('smartcache.coordination').stats(),
        synchronous = require('smartcache.quorum').stats(),
    })
end

return M
