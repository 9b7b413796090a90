-- The failover procedures (registered in smartcache.api through
-- smartcache.failover): sc.role, sc.switchover, sc.join_hold, sc.rejoin, and the
-- topology changes sc.topology_init, sc.topology_add, sc.topology_remove. Each
-- takes this process's failover instance (nil: not HA) first.
local fiber = require('fiber')
local compat = require('smartcache.compat')
local config = require('smartcache.config')
local vclock = require('smartcache.failover.vclock')
local box_adapter = require('smartcache.failover.box_adapter')
local rejoin = require('smartcache.failover.rejoin')
local topology = require('smartcache.failover.topology')

local M = {}

M.REJOIN_MARKER = rejoin.MARKER
M.REJOIN_EXIT_CODE = rejoin.EXIT_CODE  -- EX_TEMPFAIL: "restart me"

local NOT_HA = {status = 'BAD_REQUEST', message = 'failover is not configured (SC_ETCD)'}

-- A procedure of an instance with failover: on one without (inst nil: not HA) it answers NOT_HA.
local function ha_only(fn)
    return function(inst, ...)
        if inst == nil then
            return NOT_HA
        end
        return fn(inst, ...)
    end
end

-- sc.role(): what the service asks every instance every <= 500 ms.
function M.role(inst)
    local out
    if inst == nil then
        local null = box.NULL
        local writable = box.info.ro == false
        -- In HA mode the instance answers before its failover is set up (an instance
        -- joining the leader listens first): it is starting, not standalone.
        out = {role = config.ha and 'starting' or 'standalone', writable = writable and not config.ha, term = 0,
               lease_left_ms = 0,
               instance_uuid = box.info.uuid, uri = box.cfg.listen,
               leader_uuid = writable and not config.ha and box.info.uuid or null,
               leader_uri = writable and not config.ha and box.cfg.listen or null,
               fenced = false, fence_reason = null, diverged = null, wal_broken = null, eligible = false,
               lease_id = null, etcd_error = null, quorum = box.cfg.replication_synchro_quorum,
               upstream_problem = null, upstream_broken_s = null, decisions = null,
               max_term = 0, max_term_leader = null, etcd_revision = 0, data_term = 0, dcs_regressed = null,
               dcs_hold_left_ms = 0, auto_rejoin = false, rejoin_refused = null,
               slow_followers = setmetatable({}, {__serialize = 'seq'}), cluster = null,
               topology_version = null, topology_members = null, registered = null, topology_problem = null,
               majority = null, unregistered_followers = setmetatable({}, {__serialize = 'seq'})}
    else
        out = inst:status()
        out.counters = nil
        out.cluster = inst.cluster
    end
    out.status = 'OK'
    -- The name it was started with (SC_INSTANCE_NAME: tarantool-1...), beside Tarantool's own instance id,
    -- which follows the order the instances joined the replica set in, not the names.
    out.name = config.instance_name
    out.instance_id = box.info.id
    out.vclock = setmetatable(vclock.clean(box.info.vclock), {__serialize = 'map'})
    out.read_only = box.info.ro
    out.time_ms = math.floor(fiber.time() * 1000)  -- the service measures its clock offset from this
    -- compat.NO_BOX_INFO_SYNCHRO: Tarantool 2.6.0 has no box.info.synchro.
    out.sync_queue_len = not compat.NO_BOX_INFO_SYNCHRO and box.info.synchro.queue.len or box.NULL
    out.replication = box_adapter.replication()
    return out
end

-- An operator call's timeout_ms (nil: default_ms) in seconds, or nil and the BAD_REQUEST answer.
local function timeout_s_of(timeout_ms, default_ms)
    if timeout_ms == nil then
        return default_ms / 1000
    elseif type(timeout_ms) ~= 'number' or timeout_ms <= 0 or timeout_ms > 60000 then
        return nil, {status = 'BAD_REQUEST', message = 'timeout_ms must be in 1..60000'}
    end
    return timeout_ms / 1000
end

