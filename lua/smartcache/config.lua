-- Storage-side settings: the one place that reads the environment.
--
-- Every SC_* variable is read here, once, when the module is first required
-- (init.lua requires it before box.cfg), with its default and what it means;
-- lua/README.md (Environment) has the same list for operators. Nothing else
-- in lua/ calls os.getenv or util.env_*. The modules read the values from
-- here; those tests change at run time (events.enabled, memory.lossy_share,
-- ...) are copied into the module's own field at its load.
--
-- Below the environment: the storage side of the deadline budget, constants
-- that must stay ordered against the service's (a Python test parses them:
-- keep each on its own line as `M.NAME = number`).
local fio = require('fio')
local util = require('smartcache.util')

local M = {}

-- true for 'true', '1' or 'yes'; default when unset or empty.
local function env_bool(name, default)
    local v = util.env_string(name, default and 'true' or 'false')
    return v == 'true' or v == '1' or v == 'yes'
end

-- The instance ------------------------------------------------------------------

-- SC_INSTANCE_NAME: the process title and the default data directory's name.
M.instance_name = util.env_string('SC_INSTANCE_NAME', 'smartcache')
-- SC_DATA_DIR: .snap and .xlog files (var/<name> below the directory we start in).
M.data_dir = fio.abspath(util.env_string('SC_DATA_DIR', fio.pathjoin('var', M.instance_name)))
-- SC_LISTEN: the iproto address.
M.listen = util.env_string('SC_LISTEN', '127.0.0.1:3301')
-- SC_ADVERTISE: the iproto address other instances and etcd readers use for this one.
M.advertise = util.env_string('SC_ADVERTISE', M.listen)
-- SC_INSTANCE_UUID: this instance's uuid (nil: generated; must match its data if it has any).
M.instance_uuid = util.env_string('SC_INSTANCE_UUID', nil)
-- SC_HTTP_LISTEN: the operator HTTP address; '' turns it off.
M.http_listen = util.env_string('SC_HTTP_LISTEN', '127.0.0.1:8301')
-- SC_HTTP_TOKEN (or SC_HTTP_TOKEN_FILE): bearer token of the HTTP data routes; '' none.
M.http_token = util.env_secret('SC_HTTP_TOKEN', '')

-- Users: replication (its name is fixed), the service, operators. Each password
-- from NAME or from the file NAME_FILE (Docker secrets).
M.replication_user = 'replicator'
-- SC_REPLICATION_PASSWORD (_FILE): password of user `replicator`.
M.replication_password = util.env_secret('SC_REPLICATION_PASSWORD', 'replicator')
-- SC_SERVICE_USER / SC_SERVICE_PASSWORD (_FILE): the service's user (execute on its procedures only).
M.service_user = util.env_string('SC_SERVICE_USER', 'smartcache')
M.service_password = util.env_secret('SC_SERVICE_PASSWORD', 'smartcache')
-- SC_OPERATOR_USER / SC_OPERATOR_PASSWORD (_FILE): the operators' user (smartcache-cli cluster).
M.operator_user = util.env_string('SC_OPERATOR_USER', 'operator')
M.operator_password = util.env_secret('SC_OPERATOR_PASSWORD', 'operator')

-- Standalone / legacy master and replica (SC_ETCD unset) -------------------------------

-- SC_READ_ONLY: start as a replica.
M.read_only = env_bool('SC_READ_ONLY', false)
-- SC_REPLICATION: comma-separated host:port peers to replicate from.
M.replication_peers = {}
for peer in util.env_string('SC_REPLICATION', ''):gmatch('[^,%s]+') do
    table.insert(M.replication_peers, peer)
end

-- HA (smartcache.failover) -------------------------------------------------------------

-- SC_CLUSTER_SIZE: configured members; a majority of them elects, and is the default quorum.
-- Once the cluster has a topology in etcd (smartcache.failover.topology) its members count
-- instead, and this is only how many must be live for `cluster init` to make the first one.
M.cluster_size = util.env_number('SC_CLUSTER_SIZE', 3)
-- SC_SYNC_QUORUM: the smallest synchronous quorum (the leader uses more while more
-- followers are attached). Set explicitly, it is also a floor under a topology's majority
-- (smartcache.failover.topology); by default that majority alone.
M.sync_quorum_set = util.env_number('SC_SYNC_QUORUM', nil)
M.sync_quorum = M.sync_quorum_set or math.floor(M.cluster_size / 2) + 1
-- A write refused while a synchronous rollback may be under way (WRITES_HELD) is sent again this
-- long after the oldest write in flight reaches its timeout (its rollback, or its confirmation, is
-- then written).
M.WRITES_HELD_SLACK_MS = 20
-- SC_SYNC_TIMEOUT_S: a synchronous write without its quorum this long is rolled back.
M.sync_timeout_s = util.env_number('SC_SYNC_TIMEOUT_S', 2)

