-- What an instance watches besides the key: its WAL's disk, its replication
-- from the leader, and whether it holds rows the leader was not elected with
-- (DIVERGED: read-only and disconnected until rebuilt, see sc.rejoin).
local compat = require('smartcache.compat')
local vclock = require('smartcache.failover.vclock')

local M = {}
local methods = {}
M.methods = methods  -- mixed into the instance (smartcache.failover.instance)

-- A follower reconnects an applier that stopped this often (watch_upstream).
M.UPSTREAM_RETRY_S = 5
-- An applier seen stopped on a conflict this long after its reconnect stopped again: rebuild.
M.CONFLICT_SETTLE_S = 1

-- The WAL's disk, checked every keepalive interval and at once when procedures
-- count new WAL errors: free space below the minimum, or a write that fails,
-- makes the instance ineligible, and a leader steps down (fences itself and
-- frees the key) so that a healthy follower takes over. Stepping down *before*
-- the disk is full matters on 2.6.0: a synchronous write failing in the WAL
-- under concurrent load crashed it (SIGSEGV in txn_free) in our tests
-- (compat.WAL_FAILURE_CRASH). Clears itself when the disk is fine again.
-- Returns a sentence when it changed something, else nil.
function methods:check_disk()
    local n = self.box.wal_errors()
    local now = self.clock()
    if n <= self.wal_errors_seen and now < self.next_disk_check then
        return nil
    end
    self.wal_errors_seen = n
    self.next_disk_check = now + self.keepalive_interval
    local ok, why = self.box.disk_check()
    if ok then
        if self.wal_broken ~= nil then
            self.log.info('failover: the WAL disk is fine again')
            self.wal_broken = nil
            self.next_publish = 0
            return 'the WAL disk is fine again'
        end
        return nil
    end
    local first = self.wal_broken == nil
    if first then
        self.log.error('failover: %s', tostring(why))
        self.next_publish = 0
    end
    self.wal_broken = tostring(why)
    if self.role == 'leader' or self.role == 'fenced' then
        self:step_down(self.wal_broken, {wal = true})
        return 'stepped down: ' .. self.wal_broken
    end
    return first and ('ineligible: ' .. self.wal_broken) or nil
end

function methods:diverge(reason)
    if self.diverged == nil then
        self.counters.divergences = self.counters.divergences + 1
        self.log.error('failover: DIVERGED: %s; read-only and disconnected until rebuilt ' ..
                       '(smartcache-cli cluster rejoin)', reason)
    end
    if self.role == 'leader' then
        self:fence('diverged')
    end
    self.diverged = reason
    self.role = 'diverged'
    if self.following ~= nil then
        pcall(self.set_following, self, nil)
    end
    self.next_publish = 0
    return 'diverged: ' .. reason
end

-- Replicate from uri (nil: from nobody). A new source, or none, starts the
-- watch of the upstream afresh: a problem of the old one is no longer ours
-- (a follower promoted while its upstream was broken stayed unhealthy for good).
function methods:set_following(uri)
    self.box.follow(uri)
    if uri == nil and self.following ~= nil then
        self.stopped_following_at = self.clock()  -- election.lua: when our vclock can be final
    end
    self.following = uri
    self.upstream_since, self.upstream_problem = nil, nil
end

-- Errors of an applier that say the row could not be applied to the data we
-- hold (we have a row the leader does not: a conflict), as opposed to our disk,
-- our memory or the network, which a rebuild would not mend.
M.CONFLICTS = {'Duplicate key exists', 'Tuple doesn\'t exist', 'ER_TUPLE_FOUND', 'ER_TUPLE_NOT_FOUND'}

local function conflict(message)
    if type(message) ~= 'string' then
        return false
    end
    for _, pattern in ipairs(M.CONFLICTS) do
        if message:find(pattern, 1, true) then
            return true
        end
    end
    return false
end
M.is_conflict = conflict