-- sc.switchover(candidate_uuid?, timeout_ms?), on the leader.
M.switchover = ha_only(function(inst, candidate_uuid, timeout_ms)
    if candidate_uuid == nil then  -- nil or box.NULL
        candidate_uuid = nil
    elseif type(candidate_uuid) ~= 'string' then
        return {status = 'BAD_REQUEST', message = 'candidate_uuid must be a string'}
    end
    local timeout_s, bad = timeout_s_of(timeout_ms, 5000)
    if timeout_s == nil then
        return bad
    end
    return inst:switchover(candidate_uuid, timeout_s)
end)

-- sc.join_hold(instance_uuid, timeout_ms?), on the leader, by an instance
-- about to join it (as the replication user): smartcache.failover.join_hold.
M.join_hold = ha_only(function(inst, instance_uuid, timeout_ms)
    if type(instance_uuid) ~= 'string' or #instance_uuid ~= 36 then
        return {status = 'BAD_REQUEST', message = 'instance_uuid must be a uuid string'}
    end
    local timeout_s, bad = timeout_s_of(timeout_ms, 10000)
    if timeout_s == nil then
        return bad
    end
    return inst:hold_for_join(instance_uuid, timeout_s)
end)

-- sc.rejoin(instance_uuid, force?), on the instance to rebuild: leaves a marker
-- in its data dir and exits with REJOIN_EXIT_CODE; at the next start init.lua
-- moves the files aside and joins the leader empty.
M.rejoin = ha_only(function(inst, instance_uuid, force)
    if instance_uuid ~= box.info.uuid then
        return {status = 'BAD_REQUEST', message = 'this is instance ' .. box.info.uuid}
    end
    if inst.role == 'leader' or inst.role == 'fenced' or inst.writable() then
        return {status = 'BAD_REQUEST', message = 'the leader cannot rejoin: switch over first'}
    end
    if inst.diverged == nil and force ~= true then
        return {status = 'BAD_REQUEST', message = 'not diverged; force = true rebuilds it anyway'}
    end
    local marker, err = rejoin.request(inst.data_dir, inst.diverged or 'forced', inst.uuid, inst.log)
    if marker == nil then
        return {status = 'ERROR', message = err}
    end
    return {status = 'OK', instance_uuid = inst.uuid, data_dir = inst.data_dir, marker = marker,
            exit_code = M.REJOIN_EXIT_CODE}
end)

-- sc.topology_init(force?), on the leader: the first topology, from the live members
-- (smartcache.failover.membership).
M.topology_init = ha_only(function(inst, force)
    if force ~= nil and type(force) ~= 'boolean' then
        return {status = 'BAD_REQUEST', message = 'force must be a boolean'}
    end
    return inst:topology_init(force == true)
end)

local function check_address(address)
    if not topology.valid_address(address) then
        return {status = 'BAD_REQUEST', message = 'address must be host:port (IPv6 as [addr]:port), the ' ..
            "instance's SC_ADVERTISE (or SC_LISTEN)"}
    end
    return nil
end

-- sc.topology_add(address, http_port?, eligible?), on the leader.
M.topology_add = ha_only(function(inst, address, http_port, eligible)
    local bad = check_address(address)
    if bad ~= nil then
        return bad
    end
    if http_port ~= nil and (type(http_port) ~= 'number' or http_port < 1 or http_port > 65535
            or http_port % 1 ~= 0) then
        return {status = 'BAD_REQUEST', message = 'http_port must be a port number 1..65535'}
    end
    if eligible ~= nil and type(eligible) ~= 'boolean' then
        return {status = 'BAD_REQUEST', message = 'eligible must be a boolean'}
    end
    return inst:topology_add(address, http_port, eligible)
end)

-- sc.topology_remove(address, timeout_ms?), on the leader: waits (default 10 s) for the member to let go.
M.topology_remove = ha_only(function(inst, address, timeout_ms)
    local bad = check_address(address)
    if bad ~= nil then
        return bad
    end
    local timeout_s, bad_timeout = timeout_s_of(timeout_ms, 10000)
    if timeout_s == nil then
        return bad_timeout
    end
    return inst:topology_remove(address, timeout_s)
end)

return M