-- SC_ETCD: etcd v3 endpoints, comma-separated; set: HA mode. M.ha is nil without it
-- (standalone, or the legacy master/replica pair), else the failover settings.
local function ha_settings()
    local etcd = util.env_string('SC_ETCD', '')
    if etcd == '' then
        return nil
    end
    local endpoints = {}
    for e in etcd:gmatch('[^,%s]+') do
        if not e:find('://', 1, true) then
            e = 'http://' .. e
        end
        table.insert(endpoints, e)
    end
    -- SC_LEADER_TTL_S: the lease TTL; keepalive every TTL/3.
    local ttl = util.env_number('SC_LEADER_TTL_S', 5)
    return {
        endpoints = endpoints,
        -- SC_CLUSTER: etcd keys live under /smartcache/<cluster>/.
        cluster = util.env_string('SC_CLUSTER', 'smartcache'),
        ttl = ttl,
        -- SC_LEASE_MARGIN_MS: a leader writes only until t_sent + TTL - margin (s here).
        margin = util.env_number('SC_LEASE_MARGIN_MS', math.max(500, ttl * 200)) / 1000,
        -- SC_FAILOVER_POLL_MS: how often an instance reads the leader key (s here).
        poll = util.env_number('SC_FAILOVER_POLL_MS', 200) / 1000,
        -- SC_ETCD_TIMEOUT_MS: per etcd request (s here).
        etcd_timeout = util.env_number('SC_ETCD_TIMEOUT_MS', math.min(1000, ttl * 1000 / 3)) / 1000,
        size = M.cluster_size,
        quorum = M.sync_quorum,
        quorum_min = M.sync_quorum_set,
        election_quorum = math.floor(M.cluster_size / 2) + 1,
        -- SC_CANDIDATE: false: follows, never leads.
        candidate = util.env_string('SC_CANDIDATE', 'true') ~= 'false',
        -- SC_AUTO_REJOIN: a DIVERGED instance that can prove its extra rows were never
        -- acknowledged rebuilds itself from the leader (false: only cluster rejoin does).
        auto_rejoin = env_bool('SC_AUTO_REJOIN', true),
        -- SC_SLOW_FOLLOWER_MS: a follower that has not acknowledged the leader's rows of
        -- this long ago leaves the synchronous quorum until it catches up (s here).
        slow_follower = util.env_number('SC_SLOW_FOLLOWER_MS', 500) / 1000,
    }
end
M.ha = ha_settings()

-- SC_ASIDE_KEEP: set-aside directories (aside-*) a rebuilt instance keeps in its data dir; the oldest go.
M.aside_keep = util.env_number('SC_ASIDE_KEEP', 3)
-- SC_JOIN_HOLD_MS: an instance about to join asks the leader to hold writes at most this long.
M.join_hold_ms = util.env_number('SC_JOIN_HOLD_MS', 10000)
-- SC_JOIN_HOLD_WAIT_S: how long it keeps asking a leader that is still starting for that hold.
M.join_hold_wait_s = util.env_number('SC_JOIN_HOLD_WAIT_S', 30)

-- Durability and box.cfg ---------------------------------------------------------------

-- SC_WAL_MODE: `write` survives a process crash, `fsync` a power loss too. Standalone
-- the only copy is this disk (fsync); in HA an acknowledged write is on a quorum (write).
M.wal_mode = util.env_string('SC_WAL_MODE', M.ha and 'write' or 'fsync')
-- SC_SYNC: the data spaces' writes are synchronous (through sc_quorum: smartcache.quorum).
M.sync = env_bool('SC_SYNC', M.ha ~= nil)
-- SC_MEMTX_MEMORY: bytes of memory for data (at least 256 MiB: smartcache.memory says why).
M.memtx_memory = util.env_number('SC_MEMTX_MEMORY', 256 * 1024 * 1024)
-- SC_CHECKPOINT_INTERVAL / SC_CHECKPOINT_COUNT: snapshot period (s) and how many to keep.
M.checkpoint_interval = util.env_number('SC_CHECKPOINT_INTERVAL', 3600)
M.checkpoint_count = util.env_number('SC_CHECKPOINT_COUNT', 2)
-- SC_WAL_MIN_FREE_MB: below this much free space on the WAL's filesystem the instance is
-- unhealthy and a leader steps down; nil: 64 MiB or a tenth of the filesystem (smartcache.disk).
M.wal_min_free_mb = util.env_number('SC_WAL_MIN_FREE_MB', nil)

