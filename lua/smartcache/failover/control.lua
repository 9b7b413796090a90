-- The control step: read the leader key; follow whoever holds it, elect when
-- it is free (election.lua), promote when it is ours; publish our member record.
-- A key the DCS should no longer hold (terms.lua: it went back) is removed and
-- obeyed in nothing; an instance outside the topology replicates from nobody.
local election = require('smartcache.failover.election')

local M = {}
local methods = {}
M.methods = methods  -- mixed into the instance (smartcache.failover.instance)

-- The key is free and terms were known: has etcd forgotten the replica set too
-- (wiped, or a new etcd)? Once per absence of the key; the record is written again.
function methods:check_forgotten()
    if self.forgot_checked or self.max_term == 0 or self.box.replicaset() == nil then
        return nil
    end
    local kv, rev = self.etcd:get(self.keys.replicaset)
    if kv == nil then
        self:etcd_error('read replica set', rev)
        return nil
    end
    self.forgot_checked = true
    if self:see_rev(rev, 'read replica set') ~= nil then
        return 'the DCS went back'
    end
    if kv == false then
        local reason = string.format('etcd has no replica set record, term %d was seen', self.max_term)
        self:dcs_went_back(reason)
        self:record_replicaset()
        self.forgot_checked = true
        return reason
    end
    return nil
end

function methods:no_leader(rev)
    if self.role == 'leader' then
        self:fence('leader key gone')
    end
    self.leader = nil
    if self.absent_since_rev == nil then
        self.absent_since_rev, self.absent_since = rev, self.clock()
        self.forgot_checked = false
    end
    if self.role ~= 'diverged' then
        self.role = 'candidate'
    end
    -- First stop receiving: the vclock we publish for the election is then final.
    local final = self:settle()
    local forgot = self:check_forgotten()
    local decision = self:elect(final)
    return forgot and ('the DCS forgot: ' .. forgot .. '; ' .. decision) or decision
end

-- A leader key the DCS should no longer hold: act on nothing it says, remove it.
function methods:stale(leader, reason)
    self:dcs_went_back(reason)
    self.leader = nil
    local ok, err = self.etcd:delete_if(self.keys.leader, leader.rev)
    if ok == nil then
        self:etcd_error('remove stale key', err)
        return 'the DCS went back: ' .. reason .. '; cannot remove the stale key: ' .. tostring(self.last_error)
    end
    return string.format('the DCS went back: %s; removed the stale key; no election for %.2f s', reason,
        self:dcs_hold_left())
end

-- Our own key, of our lease: promote unless we lead or one of our operations holds writes.
function methods:own_key(leader, kv)
    if kv.lease ~= self.lease_id then
        -- Our key from an earlier life (a lease we no longer hold): free it now
        -- rather than wait out its TTL. Only this instance writes with our uuid.
        self.log.info('failover: removing the leader key of a previous run')
        local ok, err = self.etcd:delete_if(self.keys.leader, kv.mod_revision)
        if ok == nil then
            self:etcd_error('remove stale key', err)
        end
        return 'removed the leader key of a previous run'
    end
    local held = self:writes_held()
    if self.role ~= 'leader' and held == nil then
        return self:promote(leader)
    end
    self.leader, self.term = leader, leader.term
    if held ~= nil then
        return 'no action: writes held for a ' .. held
    end
    return 'no action: I am the leader with the lease'
end

-- A key that is not stale: ours, or another's to follow.
function methods:keyed(leader, kv)
    self.absent_since_rev, self.absent_since = nil, nil
    self.settle_vc, self.vclock_final = nil, false
    -- Durably before we act on it (a term seen is never forgotten).
    self:see_term(leader.term, leader.uuid)
    if self.dcs_regressed ~= nil and leader.term > (self.regressed_term or 0) then
        self.log.info('failover: etcd holds a leader again (term %d) after it went back (%s)', leader.term,
            self.dcs_regressed)
        self.dcs_regressed = nil
    end
    if leader.uuid == self.uuid then
        return self:own_key(leader, kv)
    end
    if self.role == 'leader' or self.role == 'fenced' then
        self:fence('another leader: ' .. tostring(leader.uuid))
    end
    self.leader = leader
    return self:follow(leader)
end

-- Not a member of the topology (absent, or being removed): replicate from nobody, read-only,
-- never a candidate; a leader steps down first (frees the key). Its acknowledgements would count
-- in the leader's quorum while it cannot win an election (topology.lua).
function methods:unregistered(kv)
    local why = self:unregistered_reason()
    local leader = kv and election.leader_of(kv) or nil
    if leader ~= nil and leader.uuid == self.uuid then
        if self.role == 'leader' or self.role == 'fenced' then
            self.leader = leader
            self:step_down(why)
        else
            local ok, err = self.etcd:delete_if(self.keys.leader, kv.mod_revision)
            if ok == nil then
                self:etcd_error('release leader key', err)
            end
        end
    elseif self.role == 'leader' or self.role == 'fenced' then
        self:fence(why)
    end
    if self.following ~= nil then
        self:set_following(nil)
    end
    pcall(self.box.read_only, true)
    self.leader = leader
    self.absent_since_rev, self.absent_since = nil, nil
    self.vclock_final = false
    if self.role ~= 'unregistered' then
        self.log.warn('failover: unregistered: %s: replicating from nobody, read-only', why)
        self.role = 'unregistered'
        self.next_publish = 0
    end
    return 'unregistered: ' .. why .. ': replicating from nobody, read-only'
end

-- The leader's topology chores after its step: know the uri of every follower's uuid (the quorum
-- counts members only: topology.lua), and write back a topology etcd lost.
function methods:leader_topology_chores(decision)
    if self.role ~= 'leader' or self.topology == nil then
        return decision
    end
    local now = self.clock()
    local since = now - (self.uris_read_at or -math.huge)
    if since >= self.keepalive_interval or (self.uris_stale and since >= self.poll) then
        self.uris_read_at = now
        self:members()
    end
    local repaired = self:repair_topology()
    return repaired and (decision .. '; ' .. repaired) or decision
end

function methods:control_step()
    local disk = self:check_disk()
    local decision
    if self.lease_id == nil then
        if self.role == 'leader' then
            self:fence('no lease')
            decision = 'fenced: no lease'
        else
            decision = 'no action: waiting for a lease'
        end
        return disk and (disk .. '; ' .. decision) or decision
    end
    -- The leader key and the topology, at one revision.
    local kvs, rev = self.etcd:get_many({self.keys.leader, self.keys.topology})
    local back
    if kvs == nil then
        self:etcd_error('read leader key', rev)
        decision = 'no action: ' .. self.last_error
    else
        local kv = kvs[1]
        back = self:see_rev(rev, 'read leader key')
        self:see_topology(kvs[2])
        if not self:registered() then
            decision = self:unregistered(kv)
        else
            if self.role == 'unregistered' then
                self.log.info('failover: %s is a member again (topology version %d)', self.uri, self.topology.version)
                self.role = 'candidate'
                self.next_publish = 0
            end
            if kv == false then
                decision = self:no_leader(rev)
            else
                local leader = election.leader_of(kv)
                local stale = self:stale_key(leader)
                if stale ~= nil then
                    decision = self:stale(leader, stale)
                else
                    decision = self:keyed(leader, kv)
                end
            end
            decision = self:leader_topology_chores(decision)
        end
        if self.clock() >= self.next_publish then
            self:publish()
        end
    end
    if back ~= nil then
        decision = 'the DCS went back (' .. back .. '); ' .. decision
    end
    return disk and (disk .. '; ' .. decision) or decision
end

return M
