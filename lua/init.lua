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

local clock = require('clock')
local uuid = require('uuid')
local netbox = require('net.box')
-- Every setting, from the environment (read there and nowhere else).
local config = require('smartcache.config')
local compat = require('smartcache.compat')
local etcd = require('smartcache.etcd')
local failover = require('smartcache.failover')
local expiry = require('smartcache.expiry')
local quorum = require('smartcache.quorum')
local events = require('smartcache.events')
local schema = require('smartcache.schema')
-- Defines the procedures (global table sc) on every instance; registered (_func) by the writable one.
local api = require('smartcache.api')
local runtime = require('smartcache.runtime')
local http = require('smartcache.http')

local name = config.instance_name
local data_dir = config.data_dir
local ha = config.ha

-- Durability profile (config: SC_WAL_MODE, SC_SYNC). HA: an acknowledged write
-- of a synchronous space is on a quorum of instances, so the WAL need not be
-- fsynced. Standalone: the only copy is this disk, so fsync by default.
-- Writes of the data spaces (quorum.GUARDED, events partitions) are
-- synchronous through sc_quorum, not through is_sync on the spaces themselves
-- (smartcache.quorum says why).
quorum.enable(config.sync)
local function guarded_name(space_name)
    for _, n in ipairs(quorum.GUARDED) do
        if n == space_name then
            return true
        end
    end
    return space_name:match('^events_%d%d%d%d%d%d%d%d$') ~= nil
end
local function guard_all()
    return quorum.guard_all(events.partitions())
end

local function creds(uri)
    return string.format('%s:%s@%s', config.replication_user, config.replication_password, uri)
end

if not fio.path.exists(data_dir) then
    assert(fio.mktree(data_dir), 'cannot create ' .. data_dir)
end

-- The Lua heap lives small (about 1.4 MiB after start: data is in memtx) while every request
-- makes garbage: a collection cycle starts when the heap reaches this percentage of what
-- the last one left (SC_LUA_GC_PAUSE; config says what it buys).
collectgarbage('setpause', config.lua_gc_pause)

-- JSON logs with the service's keys (lua/relog.sed): one log stack, one schema.
local log_target = nil
if config.log_format == 'json' and config.log_relog then
    log_target = string.format('pipe: sed -u -E -f %s', fio.pathjoin(here, 'relog.sed'))
end