-- Logs and the Lua heap ----------------------------------------------------------------

-- SC_LOG_FORMAT / SC_LOG_LEVEL: Tarantool's log (json for ELK) and its level.
M.log_format = util.env_string('SC_LOG_FORMAT', 'json')
M.log_level = util.env_number('SC_LOG_LEVEL', 5)
-- SC_LOG_RELOG: false keeps Tarantool's own JSON keys (no lua/relog.sed pipe).
M.log_relog = util.env_string('SC_LOG_RELOG', 'true') ~= 'false'
-- SC_LUA_GC_PAUSE (100..1000): Lua's setpause. The live heap is about 1.4 MiB (data is in
-- memtx), so 400 costs a few MiB and saves about 0.9 us of the 13 us of transaction-thread
-- CPU per request in the session bench (marking); Lua's default is 200.
M.lua_gc_pause = util.env_number('SC_LUA_GC_PAUSE', 400)
if M.lua_gc_pause < 100 or M.lua_gc_pause > 1000 then
    error(string.format('SC_LUA_GC_PAUSE must be in 100..1000, got %s', M.lua_gc_pause))
end

-- Data and procedures ------------------------------------------------------------------

-- SC_SESSION_TTL_S: session TTL when create gives none (ms here).
M.session_ttl_ms = util.env_number('SC_SESSION_TTL_S', 1800) * 1000
-- A read or touch slides a session's deadline only when its last refresh is older than
-- SC_REFRESH_FRACTION (0.1) of the session's TTL, at least SC_REFRESH_GRANULARITY_MS (1 s)
-- and at most SC_REFRESH_MAX_MS (5 min): a session read every few seconds costs a write
-- per tenth of its life, not per read, and its deadline is at most that much earlier than
-- exact sliding would make it (ASP.NET renews a sliding cookie after half its time).
M.refresh_granularity_ms = util.env_number('SC_REFRESH_GRANULARITY_MS', 1000)
M.refresh_fraction = util.env_number('SC_REFRESH_FRACTION', 0.1)
M.refresh_max_ms = util.env_number('SC_REFRESH_MAX_MS', 300000)
if M.refresh_fraction < 0 or M.refresh_fraction > 0.5 then
    error(string.format('SC_REFRESH_FRACTION must be in 0..0.5, got %s', M.refresh_fraction))
