-- Election and promotion: what the control step (smartcache.failover.control)
-- does when the leader key is free, and when it is ours.
--
-- Election, when the key is free: every member first stops replicating from
-- the old leader, then republishes its vclock once it is final (not following
-- anyone, and the same at two samples a poll apart: rows the applier had
-- submitted are in the WAL). Before, only the winner stopped, and the others
-- kept receiving from a resuming old leader after they had published: the old
-- leader and a follower held LSN 87871 while the new leader was elected with
-- 87870, both turned DIVERGED, and writes stopped until a person rejoined two
-- members. A member takes the key (a transaction with create_revision == 0)
-- only when every other live, eligible member has published a final vclock
-- since the key went away (or election_wait passed) and none is ahead of it:
-- the newest data_term first (the term of the newest leader whose rows a member
-- has all, as Raft compares the last entry's term), then the vclock sum, ties
-- to the smallest uuid. Its term is 1 + the highest term it and those members
-- have seen (smartcache.failover.terms). No member takes the key while the DCS
-- hold lasts (TTL + margin after it went back) or any member publishes one.
--
-- Promotion on Tarantool 2.6.0: box.ctl.clear_synchro_queue() waits
-- 2 x replication_synchro_timeout for someone else to empty the queue, then
-- confirms the old leader's pending transactions up to what a quorum of the
-- replicas *replicating from us* have, and rolls back the rest. So the new
-- leader first waits (bounded) until quorum - 1 followers follow it and have
-- everything it has, then clears with the timeout set to 1 ms
-- (compat.CLEAR_SYNCHRO_QUEUE_WAITS, in the box adapter): an acknowledged
-- write that reached only the new leader is confirmed, not rolled back
-- (measured: with no follower attached the same call rolls it back).
local json = require('json')
local etcd = require('smartcache.etcd')
local vclock = require('smartcache.failover.vclock')
local box_adapter = require('smartcache.failover.box_adapter')

local M = {}
local methods = {}
M.methods = methods  -- mixed into the instance (smartcache.failover.instance)

-- A member that stopped replicating counts its vclock as final once this long
-- has passed and two samples a poll apart agree (rows its applier had submitted
-- reach the WAL in milliseconds).
M.SETTLE_S = 0.05

-- The leader key's value as a record: {uuid, id, uri, vclock, term, rev (its
-- mod_revision, for compare-and-swap), lease, replicaset}. A key written by an
-- earlier version has no term: its mod_revision stands in (terms only grow).
function M.leader_of(kv)
    local v = vclock.decode(kv.value)
    local unreadable = v == nil
    v = v or {}
    return {uuid = v.uuid, id = v.id, uri = v.uri, vclock = v.vclock or {}, term = tonumber(v.term) or kv.mod_revision,
            rev = kv.mod_revision, lease = kv.lease, replicaset = v.replicaset, vclock_unreadable = unreadable}
end

local function key_value(self, vc, term)
    return json.encode({uuid = self.uuid, id = self.box.id(), uri = self.uri, vclock = vclock.to_json(vc),
                        replicaset = self.box.replicaset(), term = term})
end

-- Stop replicating (the key is free: nothing may reach us from a resuming old
-- leader after we publish); true once our vclock is final.
function methods:settle()
    if self.following ~= nil then
        self:set_following(nil)
    end
    local vc = self.box.vclock()
    local prev = self.settle_vc
    self.settle_vc = vc
    if self.stopped_following_at == nil then
        return true  -- followed nobody in this process: nothing can arrive
    end
    if self.clock() - self.stopped_following_at < M.SETTLE_S then
        return false
    end
    return prev ~= nil and vclock.equal(prev, vc)
end