local cfg = {
    listen = config.listen,
    log = log_target,
    memtx_memory = config.memtx_memory,
    memtx_dir = data_dir,
    wal_dir = data_dir,
    work_dir = data_dir,
    wal_mode = config.wal_mode,
    checkpoint_interval = config.checkpoint_interval,
    checkpoint_count = config.checkpoint_count,
    log_format = config.log_format,
    log_level = config.log_level,
    custom_proc_title = name,
    replication_synchro_quorum = config.sync_quorum,
    replication_synchro_timeout = config.sync_timeout_s,
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
    ensure_user(config.replication_user, config.replication_password)
    box.schema.user.grant(config.replication_user, 'replication', nil, nil, {if_not_exists = true})
    schema.upgrade()
    api.register(nil)  -- functions and the role; the service user below, without rewriting its password
    ensure_user(config.service_user, config.service_password)
    box.schema.user.grant(config.service_user, api.ROLE, nil, nil, {if_not_exists = true})
    ensure_user(config.operator_user, config.operator_password)
    box.schema.user.grant(config.operator_user, api.OPERATOR_ROLE, nil, nil, {if_not_exists = true})
    -- An instance about to join asks the leader to hold writes (smartcache.failover: join_hold).
    box.schema.user.grant(config.replication_user, 'execute', 'function', 'sc.join_hold', {if_not_exists = true})
    quorum.clear_sync_flags()
    guard_all()
end

local function has_data()
    return #(fio.glob(fio.pathjoin(data_dir, '*.snap')) or {}) > 0
end

-- HA: `smartcache-cli cluster rejoin` (sc.rejoin), failover itself (SC_AUTO_REJOIN) or an
-- operator leaves a marker file; the files go aside (the newest SC_ASIDE_KEEP directories
-- are kept) and the instance joins the leader empty. Never force_recovery.
local function move_aside_if_asked()
    return failover.set_aside(data_dir, config.aside_keep, log)
end

-- HA, empty instance: bootstrap the replica set if nobody has (atomically with
-- taking the leader key), or join the leader. Waits while there is a replica
-- set but no leader: an empty instance never becomes an empty master of it.
-- With a topology in etcd (smartcache.failover.topology) it does neither until
-- it is a member (`smartcache-cli cluster add`): meanwhile it holds a lease and
-- publishes a member record saying it waits (role unregistered), and replicates
-- from nobody (a joined replica acknowledges writes).
local function plan_empty_start(client, keys, http_port)
    local instance_uuid = config.instance_uuid or uuid.str()
    local kept = failover.file_store(data_dir).load()  -- a rebuild keeps the terms file
    local known = kept.topology
    known = known and failover.normalize_topology(known) or nil
    local waiter = failover.topology_waiter({client = client, key = keys.members .. instance_uuid, uuid = instance_uuid,
                                    uri = config.advertise, http_port = http_port, candidate = ha.candidate,
                                    ttl = ha.ttl, clock = clock.monotonic})
    local said = 0
    local function say(...)
        if fiber.clock() - said > 10 then
            said = fiber.clock()
            log.warn(...)
        end
    end
    while true do
        local kvs, err = client:get_many({keys.leader, keys.replicaset, keys.topology})
        local reg, why, version
        if kvs ~= nil then
            reg, why, version = failover.boot_registration(kvs[3], config.advertise, known)
        end
        if kvs == nil then
            say('etcd unavailable before start: %s', err and err.message)
        elseif why ~= nil then
            say('empty instance, unregistered: %s; waiting', why)
            waiter.tick(why, reg, version)
        elseif kvs[1] then
            waiter.done()
            local v = json.decode(kvs[1].value)
            return {join = v.uri, uuid = instance_uuid}
        elseif kvs[2] == false then
            waiter.done()
            local t_sent = clock.monotonic()
            local lease = client:grant(ha.ttl)
            if lease ~= nil then
                local rs_uuid = uuid.str()
                -- The first term of a new replica set: 1, or one past any this data dir knew (terms count
                -- leader changes, docs/operations.md; the key's mod_revision is no term: a fresh shard of an
                -- etcd that already held another's keys started at term 770).
                local term = (tonumber(kept.max_term) or 0) + 1
                local value = json.encode({uuid = instance_uuid, id = 1, uri = config.advertise,
                                           vclock = setmetatable({}, {__serialize = 'map'}),
                                           replicaset = rs_uuid, term = term})
                local ok, rev = client:txn(
                    {{key = keys.leader, target = 'CREATE', value = 0},
                     {key = keys.replicaset, target = 'CREATE', value = 0},
                     {key = keys.topology, target = 'MOD', value = kvs[3] and kvs[3].mod_revision or 0}},
                    {etcd.op_put(keys.leader, value, lease.id), etcd.op_put(keys.replicaset, rs_uuid)}, {})
                if ok then
                    log.info('bootstrapping replica set %s (term %d, etcd revision %d)', rs_uuid, term, rev)
                    return {bootstrap = true, uuid = instance_uuid, replicaset = rs_uuid,
                            lease = {id = lease.id, ttl = lease.ttl, sent = t_sent}}
                end
                client:revoke(lease.id)
            end
        else
            waiter.done()
            say('empty instance: replica set %s exists but has no leader; waiting for one to join', kvs[2].value)
        end
        fiber.sleep(ha.poll)
    end
end

-- Data of an earlier version may hold synchronous rows in its snapshot.
local end_recovery = quorum.strip_on_recovery()

-- Tarantool 2.6.0 cannot join while synchronous writes commit (tarantool#5566,
-- compat.JOIN_FAILS_ON_SYNCHRO_ROWS): ask the leader to hold them until we are
-- registered (or SC_JOIN_HOLD_MS).
-- A leader that is still starting (refused, bootstrap not finished, the
-- replication user or sc.join_hold not there yet) is asked again every
-- 0.5 s for up to SC_JOIN_HOLD_WAIT_S: joining without the hold at a cluster's
-- first start met the leader's first synchronous writes, and every retry of
-- the join failed the same way for as long as they kept coming. Joins anyway
-- after that (an older leader without sc.join_hold; the join may then fail
-- and the supervisor restarts us).
local function ask_join_hold(uri, joiner_uuid)
    local conn = netbox.connect(creds(uri), {wait_connected = 5})
    local ok, r = false, conn.error
    if conn:is_connected() then
        ok, r = pcall(conn.call, conn, 'sc.join_hold', {box.NULL, joiner_uuid, config.join_hold_ms}, {timeout = 10})
    end
    conn:close()
    if ok and type(r) == 'table' and r.status == 'OK' then
        return r
    end
    return nil, ok and json.encode(r) or tostring(r)
end

local function hold_leader_for_join(uri, joiner_uuid)
    local until_t = fiber.clock() + config.join_hold_wait_s
    local attempts = 0
    while true do
        attempts = attempts + 1
        local r, why = ask_join_hold(uri, joiner_uuid)
        if r ~= nil then
            log.info('the leader holds writes for our join (drained in %s ms, attempt %d)',
                tostring(r.drain_ms), attempts)
            return true
        end
        if fiber.clock() >= until_t then
            log.warn('the leader did not hold writes for our join in %g s (%d attempts; last: %s): joining anyway',
                config.join_hold_wait_s, attempts, why)
            return false
        end
        fiber.sleep(0.5)
    end
end

local inst
if ha == nil then
    -- Standalone, or the legacy master/replica pair.
    local replication = {}
    for _, peer in ipairs(config.replication_peers) do
        table.insert(replication, creds(peer))
    end
    box.cfg(with({
        instance_uuid = config.instance_uuid,
        read_only = config.read_only,
        replication = #replication > 0 and replication or nil,
        replication_connect_quorum = #replication > 0 and 1 or nil,
    }))
    if not box.info.ro then
        admin_setup()
    else
        if schema.current_version() < schema.VERSION then
            log.warn('read-only instance with schema %d < %d: waiting for the master to upgrade',
                schema.current_version(), schema.VERSION)
        end
    end
else
    local client = etcd.new({endpoints = ha.endpoints, timeout = ha.etcd_timeout})
    local prefix = string.format('/smartcache/%s/', ha.cluster)
    local keys = {leader = prefix .. 'leader', replicaset = prefix .. 'replicaset', members = prefix .. 'members/',
                  topology = prefix .. failover.TOPOLOGY_KEY}
    local http_port = tonumber(config.http_listen:match(':(%d+)$'))
    local set_aside = move_aside_if_asked()
    local plan = {}
    if has_data() then
        -- Recover read-only and replicate from nobody yet: failover checks for
        -- divergence before following anyone.
        box.cfg(with({read_only = true, instance_uuid = config.instance_uuid,
                      replication_connect_quorum = 0}))
    else
        plan = plan_empty_start(client, keys, http_port)
        if plan.bootstrap then
            box.cfg(with({read_only = false, instance_uuid = plan.uuid, replicaset_uuid = plan.replicaset,
                          replication_connect_quorum = 0}))
        else
            -- Initial join from the leader: quorum 1, so that box.cfg fails rather than
            -- bootstraps a replica set of its own when the leader cannot be reached.
            if compat.JOIN_FAILS_ON_SYNCHRO_ROWS then
                hold_leader_for_join(plan.join, plan.uuid)
            end
            log.info('joining the leader at %s', plan.join)
            box.cfg(with({read_only = true, instance_uuid = plan.uuid, replication = {creds(plan.join)},
                          replication_connect_quorum = 1}))
            box.cfg({replication_connect_quorum = 0})
        end
    end
    inst = failover.new({
        etcd = client,
        box = failover.box_adapter({user = config.replication_user, password = config.replication_password,
                                    on_promote = admin_setup, hold_sweeps = expiry.set_paused}),
        cluster = ha.cluster, uri = config.advertise,
        ttl = ha.ttl, margin = ha.margin, poll = ha.poll, quorum = ha.quorum,
        election_quorum = ha.election_quorum, candidate = ha.candidate, data_dir = data_dir,
        cluster_size = ha.size, quorum_min = ha.quorum_min, http_port = http_port,
        auto_rejoin = ha.auto_rejoin, slow_follower = ha.slow_follower, set_aside = set_aside,
        -- The bootstrap lease holds the leader key already: the first control step promotes.
        lease = plan.lease,
        following = plan.join,
    })
    failover.install(inst)
end

end_recovery()
quorum.watch_new_spaces(guarded_name)
guard_all()

runtime.start()

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

if config.http_listen ~= '' then
    local host, port = config.http_listen:match('^(.*):(%d+)$')
    http.start(host, tonumber(port), config.http_token)
end

log.info('smartcache storage %s ready (%s, read_only=%s, schema=%d, wal_mode=%s, sync=%s)', name,
    ha and ('HA cluster ' .. ha.cluster) or 'standalone', tostring(box.info.ro),
    schema.current_version(), config.wal_mode, tostring(config.sync))