-- A follower's replication from the leader. On 2.6.0 an applier that stopped
-- on an error (its WAL disk was full, a row it could not apply) stays stopped
-- (compat.APPLIER_STAYS_STOPPED): reconnect it every UPSTREAM_RETRY_S, and
-- report it (health) while it does not follow. One that stops on a conflict
-- again after a reconnect holds a row the leader does not: rebuilt from the
-- leader by itself (rebuild_stopped_follower). Returns what it found.
function methods:watch_upstream(leader)
    local up = self.box.upstream()
    if up == nil or up.status == 'follow' then
        self.upstream_since, self.upstream_problem, self.conflict_reconnected = nil, nil, nil
        return nil
    end
    local now = self.clock()
    self.upstream_since = self.upstream_since or now
    self.upstream_problem = string.format('replication from the leader %s for %.0f s%s', up.status,
        now - self.upstream_since, up.message and (': ' .. tostring(up.message)) or '')
    if up.status == 'stopped' and conflict(up.message) and self.conflict_reconnected ~= nil
            and now >= self.conflict_reconnected + M.CONFLICT_SETTLE_S then
        return self.upstream_problem .. '; ' .. self:rebuild_stopped_follower(leader, tostring(up.message))
    end
    if compat.APPLIER_STAYS_STOPPED and up.status == 'stopped' and now >= (self.next_reconnect or 0) then
        self.next_reconnect = now + M.UPSTREAM_RETRY_S
        self.counters.reconnects = self.counters.reconnects + 1
        self.log.warn('failover: %s; reconnecting', self.upstream_problem)
        if conflict(up.message) then
            self.conflict_reconnected = now  -- stopped on it again after this: rebuild
        end
        self.box.follow(nil)
        self.box.follow(leader.uri)
        return self.upstream_problem .. '; reconnected'
    end
    return self.upstream_problem
end

-- Our applier from the leader stopped on a conflict twice: we hold a row of the
-- leader's that the leader does not hold (on 2.6.0, compat.SYNC_ROLLBACK_ADMITS_NEWER:
-- a transaction it rolled back in its memory only). Rebuilding from the leader
-- loses only rows the leader lacks. Rows of any component but the leader's
-- beyond its key would have made us DIVERGED (follow() checks first); rows of
-- the leader's own component that it does not hold are rows it rolled back,
-- and a leader acknowledges a write only once it is confirmed, which nothing
-- rolls back (the 2.6.0 paths that did are closed: ASYNC_BEHIND_SYNC_ROLLS_BACK,
-- SYNC_ROLLBACK_ADMITS_NEWER). So none was acknowledged. Needs SC_AUTO_REJOIN
-- and a disk of our own that works (a conflict is not a disk problem).
function methods:rebuild_stopped_follower(leader, message)
    local why = string.format('replication from leader %s (term %d) stopped twice on a row we hold and it does '
        .. 'not (%s): rows of its own it rolled back, never acknowledged', tostring(leader.uuid), leader.term,
        message)
    if self.rejoin_requested then
        return 'rebuilding: restart pending'
    end
    local refused
    if not self.auto_rejoin then
        refused = 'auto-rejoin off (SC_AUTO_REJOIN=false). Check: the leader leads (cluster status); then '
            .. 'smartcache-cli cluster rejoin rebuilds this follower'
    elseif self.wal_broken ~= nil then
        refused = 'our own WAL disk fails (' .. self.wal_broken .. '): a rebuild would not mend it. Check the disk'
    end
    if refused ~= nil then
        if self.rejoin_refused ~= refused then
            self.rejoin_refused = refused
            self.log.error('failover: %s; not rebuilding by itself: %s', why, refused)
        end
        return 'not rebuilding by itself: ' .. refused
    end
    self.rejoin_refused = nil
    self.counters.conflict_rebuilds = self.counters.conflict_rebuilds + 1
    self.log.warn('failover: rebuilding from the leader by itself: %s', why)
    return self:rebuild('auto: ' .. why, why)
end

-- Another instance holds the key: follow it, unless we hold rows it was not
-- elected with (or are of another replica set): then we are DIVERGED.
function methods:follow(leader)
    local mine = self.box.vclock()
    local rs = self.box.replicaset()
    local reason
    if leader.replicaset ~= nil and rs ~= nil and leader.replicaset ~= rs then
        reason = string.format('replica set %s, the leader is in %s', rs, leader.replicaset)
    else
        local id = vclock.ahead_of(mine, leader.vclock, leader.id)
        if id ~= nil then
            reason = string.format('has rows of instance %d up to lsn %d, leader %s was elected with %d',
                id, mine[id], leader.uuid, leader.vclock[id] or 0)
        end
    end
    if reason ~= nil then
        local decision = self:diverge(reason)
        return decision .. '; ' .. self:maybe_auto_rejoin(leader)
    end
    if vclock.ge(mine, leader.vclock) then
        self:see_data_term(leader.term)  -- we have every row this leader was elected with
    end
    if self.diverged ~= nil then
        self.log.info('failover: no longer diverged: leader %s has every row we have', leader.uuid)
        self.diverged = nil
    end
    local upstream
    if self.following ~= leader.uri then
        self.log.info('failover: following leader %s at %s (term %d)', leader.uuid, leader.uri, leader.term)
        self:set_following(leader.uri)
    else
        upstream = self:watch_upstream(leader)
    end
    if self.role ~= 'follower' then
        self.role = 'follower'
        self.next_publish = 0
    end
    self.term = leader.term
    local decision = string.format('following %s (term %d)', tostring(leader.uuid), leader.term)
    return upstream and (decision .. ': ' .. upstream) or decision
end

return M
