#!/usr/bin/env tarantool
-- smartcache storage instance: `tarantool lua/init.lua`, configured only by
-- environment variables (see lua/README.md for the full list).
--
-- Two ways to run:
--   * standalone / legacy master+replica (SC_ETCD unset): SC_READ_ONLY and
--     SC_REPLICATION say who writes, as before;
--   * HA (SC_ETCD set): nobody is master by configuration. The instance starts
--     read-only and etcd decides (smartcache.failover): an empty instance
--     either bootstraps the replica set (the first one to take the leader key
--     while etcd has no replica set recorded) or joins the current leader; an
--     instance with data recovers read-only, then follows the leader or takes
--     part in an election.
-- Start-up writes only what changed (users, passwords, functions, schema, sync
-- flags), so an instance on a full disk can still start read-only.
local fio = require('fio')
local log = require('log')
local fiber = require('fiber')
local json = require('json')

-- Find our modules next to this file, wherever we are started from.
local here = fio.dirname(fio.abspath(debug.getinfo(1, 'S').source:sub(2)))
package.path = here .. '/?.lua;' .. here .. '/?/init.lua;' .. package.path

local util = require('smartcache.util')
local failover = require('smartcache.failover')

local function env_bool(name, default)
    local v = util.env_string(name, default and 'true' or 'false')
    return v == 'true' or v == '1' or v == 'yes'
end

local name = util.env_string('SC_INSTANCE_NAME', 'smartcache')
local data_dir = fio.abspath(util.env_string('SC_DATA_DIR', fio.pathjoin('var', name)))
local listen = util.env_string('SC_LISTEN', '127.0.0.1:3301')
local replication_user = 'replicator'
local replication_password = util.env_secret('SC_REPLICATION_PASSWORD', 'replicator')
local service_user = util.env_string('SC_SERVICE_USER', 'smartcache')
local service_password = util.env_secret('SC_SERVICE_PASSWORD', 'smartcache')
local operator_user = util.env_string('SC_OPERATOR_USER', 'operator')
local operator_password = util.env_secret('SC_OPERATOR_PASSWORD', 'operator')
local http_token = util.env_secret('SC_HTTP_TOKEN', '')
local http_listen = util.env_string('SC_HTTP_LISTEN', '127.0.0.1:8301')
local ha = failover.settings_from_env(util)

-- Durability profile. HA: an acknowledged write of a synchronous space
-- (sessions, device, idempotency) is on a quorum of instances, so the WAL need
-- not be fsynced. Standalone: the only copy is this disk, so fsync by default.
local wal_mode = util.env_string('SC_WAL_MODE', ha and 'write' or 'fsync')
local sync = env_bool('SC_SYNC', ha ~= nil)
-- Writes of the data spaces (quorum.GUARDED, events partitions) are
-- synchronous through sc_quorum, not through is_sync on the spaces themselves
-- (smartcache.quorum says why).
local quorum = require('smartcache.quorum')
quorum.enable(sync)
local function guarded_name(space_name)
    for _, n in ipairs(quorum.GUARDED) do
        if n == space_name then
            return true
        end
    end
    return space_name:match('^events_%d%d%d%d%d%d%d%d$') ~= nil
end
local function guard_all()
    return quorum.guard_all(require('smartcache.event_partitions').list())
end

local function creds(uri)
    return string.format('%s:%s@%s', replication_user, replication_password, uri)
end

if not fio.path.exists(data_dir) then
    assert(fio.mktree(data_dir), 'cannot create ' .. data_dir)
end