-- The key is free: publish, and take it if no live eligible member is ahead of us.
function methods:elect(final)
    local hold = self:dcs_hold_left()
    self.vclock_final = final and hold == 0
    local me = self:publish()
    if me == nil then
        return 'election: cannot publish (' .. tostring(self.last_error) .. ')'
    end
    if hold > 0 then
        return string.format('election: held %.2f s more: the DCS went back (%s)', hold, tostring(self.dcs_regressed))
    end
    if not me.eligible then
        return 'election: not eligible (' .. tostring(me.reason or 'SC_CANDIDATE=false') .. ')'
    end
    local members = self:members()
    if members == nil then
        return 'election: etcd unavailable (' .. tostring(self.last_error) .. ')'
    end
    self:merge_member_terms(members)
    if self.absent_since_rev == nil then
        return 'election: waiting for the key to be seen free again'
    end
    local waited = self.clock() - self.absent_since
    local fresh = 1  -- us
    for _, m in pairs(members) do
        if m.dcs_hold then
            return string.format('election: %s holds elections: the DCS went back', m.uuid)
        end
        -- Without a topology the eligible members; with one every healthy member listed,
        -- eligible or not (topology.lua: votes).
        if self:votes(m) then
            if m.mod_revision <= self.absent_since_rev or not m.final then
                -- Published before the key went away, or still replicating: its vclock
                -- may grow. Wait for it, up to election_wait (a member that cannot
                -- publish then cannot lead either).
                if waited < self.election_wait then
                    return string.format('election: waiting for %s to publish a final vclock (%.1f of %g s)',
                        m.uuid, waited, self.election_wait)
                end
            elseif vclock.better(m, me) then
                return string.format('election: %s is ahead of us', m.uuid)
            else
                fresh = fresh + 1
            end
        end
    end
    -- A majority of the members (the topology's, else SC_CLUSTER_SIZE) must have
    -- spoken: an acknowledged (synchronous) write is on a majority, two majorities
    -- share a member, and we are not behind any member we heard from.
    local majority = self:election_majority()
    if fresh < majority then
        return string.format('election: %d of the %d members a majority needs have published', fresh, majority)
    end
    if not final then
        return 'election: waiting for our own vclock to settle'
    end
    local vc = self.box.vclock()
    local term = self:next_term(members)
    -- The key is taken only if the topology is still the one this election counted
    -- (a member added or removed meanwhile: the next step counts again).
    local ok, rev = self.etcd:txn({{key = self.keys.leader, target = 'CREATE', value = 0},
                                   {key = self.keys.topology, target = 'MOD', value = self.topology_rev}},
        {etcd.op_put(self.keys.leader, key_value(self, vc, term), self.lease_id)}, {})
    if ok == nil then
        self:etcd_error('take leader key', rev)
        return 'election: ' .. self.last_error
    end
    self:see_rev(rev, 'take leader key')
    if not ok then
        return 'election: another member took the key first, or the topology changed'  -- the next step reads both
    end
    self.counters.elections_won = self.counters.elections_won + 1
    self.log.info('failover: won the election (term %d)', term)
    local leader = {uuid = self.uuid, id = self.box.id(), uri = self.uri, term = term, rev = rev, vclock = vc,
                    lease = self.lease_id, replicaset = self.box.replicaset()}
    if not self:see_term(term, self.uuid) then
        self.leader, self.term = leader, term
        self:step_down('cannot record term ' .. term .. ' durably')
        return 'election: won, but cannot record the term durably: stepped down'
    end
    return string.format('won the election (term %d); ', term) .. self:promote(leader)
end

-- Until quorum - 1 live members replicate from us and have all we have, or timeout.
function methods:wait_followers(timeout)
    local members = self:members() or {}
    local live = 0
    for _, m in pairs(members) do
        if m.reason == nil then  -- diverged or broken members do not replicate from us
            live = live + 1
        end
    end
    local need = math.min(self:quorum_floor() - 1, live)
    if need <= 0 then
        return true
    end
    local target = self.box.vclock()
    local until_t = self.clock() + timeout
    while true do
        local n = 0
        for _, d in ipairs(self.box.downstreams()) do
            if d.status == 'follow' and vclock.ge(d.vclock, target) then
                n = n + 1
            end
        end
        if n >= need then
            return true
        end
        if self.clock() >= until_t then
            self.log.warn('failover: only %d of %d followers caught up before promotion', n, need)
            return false
        end
        self.sleep(0.01)
    end
end

-- The vclock in the key is the baseline of divergence checks: every row of
-- another instance that we have must be in it. After a hand-over we may have
-- received a row or two from the old leader after it wrote the key; then the
-- key is rewritten (same lease and term, checked by revision).
function methods:rebase(leader)
    local mine = self.box.vclock()
    if vclock.ahead_of(mine, leader.vclock, self.box.id()) == nil then
        return
    end
    local vc = vclock.raised(leader.vclock, mine, self.box.id())
    local ok, rev = self.etcd:txn({{key = self.keys.leader, target = 'MOD', value = leader.rev}},
        {etcd.op_put(self.keys.leader, key_value(self, vc, leader.term), self.lease_id)}, {})
    if not ok then
        error('the leader key changed during promotion: ' .. tostring(type(rev) == 'table' and rev.message or rev))
    end
    self:see_rev(rev, 'rebase')
    leader.vclock, leader.rev = vc, rev
end

-- The key is ours: become writable, in this order.
function methods:promote(leader)
    if self.promoting then
        return 'no action: a promotion is running'
    end
    self.promoting = true
    local lease = self.lease_id
    local ok, err = pcall(function()
        if self.following ~= nil then
            self:set_following(nil)
        end
        self:rebase(leader)
        self:wait_followers(self.promote_wait)
        -- 2.6.0 confirms what quorum relays have: the quorum must match who is attached.
        self:quorum_step()
        self.box.clear_synchro_queue()
        -- Durably, before our first row of this term: the term we lead and our own
        -- LSN at its start (the auto-rejoin proof, smartcache.failover.rejoin).
        if self.led == nil or self.led.term ~= leader.term then
            self.led = {term = leader.term, from_lsn = self.box.vclock()[self.box.id()] or 0}
        end
        self.data_term = math.max(self.data_term, leader.term)
        if not self:save_terms() then
            error('cannot record the term durably')
        end
        self.box.read_only(false)
        self.box.on_promote()
    end)
    self.promoting = false
    self.leader = leader
    self.term = leader.term
    if not ok then
        local reason = 'promotion failed: ' .. tostring(err)
        self:step_down(reason, {wal = box_adapter.is_wal_error(err)})
        return 'stepped down: ' .. reason
    end
    local deadline = self:proven_deadline()
    if self.lease_id ~= lease or self.clock() >= deadline then
        self.role = 'leader'  -- so that fence counts and logs it
        self:fence('lease not proven after promotion')
        return 'fenced: lease not proven after promotion'
    end
    self.deadline = deadline
    self.role = 'leader'
    self.fence_reason = nil
    self.counters.promotions = self.counters.promotions + 1
    self.log.info('failover: leader (term %d), writable for %.2f s unless renewed', self.term, self:lease_left())
    self:publish()
    -- Record the replica set if etcd does not (say, etcd was rebuilt): an empty
    -- instance then joins it instead of bootstrapping a new one.
    self:record_replicaset()
    return string.format('promoted: leader (term %d), writable for %.2f s', self.term, self:lease_left())
end

-- The replicaset key, created if absent (it is the same for every member).
function methods:record_replicaset()
    local rs = self.box.replicaset()
    if rs ~= nil then
        local created, rev = self.etcd:create(self.keys.replicaset, rs)
        if created ~= nil then
            self:see_rev(rev, 'record the replica set')
        end
    end
end

return M
