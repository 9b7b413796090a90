-- Planned hand-over of the leader key (sc.switchover, on the leader).
local json = require('json')
local etcd = require('smartcache.etcd')
local vclock = require('smartcache.failover.vclock')
local topology = require('smartcache.failover.topology')

local M = {}
local methods = {}
M.methods = methods  -- mixed into the instance (smartcache.failover.instance)

local REASON = 'switchover'

-- To candidate_uuid (nil: the most up-to-date eligible member). Stops writing,
-- waits until the candidate has every row, moves the key to the candidate's
-- lease in one transaction, and waits until the candidate reports itself
-- leader. Returns a result map; pause_ms is the measured write pause.
-- The box refused a write for being read-only (ER_READONLY), not for its disk.
function M.read_only_error(err)
    local ok, code = pcall(function() return err.code end)
    return ok and code == box.error.READONLY
end

function methods:switchover(candidate_uuid, timeout_s)
    if self.role ~= 'leader' or not self.writable() then
        return {status = 'NOT_LEADER', leader_uuid = self.leader and self.leader.uuid, role = self.role}
    end
    local members = self:members()
    if members == nil then
        return {status = 'ERROR', message = 'etcd unavailable: ' .. tostring(self.last_error)}
    end
    -- Reading the members yielded: the guard may have fenced us meanwhile (a keepalive
    -- missed), and a hand-over from a fenced leader would find its box read-only.
    if self.role ~= 'leader' or not self.writable() then
        return {status = 'NOT_LEADER', leader_uuid = self.leader and self.leader.uuid, role = self.role,
                message = 'fenced before the hand-over began: ' .. tostring(self.fence_reason)}
    end
    local cand
    if candidate_uuid ~= nil then
        cand = members[candidate_uuid]
        if cand == nil then
            return {status = 'NOT_FOUND', message = 'no live member ' .. tostring(candidate_uuid)}
        end
    else
        for _, m in pairs(members) do
            if m.eligible and self:member_of_topology(m) and (cand == nil or vclock.better(m, cand)) then
                cand = m
            end
        end
        if cand == nil then
            return {status = 'NOT_FOUND', message = 'no live eligible member'}
        end
    end
    if not self:member_of_topology(cand) then
        return {status = 'BAD_REQUEST', message = 'member is not in the topology: ' .. tostring(cand.uri)}
    end
    if not cand.eligible or cand.lease == nil then
        return {status = 'BAD_REQUEST', message = 'member is not eligible: ' .. tostring(cand.reason)}
    end
    self.switching_over = true  -- the control step must not promote us meanwhile
    local ok, res = pcall(self.hand_over, self, cand, timeout_s, self:next_term(members))
    self.switching_over = false
    if not ok then
        self.log.error('failover: switchover failed: %s', tostring(res))
        return {status = 'ERROR', message = tostring(res)}
    end
    return res
end

-- Until the candidate's acknowledged vclock covers ours (rows that come after
-- the sample, a late CONFIRM, move the target); the target, or nil at until_t.
-- A member of our topology, not leaving (any member without a topology).
function methods:member_of_topology(m)
    local reg = topology.registration(self.topology, m.uri)
    return reg == nil or reg == 'member'
end

function methods:wait_caught_up(cand, target, until_t)
    while true do
        local caught = false
        for _, d in ipairs(self.box.downstreams()) do
            if d.uuid == cand.uuid and d.status == 'follow' and vclock.ge(d.vclock, target) then
                caught = true
            end
        end
        if caught then
            local now_vc = self.box.vclock()
            if vclock.ge(target, now_vc) then
                return target
            end
            target = now_vc
        end
        if self.clock() >= until_t then
            return nil
        end
        self.sleep(0.005)
    end
end