-- The Lua heap lives small (about 1.4 MiB after start: data is in memtx) while every request
-- makes garbage: a collection cycle starts when the heap reaches this percentage of what
-- the last one left (Lua's default 200). 400 costs a few MiB and saves about 0.9 of the
-- 13 us of CPU the transaction thread spends per request in the session bench (marking).
local gc_pause = util.env_number('SC_LUA_GC_PAUSE', 400)
if gc_pause < 100 or gc_pause > 1000 then
    error(string.format('SC_LUA_GC_PAUSE must be in 100..1000, got %s', gc_pause))
end
collectgarbage('setpause', gc_pause)

-- JSON logs with the service's keys (lua/relog.sed): one log stack, one schema.
local log_format = util.env_string('SC_LOG_FORMAT', 'json')
local log_target = nil
if log_format == 'json' and util.env_string('SC_LOG_RELOG', 'true') ~= 'false' then
    log_target = string.format('pipe: sed -u -E -f %s', fio.pathjoin(here, 'relog.sed'))
end

local cfg = {
    listen = listen,
    log = log_target,
    memtx_memory = util.env_number('SC_MEMTX_MEMORY', 256 * 1024 * 1024),
    memtx_dir = data_dir,
    wal_dir = data_dir,
    work_dir = data_dir,
    wal_mode = wal_mode,
    checkpoint_interval = util.env_number('SC_CHECKPOINT_INTERVAL', 3600),
    checkpoint_count = util.env_number('SC_CHECKPOINT_COUNT', 2),
    log_format = log_format,
    log_level = util.env_number('SC_LOG_LEVEL', 5),
    custom_proc_title = name,
    replication_synchro_quorum = ha and ha.quorum
        or util.env_number('SC_SYNC_QUORUM', math.floor(util.env_number('SC_CLUSTER_SIZE', 3) / 2) + 1),
    replication_synchro_timeout = util.env_number('SC_SYNC_TIMEOUT_S', 2),
}

local function with(extra)
    local c = {}
    for k, v in pairs(cfg) do
        c[k] = v
    end
    for k, v in pairs(extra) do
        c[k] = v
    end
    return c
end

-- Admin writes (on the writable instance only), each only when it changes something.

local function ensure_user(user, password)
    local t = box.space._user.index.name:get(user)
    if t == nil then
        box.schema.user.create(user, {password = password})
        return
    end
    local auth = t[5]
    if type(auth) ~= 'table' or auth['chap-sha1'] ~= box.schema.user.password(password) then
        box.schema.user.passwd(user, password)
    end
end

local function admin_setup()
    local schema = require('smartcache.schema')
    local api = require('smartcache.api')
    ensure_user(replication_user, replication_password)
    box.schema.user.grant(replication_user, 'replication', nil, nil, {if_not_exists = true})
    schema.upgrade()
    api.register(nil)  -- functions and the role; the service user below, without rewriting its password
    ensure_user(service_user, service_password)
    box.schema.user.grant(service_user, api.ROLE, nil, nil, {if_not_exists = true})
    ensure_user(operator_user, operator_password)
    box.schema.user.grant(operator_user, api.OPERATOR_ROLE, nil, nil, {if_not_exists = true})
    -- An instance about to join asks the leader to hold writes (smartcache.failover: join_hold).
    box.schema.user.grant(replication_user, 'execute', 'function', 'sc.join_hold', {if_not_exists = true})
    quorum.clear_sync_flags()
    guard_all()
end

local function has_data()
    return #(fio.glob(fio.pathjoin(data_dir, '*.snap')) or {}) > 0
end

-- HA: `smartcache-cli cluster rejoin` (sc.rejoin) or an operator leaves a marker
-- file; the files go aside (kept, never deleted) and the instance joins the
-- leader empty. Never force_recovery.
local function move_aside_if_asked()
    local marker = fio.pathjoin(data_dir, failover.REJOIN_MARKER)
    if not fio.path.exists(marker) then
        return
    end
    local aside = fio.pathjoin(data_dir, 'aside-' .. os.date('!%Y%m%dT%H%M%S') .. '-' .. tostring(os.time() % 1000))
    assert(fio.mktree(aside), 'cannot create ' .. aside)
    local moved = 0
    for _, pattern in ipairs({'*.snap', '*.xlog', '*.vylog', '*.inprogress'}) do
        for _, f in ipairs(fio.glob(fio.pathjoin(data_dir, pattern)) or {}) do
            assert(fio.rename(f, fio.pathjoin(aside, fio.basename(f))), 'cannot move ' .. f)
            moved = moved + 1
        end
    end
    fio.rename(marker, fio.pathjoin(aside, failover.REJOIN_MARKER))
    log.warn('rejoin: %d files moved to %s; joining the leader empty', moved, aside)
end

-- HA, empty instance: bootstrap the replica set if nobody has (atomically with
-- taking the leader key), or join the leader. Waits while there is a replica
-- set but no leader: an empty instance never becomes an empty master of it.
local function plan_empty_start(client, keys)
    local uuid = os.getenv('SC_INSTANCE_UUID') or require('uuid').str()
    local said = 0
    while true do
        local leader, err = client:get(keys.leader)
        if leader then
            local v = json.decode(leader.value)
            return {join = v.uri, uuid = uuid}
        elseif leader == false then
            local rs = client:get(keys.replicaset)
            if rs == false then
                local t_sent = require('clock').monotonic()
                local lease = client:grant(ha.ttl)
                if lease ~= nil then
                    local rs_uuid = require('uuid').str()
                    local value = json.encode({uuid = uuid, id = 1, uri = util.env_string('SC_ADVERTISE', listen),
                                               vclock = setmetatable({}, {__serialize = 'map'}),
                                               replicaset = rs_uuid})
                    local etcd = require('smartcache.etcd')
                    local ok, rev = client:txn(
                        {{key = keys.leader, target = 'CREATE', value = 0},
                         {key = keys.replicaset, target = 'CREATE', value = 0}},
                        {etcd.op_put(keys.leader, value, lease.id), etcd.op_put(keys.replicaset, rs_uuid)}, {})
                    if ok then
                        log.info('bootstrapping replica set %s (term %d)', rs_uuid, rev)
                        return {bootstrap = true, uuid = uuid, replicaset = rs_uuid,
                                lease = {id = lease.id, ttl = lease.ttl, sent = t_sent}}
                    end
                    client:revoke(lease.id)
                end
            elseif rs ~= nil and fiber.clock() - said > 10 then
                said = fiber.clock()
                log.warn('empty instance: replica set %s exists but has no leader; waiting for one to join',
                    rs.value)
            end
        elseif fiber.clock() - said > 10 then
            said = fiber.clock()
            log.warn('etcd unavailable before start: %s', err and err.message)
        end
        fiber.sleep(ha.poll)
    end
end

-- Data of an earlier version may hold synchronous rows in its snapshot.
local end_recovery = quorum.strip_on_recovery()

-- Tarantool 2.6.0 cannot join while synchronous writes commit (tarantool#5566):
-- ask the leader to hold them until we are registered (or SC_JOIN_HOLD_MS).
-- A leader that is still starting (refused, bootstrap not finished, the
-- replication user or sc.join_hold not there yet) is asked again every
-- 0.5 s for up to SC_JOIN_HOLD_WAIT_S: joining without the hold at a cluster's
-- first start met the leader's first synchronous writes, and every retry of
-- the join failed the same way for as long as they kept coming. Joins anyway
-- after that (an older leader without sc.join_hold; the join may then fail
-- and the supervisor restarts us).
local join_hold_ms = util.env_number('SC_JOIN_HOLD_MS', 10000)
local join_hold_wait_s = util.env_number('SC_JOIN_HOLD_WAIT_S', 30)
local function ask_join_hold(uri, uuid)
    local conn = require('net.box').connect(creds(uri), {wait_connected = 5})
    local ok, r = false, conn.error
    if conn:is_connected() then
        ok, r = pcall(conn.call, conn, 'sc.join_hold', {box.NULL, uuid, join_hold_ms}, {timeout = 10})
    end
    conn:close()
    if ok and type(r) == 'table' and r.status == 'OK' then
        return r
    end
    return nil, ok and json.encode(r) or tostring(r)
end

local function hold_leader_for_join(uri, uuid)
    local until_t = fiber.clock() + join_hold_wait_s
    local attempts = 0
    while true do
        attempts = attempts + 1
        local r, why = ask_join_hold(uri, uuid)
        if r ~= nil then
            log.info('the leader holds writes for our join (drained in %s ms, attempt %d)',
                tostring(r.drain_ms), attempts)
            return true
        end
        if fiber.clock() >= until_t then
            log.warn('the leader did not hold writes for our join in %g s (%d attempts; last: %s): joining anyway',
                join_hold_wait_s, attempts, why)
            return false
        end
        fiber.sleep(0.5)
    end
end

local inst
if ha == nil then
    -- Standalone, or the legacy master/replica pair.
    local replication = {}
    for peer in util.env_string('SC_REPLICATION', ''):gmatch('[^,%s]+') do
        table.insert(replication, creds(peer))
    end
    box.cfg(with({
        instance_uuid = os.getenv('SC_INSTANCE_UUID'),
        read_only = env_bool('SC_READ_ONLY', false),
        replication = #replication > 0 and replication or nil,
        replication_connect_quorum = #replication > 0 and 1 or nil,
    }))
    if not box.info.ro then
        admin_setup()
    else
        local schema = require('smartcache.schema')
        if schema.current_version() < schema.VERSION then
            log.warn('read-only instance with schema %d < %d: waiting for the master to upgrade',
                schema.current_version(), schema.VERSION)
        end
    end
else
    local etcd = require('smartcache.etcd')
    local client = etcd.new({endpoints = ha.endpoints, timeout = ha.etcd_timeout})
    local keys = {leader = string.format('/smartcache/%s/leader', ha.cluster),
                  replicaset = string.format('/smartcache/%s/replicaset', ha.cluster)}
    move_aside_if_asked()
    local plan = {}
    if has_data() then
        -- Recover read-only and replicate from nobody yet: failover checks for
        -- divergence before following anyone.
        box.cfg(with({read_only = true, instance_uuid = os.getenv('SC_INSTANCE_UUID'),
                      replication_connect_quorum = 0}))
    else
        plan = plan_empty_start(client, keys)
        if plan.bootstrap then
            box.cfg(with({read_only = false, instance_uuid = plan.uuid, replicaset_uuid = plan.replicaset,
                          replication_connect_quorum = 0}))
        else
            -- Initial join from the leader: quorum 1, so that box.cfg fails rather than
            -- bootstraps a replica set of its own when the leader cannot be reached.
            hold_leader_for_join(plan.join, plan.uuid)
            log.info('joining the leader at %s', plan.join)
            box.cfg(with({read_only = true, instance_uuid = plan.uuid, replication = {creds(plan.join)},
                          replication_connect_quorum = 1}))
            box.cfg({replication_connect_quorum = 0})
        end
    end
    inst = failover.new({
        etcd = client,
        box = failover.box_adapter({user = replication_user, password = replication_password,
                                    on_promote = admin_setup}),
        cluster = ha.cluster, uri = util.env_string('SC_ADVERTISE', listen),
        ttl = ha.ttl, margin = ha.margin, poll = ha.poll, quorum = ha.quorum,
        election_quorum = ha.election_quorum, candidate = ha.candidate, data_dir = data_dir,
    })
    if plan.lease ~= nil then
        -- The bootstrap lease holds the leader key already: the first control step promotes.
        inst.lease_id, inst.lease_ttl, inst.lease_sent = plan.lease.id, plan.lease.ttl, plan.lease.sent
        inst.next_keepalive = plan.lease.sent + inst.keepalive_interval
    end
    if plan.join ~= nil then
        inst.following = plan.join
    end
    failover.install(inst, util)
end

end_recovery()
quorum.watch_new_spaces(guarded_name)
guard_all()

-- Defines the procedures (global table sc) on every instance; registered (_func) by the writable one.
require('smartcache.api')
require('smartcache.runtime').start()

if inst ~= nil then
    inst:start()
    -- A planned stop of the leader hands over at once instead of after the TTL.
    box.ctl.on_shutdown(function()
        inst:stop()
        if inst.role == 'leader' or inst.role == 'fenced' then
            inst:step_down('shutting down')
        end
    end)
end

if http_listen ~= '' then
    local host, port = http_listen:match('^(.*):(%d+)$')
    require('smartcache.http').start(host, tonumber(port), http_token)
end

log.info('smartcache storage %s ready (%s, read_only=%s, schema=%d, wal_mode=%s, sync=%s)', name,
    ha and ('HA cluster ' .. ha.cluster) or 'standalone', tostring(box.info.ro),
    require('smartcache.schema').current_version(), wal_mode, tostring(sync))
