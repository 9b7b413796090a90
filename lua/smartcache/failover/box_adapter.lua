-- The real box, as the failover state machine sees it (the tests give it a
-- fake one: tests/lua/failover_test.lua). Also the box errors it tells apart.
local fiber = require('fiber')
local fio = require('fio')
local errno = require('errno')
local compat = require('smartcache.compat')
local quorum = require('smartcache.quorum')
local disk = require('smartcache.disk')
local vclock = require('smartcache.failover.vclock')

local M = {}

function M.is_wal_error(err)
    return type(err) == 'cdata' and err.code == box.error.WAL_IO
        or tostring(err):find('Failed to write to disk', 1, true) ~= nil
end

-- A synchronous write rolled back for want of a quorum: nothing is wrong with
-- the disk, and the limbo is empty afterwards.
function M.is_sync_rollback(err)
    return type(err) == 'cdata' and (err.code == box.error.SYNC_ROLLBACK or err.code == box.error.SYNC_QUORUM_TIMEOUT)
end

-- A write of our own that queues behind every pending one; synchronous when
-- synchronous writes are in flight (on 2.6.0 an asynchronous one must not
-- enter the limbo: smartcache.quorum, compat.ASYNC_BEHIND_SYNC_ROLLS_BACK).
local function probe()
    box.atomic(function()
        box.space.sc_meta:replace({'failover_probe', fiber.time()})
        quorum.join()
    end)
end

-- probe() with the sweepers held still meanwhile (hold_sweeps(true) holds them and answers
-- whether they were held already; hold_sweeps(was) lets them go on); after(), if given,
-- before they go on.
local function probe_paused(hold_sweeps, after)
    local paused = hold_sweeps(true)
    local ok, err = pcall(probe)
    if after ~= nil then
        pcall(after)
    end
    hold_sweeps(paused)
    return ok, err
end

-- This instance's peers as box.info.replication shows them (sc.role, sc.stats, /health).
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

-- Has the WAL's filesystem room, and does it take a write? Asked of the disk
-- directly, not through the WAL: a write's ER_WAL_IO does not say which (on
-- 2.6.0 an asynchronous write stuck in the limbo fails the writes behind it
-- with it too: compat.ASYNC_BEHIND_SYNC_ROLLS_BACK).
local function disk_check()
    local free, min_free = disk.free(box.cfg.wal_dir)
    if free ~= nil and free < min_free then
        return false, string.format('WAL disk almost full: %d MiB free, %d MiB needed',
            math.floor(free / 1048576), math.ceil(min_free / 1048576))
    end
    local path = fio.pathjoin(box.cfg.wal_dir, '.sc_wal_probe')
    local fh, err = fio.open(path, {'O_WRONLY', 'O_CREAT', 'O_TRUNC'}, tonumber('644', 8))
    if fh == nil then
        return false, 'WAL disk does not take a write: ' .. tostring(err)
    end
    local ok, werr = fh:write(string.rep('\0', 4096))
    if ok then
        ok, werr = fh:fsync()
    end
    fh:close()
    fio.unlink(path)
    if not ok then
        return false, 'WAL disk does not take a write: ' .. tostring(werr or errno.strerror())
    end
    return true
end

-- The new leader's clear_synchro_queue. On 2.6.0 it first waits 2 x
-- replication_synchro_timeout for someone else; nobody else will, so that wait
-- is made 1 ms (compat.CLEAR_SYNCHRO_QUEUE_WAITS; smartcache.failover.election
-- says why followers attach first).
local function clear_synchro_queue()
    if not compat.CLEAR_SYNCHRO_QUEUE_WAITS then
        box.ctl.clear_synchro_queue()
        return
    end
    local timeout = box.cfg.replication_synchro_timeout
    box.cfg({replication_synchro_timeout = 0.001})
    local ok, err = pcall(box.ctl.clear_synchro_queue)
    box.cfg({replication_synchro_timeout = timeout})
    if not ok then
        error(err)
    end
end

-- opts: user, password (the replication user), on_promote (admin writes of a new leader),
-- hold_sweeps (the instance's expiry pause, smartcache.expiry.set_paused, given by init.lua:
-- failover requires nothing above the core modules; none by default).
local function no_sweeps()
    return false
end

-- Procedure calls failed by a WAL write so far (smartcache.api counts them in smartcache.disk).
local function wal_errors()
    return disk.wal_errors
end

function M.new(opts)
    local hold_sweeps = opts.hold_sweeps or no_sweeps
    -- Instances whose registration (a _cluster insert: the end of a join's
    -- initial stage) committed here.
    local joined = {}
    box.space._cluster:on_replace(function(_, new)
        if new ~= nil then
            local uuid = new[2]
            box.on_commit(function()
                joined[uuid] = true
            end)
        end
    end)
    return {
        uuid = function() return box.info.uuid end,
        id = function() return box.info.id end,
        vclock = function() return vclock.clean(box.info.vclock) end,
        replicaset = function() return box.info.cluster.uuid end,
        read_only = function(ro)
            if box.cfg.read_only ~= ro then
                box.cfg({read_only = ro})
            end
        end,
        follow = function(uri)
            local replication = {}
            if uri ~= nil then
                replication = {string.format('%s:%s@%s', opts.user, opts.password, uri)}
            end
            box.cfg({replication = replication})
        end,
        downstreams = function()
            local out = {}
            for _, r in pairs(box.info.replication) do
                if r.downstream ~= nil then
                    table.insert(out, {uuid = r.uuid, status = r.downstream.status,
                                       vclock = vclock.clean(r.downstream.vclock)})
                end
            end
            return out
        end,
        clear_synchro_queue = clear_synchro_queue,
        set_quorum = function(q)
            box.cfg({replication_synchro_quorum = q})
        end,
        -- A synchronous transaction of ours has not ended (smartcache.quorum counts them).
        limbo_busy = function()
            return quorum.inflight > 0
        end,
        on_promote = opts.on_promote or function() end,
        wal_errors = wal_errors,
        disk_check = disk_check,
        -- Our one upstream (a follower replicates from the leader only): {status, message} or nil.
        upstream = function()
            for _, r in pairs(box.info.replication) do
                if r.upstream ~= nil then
                    return {status = r.upstream.status, message = r.upstream.message}
                end
            end
            return nil
        end,
        -- Writes queue in the WAL in order (and async ones behind pending sync
        -- ones), so once our own write returns, every write submitted before it
        -- is in the WAL. Expiry holds still meanwhile, then the box turns read-only.
        quiesce = function()
            return probe_paused(hold_sweeps, function() box.cfg({read_only = true}) end)
        end,
        -- Like quiesce, but the box stays writable (a join registers the replica).
        drain = function()
            return probe_paused(hold_sweeps, nil)
        end,
        -- Registered (its _cluster row committed since forget_joined), or following us.
        joined = function(uuid)
            if joined[uuid] then
                return true
            end
            for _, r in pairs(box.info.replication) do
                if r.uuid == uuid and r.downstream ~= nil and r.downstream.status == 'follow' then
                    return true
                end
            end
            return false
        end,
        forget_joined = function(uuid)
            joined[uuid] = nil
        end,
    }
end

return M