function methods:hand_over(cand, timeout_s, term)
    local t0 = self.clock()
    local until_t = t0 + timeout_s
    local rev = self.leader and self.leader.rev
    local function pause_ms()
        return math.floor((self.clock() - t0) * 1000)
    end
    -- 1. Stop writing, then let every write already submitted reach the WAL
    -- (and its quorum): a write of our own queues behind them.
    self:hold_writes(REASON)
    local barrier_ok, barrier_err = self.box.quiesce()
    if not barrier_ok then
        if M.read_only_error(barrier_err) then
            -- Something else made the box read-only while the barrier was written (the
            -- guard, its lease unproven): not the disk's fault. Lead on if the lease is
            -- still proven, as after a TIMEOUT; else stay fenced for the control step.
            local resumed = self:resume_writes(REASON, {read_write = true})
            return {status = resumed and 'ERROR' or 'NOT_LEADER', role = self.role,
                    message = 'the box turned read-only during the switchover (' .. tostring(barrier_err) ..
                              (resumed and '): leading again' or '): the lease is not proven')}
        end
        self:step_down('WAL write failed during switchover: ' .. tostring(barrier_err), {wal = true})
        return {status = 'ERROR', message = 'WAL write failed: ' .. tostring(barrier_err)}
    end
    -- 2. The candidate catches up, with everything we have.
    local target = self:wait_caught_up(cand, self.box.vclock(), until_t)
    if target == nil then
        -- Still ours and the lease still proven: take writes again.
        self:resume_writes(REASON, {read_write = true})
        return {status = 'TIMEOUT', message = 'the candidate did not catch up', pause_ms = pause_ms(),
                candidate_uuid = cand.uuid}
    end
    local caught_up_ms = pause_ms()
    -- 3. The key moves to the candidate's lease, if it is still ours, with the next term
    -- (recorded first: a term we name is never forgotten; its leader is recorded when
    -- the key is read, as the outcome of a transaction etcd did not answer is unknown).
    local value = {uuid = cand.uuid, id = cand.id, uri = cand.uri, vclock = vclock.to_json(target),
                   replicaset = self.box.replicaset(), term = term}
    if not self:see_term(term, nil) then
        self:resume_writes(REASON, {read_write = true})
        return {status = 'ERROR', message = 'cannot record the term durably', candidate_uuid = cand.uuid}
    end
    -- ...and only while the topology is the one the candidate was checked against.
    local compare = {{key = self.keys.leader, target = 'MOD', value = rev},
                     {key = self.keys.topology, target = 'MOD', value = self.topology_rev}}
    local ok, new_rev, responses = self.etcd:txn(compare,
        {etcd.op_put(self.keys.leader, json.encode(value), cand.lease)}, {etcd.op_get(self.keys.leader)})
    if ok == nil then
        -- The outcome is unknown: the key may have moved. Stay fenced; the control
        -- step promotes us again if the key is still ours.
        return {status = 'ERROR', message = 'etcd unavailable: ' .. tostring(new_rev and new_rev.message),
                candidate_uuid = cand.uuid}
    end
    if not ok then
        local kv = responses and responses[1] and responses[1].kvs and responses[1].kvs[1]
        if kv ~= nil and kv.mod_revision == rev then
            -- Still ours: the topology changed (a member added or removed). Take writes again.
            self:resume_writes(REASON, {read_write = true})
            return {status = 'ERROR', message = 'the topology changed during the switchover: try again',
                    candidate_uuid = cand.uuid}
        end
        self.role = 'candidate'
        return {status = 'ERROR', message = 'the leader key changed under us', candidate_uuid = cand.uuid}
    end
    self:see_rev(new_rev, 'hand over')
    self.counters.switchovers = self.counters.switchovers + 1
    self.role = 'follower'
    self.term = term
    self.leader = {uuid = cand.uuid, id = cand.id, uri = cand.uri, term = term, rev = new_rev, vclock = target,
                   lease = cand.lease, replicaset = value.replicaset}
    self:set_following(cand.uri)
    self.next_publish = 0
    self.log.info('failover: handed the leader key to %s (term %d)', cand.uuid, term)
    -- 4. Wait until the candidate says it leads (it polls the key).
    while self.clock() < until_t do
        local kv = self.etcd:get(self.keys.members .. cand.uuid)
        local m = kv and vclock.decode(kv.value)
        if m ~= nil and m.role == 'leader' and (tonumber(m.term) or 0) >= term then
            return {status = 'OK', pause_ms = pause_ms(), caught_up_ms = caught_up_ms, candidate_uuid = cand.uuid,
                    term = m.term}
        end
        self.sleep(0.01)
    end
    return {status = 'TIMEOUT', message = 'key handed over; the candidate has not reported leading yet',
            pause_ms = pause_ms(), candidate_uuid = cand.uuid, term = term}
end

return M
