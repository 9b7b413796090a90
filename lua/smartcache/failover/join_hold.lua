-- A replica's join, asked of the leader by the joining instance before it
-- joins (sc.join_hold). Tarantool 2.6.0 cannot take a CONFIRM or ROLLBACK row
-- in the final stage of a join (tarantool#5566, compat.JOIN_FAILS_ON_SYNCHRO_ROWS:
-- the joining instance dies with "Unknown request type 40"), and under
-- synchronous load such rows are there. So: stop writing, let every pending
-- synchronous write get its CONFIRM (a write of our own queues behind them),
-- stay writable for Tarantool itself (it registers the replica in _cluster),
-- and take writes again once the joining instance is registered or follows us,
-- or after the timeout. Writes meanwhile answer NOT_LEADER, as during a
-- switchover; the service retries them.
local fiber = require('fiber')
local box_adapter = require('smartcache.failover.box_adapter')

local M = {}
local methods = {}
M.methods = methods  -- mixed into the instance (smartcache.failover.instance)

-- A join hold's drain still running after this long has met a write stuck in
-- 2.6.0's limbo: a healthy one ends in 0-5 ms, and a synchronous write without
-- its quorum is rolled back after replication_synchro_timeout (SC_SYNC_TIMEOUT_S,
-- 2 s). Every write would queue behind it, so the leader steps down and another
-- leads (the fault suite saw a leader stay fenced by such a drain for minutes,
-- once). At least this, and three synchronous timeouts.
M.JOIN_DRAIN_TIMEOUT_S = 5

local function join_drain_timeout_s()
    local sync_s = type(box.cfg) == 'table' and tonumber(box.cfg.replication_synchro_timeout) or 0
    return math.max(M.JOIN_DRAIN_TIMEOUT_S, 3 * sync_s)
end

-- box.drain on a fiber of its own, waited for at most timeout_s; ok, err.
function methods:bounded_drain(timeout_s)
    local done = fiber.channel(1)
    fiber.create(function()
        fiber.name('failover_drain')
        local ok, err = self.box.drain()
        done:put({ok = ok, err = err})
    end)
    local r = done:get(timeout_s)
    if r == nil then
        return false, string.format('the drain did not finish in %.1f s (a write stuck in the limbo)', timeout_s)
    end
    return r.ok, r.err
end

function methods:hold_for_join(uuid, timeout_s)
    if self.join_hold ~= nil then
        -- One hold at a time; a second joiner shares it (and may extend it).
        self.join_hold.uuids[uuid] = true
        self.join_hold['until'] = math.max(self.join_hold['until'], self.clock() + timeout_s)
        return {status = 'OK', shared = true, drain_ms = 0}
    end
    if self.role ~= 'leader' or not self.writable() then
        return {status = 'NOT_LEADER', leader_uuid = self.leader and self.leader.uuid or box.NULL, role = self.role}
    end
    local t0 = self.clock()
    local reason = 'join of ' .. tostring(uuid)
    self.join_draining = uuid  -- the control step must not promote us meanwhile
    self:hold_writes(reason)
    self.box.forget_joined(uuid)
    local ok, err = self:bounded_drain(self.join_drain_timeout_s or join_drain_timeout_s())
    self.join_draining = nil
    if not ok and box_adapter.is_sync_rollback(err) then
        -- The synchronous writes in flight were rolled back for want of a quorum (at a
        -- cluster's first start no follower is in yet): the limbo is empty, all a join
        -- needs. (Stepping down here kept the first followers out: each retry of their
        -- join met the next doomed write.)
        self.log.info('failover: writes in flight before the join of %s rolled back (%s)', uuid, tostring(err))
        ok = true
    end
    if not ok then
        local wal = box_adapter.is_wal_error(err)
        self:step_down((wal and 'WAL write failed' or 'drain failed') .. ' before a join: ' .. tostring(err),
            {wal = wal})
        return {status = 'ERROR', message = 'drain before the join failed: ' .. tostring(err)}
    end
    self.join_hold = {uuids = {[uuid] = true}, started = t0, ['until'] = t0 + timeout_s, reason = reason}
    self.counters.join_holds = self.counters.join_holds + 1
    local drain_ms = math.floor((self.clock() - t0) * 1000)
    self.log.info('failover: writes held for the join of %s (drained in %d ms)', uuid, drain_ms)
    return {status = 'OK', drain_ms = drain_ms}
end

-- Every guard tick while a join hold lasts: release it once each joiner is in.
function methods:join_hold_step()
    local hold = self.join_hold
    if hold == nil then
        return 'no action: no join hold'
    end
    local waiting = {}
    for uuid in pairs(hold.uuids) do
        if not self.box.joined(uuid) then
            table.insert(waiting, uuid)
        end
    end
    local now = self.clock()
    local held_ms = math.floor((now - hold.started) * 1000)
    if #waiting > 0 and now < hold['until'] then
        return string.format('holding writes for the join of %s (%d ms)', table.concat(waiting, ', '), held_ms)
    end
    self.join_hold = nil
    self:resume_writes(hold.reason)
    self.last_join_hold_ms = held_ms
    if #waiting > 0 then
        self.log.warn('failover: join hold released after %d ms without the joiner in (timeout)', held_ms)
        return string.format('released the join hold after %d ms: timeout, %s not in', held_ms,
            table.concat(waiting, ', '))
    end
    self.log.info('failover: join hold released after %d ms: the joiner is registered', held_ms)
    return string.format('released the join hold after %d ms: the joiner is registered', held_ms)
end

return M