end
-- SC_MAX_SESSIONS_PER_CLIENT: the live sessions one client may hold when SESSION_CREATE names
-- no max_sessions (0: no limit); SC_SESSION_LIMIT_POLICY: refuse (LIMIT_REACHED) or
-- evict_oldest (the client's least recently used session ends).
M.max_sessions_per_client = util.env_number('SC_MAX_SESSIONS_PER_CLIENT', 0)
M.session_limit_policy = util.env_string('SC_SESSION_LIMIT_POLICY', 'refuse')
if M.session_limit_policy ~= 'refuse' and M.session_limit_policy ~= 'evict_oldest' then
    error(string.format('SC_SESSION_LIMIT_POLICY must be refuse or evict_oldest, got %s', M.session_limit_policy))
end
-- SC_SESSION_MAX_LIFETIME_S (60..31536000): a session's absolute lifetime when SESSION_CREATE names no
-- max_lifetime_s (ms here); no refresh moves its deadline past created_at + this (issue 37). The ranges
-- here are the registry's (proto/protocol.toml limits.max_lifetime_s, limits.grace_ms): a request's
-- max_lifetime_s and grace_ms are checked against them too.
M.limits = {lifetime_s = {min = 60, max = 31536000}, grace_ms = {min = 0, max = 60000}}
M.session_max_lifetime_ms = util.env_number('SC_SESSION_MAX_LIFETIME_S', 43200) * 1000
local lifetime_s = M.session_max_lifetime_ms / 1000
if lifetime_s < M.limits.lifetime_s.min or lifetime_s > M.limits.lifetime_s.max then
    error(string.format('SC_SESSION_MAX_LIFETIME_S must be in %d..%d, got %s', M.limits.lifetime_s.min,
        M.limits.lifetime_s.max, lifetime_s))
end
-- SC_ROTATE_GRACE_MS (0..60000): how long the old id of a rotated session keeps answering reads when
-- SESSION_ROTATE names no grace_ms (0: gone at the rotation's commit, as before revision 11).
M.rotate_grace_ms = util.env_number('SC_ROTATE_GRACE_MS', 5000)
if M.rotate_grace_ms < M.limits.grace_ms.min or M.rotate_grace_ms > M.limits.grace_ms.max
        or M.rotate_grace_ms ~= math.floor(M.rotate_grace_ms) then
    error(string.format('SC_ROTATE_GRACE_MS must be an integer in 0..%d, got %s', M.limits.grace_ms.max,
        M.rotate_grace_ms))
end
-- SC_AUDIT_RETENTION_DAYS: the operators' audit entries go once this many days old (never the newest).
M.audit_retention_days = util.env_number('SC_AUDIT_RETENTION_DAYS', 400)
if M.audit_retention_days < 1 then
    error(string.format('SC_AUDIT_RETENTION_DAYS must be at least 1, got %s', M.audit_retention_days))
end
-- SC_DELETE_BATCH: sessions ended per transaction by SESSION_DELETE_CLIENT (log out everywhere).
M.delete_batch = util.env_number('SC_DELETE_BATCH', 100)
-- SC_MAX_TTL_S: the largest TTL accepted (ms here).
M.max_ttl_ms = util.env_number('SC_MAX_TTL_S', 30 * 86400) * 1000
-- SC_CACHE_TTL_S: cache entry TTL when put gives none (ms here).
M.cache_ttl_ms = util.env_number('SC_CACHE_TTL_S', 1800) * 1000
-- SC_CACHE_MEMORY_SHARE, (0, 0.9]: the cache and prewarm spaces together may hold at most
-- this share of memtx_memory (smartcache.memory).
M.cache_memory_share = util.env_number('SC_CACHE_MEMORY_SHARE', 0.4)
if M.cache_memory_share <= 0 or M.cache_memory_share > 0.9 then
    error('SC_CACHE_MEMORY_SHARE must be in (0, 0.9]')
end
-- SC_PREWARM_RETENTION_S: prewarm records go this long after their last change (ms here).
M.prewarm_retention_ms = util.env_number('SC_PREWARM_RETENTION_S', 86400) * 1000
-- SC_MAX_WAIT_S: the largest prewarm_wait timeout and lease, and coordination wait_ms (ms here).
M.max_wait_ms = util.env_number('SC_MAX_WAIT_S', 60) * 1000
-- SC_IDEMPOTENCY_TTL_S: how long an idempotency key and its answer are kept (ms here).
M.idempotency_ttl_ms = util.env_number('SC_IDEMPOTENCY_TTL_S', 600) * 1000
-- SC_SWEEP_BATCH / SC_SWEEP_MAX_SLEEP_S: expiry batch size, longest sleep between sweeps.
M.sweep_batch = util.env_number('SC_SWEEP_BATCH', 500)
M.sweep_max_sleep_s = util.env_number('SC_SWEEP_MAX_SLEEP_S', 1)
-- SC_EVENTS: false: changes of state write no events (application events still do).
M.events_enabled = util.env_string('SC_EVENTS', 'true') ~= 'false'
-- SC_EVENTS_RETENTION_DAYS: a day's partition goes once it is this many full days old.
M.events_retention_days = util.env_number('SC_EVENTS_RETENTION_DAYS', 2)
-- SC_EVENTS_MAINTENANCE_S: the longest sleep of the partition fiber between rounds.
M.events_maintenance_s = util.env_number('SC_EVENTS_MAINTENANCE_S', 60)
-- SC_DEBUG_PROCEDURES=1 adds sc.debug_sleep(ms) (tests only).
M.debug_procedures = util.env_string('SC_DEBUG_PROCEDURES', '') == '1'

-- luacheck: push max comment line length 160
-- The deadline budget, storage side (service/smartcache/server/deadlines.py holds the service side; tests/unit/test_deadlines.py checks the order)
-- luacheck: pop
-- A single-key read waiting for a pending write of its key (smartcache.api) stops this long
-- before the call's deadline, so its answer (WRITE_PENDING) reaches the service in time.
M.ANSWER_MARGIN_S = 0.05
-- A waiting procedure (semaphore_acquire, latch_await, queue_take, events_read) stops
-- waiting this long before the call's deadline: nothing is granted to a caller that gave up.
M.WAIT_MARGIN_MS = 5
-- A waiter looks at util.writable() at least this often, and answers NOT_LEADER once this
-- instance stopped leading (the service sends the call again to the new leader).
M.WRITABLE_CHECK_S = 1
-- A sweeping fiber (expiry, queue timeouts, event partitions) whose round failed tries
-- again after this long; a follower's partition fiber looks this often for a promotion.
M.ERROR_PAUSE_S = 1
-- The memtx reclaim fiber (smartcache.memory) looks at memtx this often.
M.RECLAIM_INTERVAL_S = 0.5
-- The WAL-error watch (smartcache.runtime) samples the procedures' WAL error count this often.
M.WAL_WATCH_INTERVAL_S = 0.5

return M
