-- Run-time pieces every instance needs once the schema exists: triggers and
-- fibers; and the instance's health, as /health and /metrics report it.
local fiber = require('fiber')
local log = require('log')
local config = require('smartcache.config')
local sessions = require('smartcache.sessions')
local expiry = require('smartcache.expiry')
local schema = require('smartcache.schema')
local sharding = require('smartcache.sharding')
local coordination = require('smartcache.coordination')
local events = require('smartcache.events')
local memory = require('smartcache.memory')
local disk = require('smartcache.disk')
local audit = require('smartcache.audit')
local failover = require('smartcache.failover')

local M = {}

-- Unhealthy while a WAL write failed this recently (disk full, read-only, I/O errors).
M.WAL_ERROR_WINDOW_S = 30
-- Unhealthy above this share of memtx_memory in use.
M.MEMTX_LIMIT_RATIO = 0.9
-- How often a replica that has not received the schema yet looks for it.
local SCHEMA_WAIT_S = 0.1

-- WAL failures seen by procedures (disk.wal_errors), with the time of the last one.
M.wal = {errors = 0, last_error_at = nil}

local function watch_wal()
    fiber.name('wal_watch')
    while true do
        if disk.wal_errors > M.wal.errors then
            M.wal.errors = disk.wal_errors
            M.wal.last_error_at = fiber.time()
        end
        fiber.sleep(config.WAL_WATCH_INTERVAL_S)
    end
end

-- install() now if the space exists, else once replication brings it (a replica
-- that started before the schema reached it).
local function when_space(space_name, what, install)
    if box.space[space_name] ~= nil then
        install()
        return
    end
    fiber.create(function()
        fiber.name('wait_schema_' .. space_name)
        while box.space[space_name] == nil do
            fiber.sleep(SCHEMA_WAIT_S)
        end
        install()
        log.info('%s installed after the schema arrived', what)
    end)
end

-- The triggers of the prewarm and coordination spaces, and every run-time fiber.
function M.start()
    when_space('prewarm', 'prewarm trigger', sessions.install_prewarm_trigger)
    expiry.start()
    when_space('queue_tasks', 'coordination triggers', coordination.install)
    if not sharding.install() then  -- a replica whose schema is older: once version 7 reaches it
        fiber.create(function()
            fiber.name('wait_schema_buckets')
            while not sharding.install() do
                fiber.sleep(SCHEMA_WAIT_S)
            end
            log.info('bucket triggers installed after the schema arrived')
        end)
    end
    coordination.start()  -- the queue timeout fiber
    audit.start()  -- the audit log's retention (SC_AUDIT_RETENTION_DAYS)
    events.start()  -- event partitions (today's at once when writable), their fiber
    if M.wal_fiber == nil then
        M.wal_fiber = fiber.create(watch_wal)
    end
    memory.start()  -- frees tuples only Lua still holds (deleted, replaced)
end

-- memtx use (smartcache.memory says which of these numbers predicts what).
function M.memtx()
    return memory.info()
end

-- The /health document: healthy unless something below says why not.
-- A follower that has not replicated from the leader this long is unhealthy.
M.UPSTREAM_GRACE_S = 5

function M.health()
    local instance = failover.instance
    local problems = {}
    if box.info.status ~= 'running' then
        table.insert(problems, 'status ' .. box.info.status)
    end
    -- The watcher samples every 0.5 s; look at the counter too, so a fresh error counts at once.
    if disk.wal_errors > M.wal.errors then
        M.wal.errors, M.wal.last_error_at = disk.wal_errors, fiber.time()
    end
    local wal_age = M.wal.last_error_at and fiber.time() - M.wal.last_error_at or nil
    if wal_age ~= nil and wal_age < M.WAL_ERROR_WINDOW_S then
        table.insert(problems, string.format('WAL write failed %.0f s ago', wal_age))
    end
    local memtx = M.memtx()
    if memtx.used_ratio > M.MEMTX_LIMIT_RATIO then
        table.insert(problems, string.format('memtx %.0f%% used', memtx.used_ratio * 100))
    end
    -- memtx full, as writers meet it: a write refused by the lossy spaces' budget or failed by the
    -- allocator lately (smartcache.memory). Clears itself once writes fit again (entries expire).
    if memtx.last_error_age_s ~= nil and memtx.last_error_age_s < memory.ERROR_WINDOW_S then
        table.insert(problems, string.format('memtx full: a write was refused for memory %.0f s ago (cache and '
            .. 'prewarm hold %.0f%% of their SC_CACHE_MEMORY_SHARE; %d refused, %d allocation failures)',
            memtx.last_error_age_s, memtx.lossy_used_ratio * 100, memtx.refused, memtx.errors))
    end
    -- A replica whose applier stopped (an error 2.6.0 does not retry: a row it cannot apply, such as
    -- a duplicate key), or cannot allocate a row (retried every second, it never gets past that row to
    -- the deletes that would free memory), never catches up by itself. (In HA the failover module
    -- watches its one upstream, reconnects it and reports it: upstream_problem below.)
    if instance == nil then
        for _, r in ipairs(failover.replication()) do
            local message = r.upstream_message ~= nil and tostring(r.upstream_message) or ''
            if r.upstream_status == 'stopped' or message:find('Failed to allocate', 1, true) then
                table.insert(problems, string.format('replication from instance %d %s: %s', r.id,
                    tostring(r.upstream_status), message))
            end
        end
    end
    local free, min_free
    if type(box.cfg) == 'table' then
        free, min_free = disk.free(box.cfg.wal_dir)
    end
    if free ~= nil and free < min_free then
        table.insert(problems, string.format('WAL disk almost full: %d MiB free', math.floor(free / 1048576)))
    end
    local doc = {status = box.info.status, read_only = box.info.ro, instance_id = box.info.id,
                 instance_uuid = box.info.uuid, schema_version = schema.current_version(),
                 replication = failover.replication(), memtx = memtx,
                 wal = {errors = M.wal.errors, last_error_age_s = wal_age, disk_free_bytes = free}}
    if instance == nil then
        doc.role = box.info.ro and 'replica' or 'master'
    else
        local st = instance:status()
        st.counters = nil
        doc.role = st.role
        doc.failover = st
        if st.diverged ~= nil then
            table.insert(problems, 'DIVERGED: ' .. st.diverged)
        end
        if st.wal_broken ~= nil then
            table.insert(problems, st.wal_broken)
        end
        if st.upstream_problem ~= nil and (st.upstream_broken_s or 0) >= M.UPSTREAM_GRACE_S then
            table.insert(problems, st.upstream_problem)
        end
    end
    doc.healthy = #problems == 0
    doc.problems = problems
    return doc
end

return M
