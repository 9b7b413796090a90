-- The lease and fencing (the standard lease rule, as in Patroni's leader loop
-- and Chubby): a leader may write only while now < t_sent + TTL - margin,
-- t_sent being the monotonic time at which the last *successful* keepalive
-- (or the grant) was sent. etcd can expire the key no earlier than
-- t_sent + TTL, so a leader cut off from etcd, or frozen (SIGSTOP) and
-- resumed, refuses writes before anyone else can be elected. writable() is
-- that one compare (smartcache.failover.instance); the guard step also turns
-- the box read-only when the deadline passes.
--
-- Also here: the one way our own operations (a switchover, a join hold, a
-- quorum raise) hold writes while the key and the lease stay ours, and take
-- them again only while the lease is still proven (hold_writes, resume_writes).
local M = {}
local methods = {}
M.methods = methods  -- mixed into the instance (smartcache.failover.instance)

-- The moment the last proof of our lease stops covering writes: t_sent + TTL - margin.
function methods:proven_deadline()
    return self.lease_sent + self.lease_ttl - self.margin
end

function methods:lease_left()
    return math.max(0, self.deadline - self.clock())
end

-- Grant a lease, or keep ours alive every keepalive interval; fence when it is lost.
function methods:lease_step()
    local t_sent = self.clock()
    if self.lease_id == nil then
        local r, err = self.etcd:grant(self.ttl)
        if r == nil then
            self:etcd_error('grant', err)
            return 'no lease: ' .. self.last_error
        end
        self.lease_id, self.lease_ttl, self.lease_sent = r.id, math.min(r.ttl, self.ttl), t_sent
        self.next_keepalive = t_sent + self.keepalive_interval
        self.next_publish = 0
        return string.format('granted lease %s (TTL %g s)', r.id, self.lease_ttl)
    end
    if t_sent < self.next_keepalive then
        return string.format('no action: lease %s proven %.2f s ago', self.lease_id, t_sent - self.lease_sent)
    end
    local lease = self.lease_id
    local ttl, err = self.etcd:keepalive(lease)
    if self.lease_id ~= lease then
        return 'no action: the lease was replaced while its keepalive was out'
    end
    if ttl == nil then
        -- Nothing proven: the deadline runs out on its own. Retry soon.
        self:etcd_error('keepalive', err)
        local retry = math.min(self.keepalive_interval, self.poll)
        self.next_keepalive = self.clock() + retry
        return string.format('nothing proven: %s; again in %.2f s', self.last_error, retry)
    end
    self.next_keepalive = t_sent + self.keepalive_interval
    if ttl <= 0 then
        self.log.warn('failover: lease %s is gone', lease)
        self.lease_id = nil
        self.lease_ttl = 0
        if self.role == 'leader' then
            self:fence('lease lost')
            return string.format('fenced: lease %s is gone', lease)
        end
        return string.format('lease %s is gone', lease)
    end
    self.lease_sent, self.lease_ttl = t_sent, math.min(ttl, self.ttl)
    if self.role == 'leader' then
        -- May lie in the past already (a slow answer): then the guard fences.
        self.deadline = self:proven_deadline()
        return string.format('renewed lease %s: writable for %.2f s', lease, self:lease_left())
    end
    return string.format('renewed lease %s', lease)
end

-- Fence once the deadline passes.
function methods:guard_step()
    if self.role ~= 'leader' then
        return string.format('no action: not the leader (%s)', self.role)
    end
    local now = self.clock()
    if now >= self.deadline then
        self:fence('lease deadline passed')
        return string.format('fenced: lease not proven since %.2f s ago', now - self.lease_sent)
    end
    return string.format('no action: I am the leader with the lease (%.2f s left)', self.deadline - now)
end

-- Stop writing now. Never yields before the deadline is gone.
function methods:fence(reason)
    self.deadline = 0
    local was = self.role
    pcall(self.box.read_only, true)
    if was == 'leader' then
        self.counters.fences = self.counters.fences + 1
        self.role = 'fenced'
        self.fence_reason = reason
        self.log.warn('failover: fenced (%s): read-only, writes answer NOT_LEADER', reason)
        self.next_publish = 0
    end
end

-- Give up leadership for good: fence, then free the key if it is still ours.
function methods:step_down(reason, opts)
    local ours = self.leader ~= nil and self.leader.uuid == self.uuid and self.leader.rev or nil
    self:fence(reason)
    self.counters.step_downs = self.counters.step_downs + 1
    if opts and opts.wal then
        self.wal_broken = reason
    end
    if self.role ~= 'diverged' then
        self.role = 'candidate'
    end
    self.log.error('failover: stepping down: %s', reason)
    if ours ~= nil then
        local ok, err = self.etcd:delete_if(self.keys.leader, ours)
        if ok == nil then
            self:etcd_error('release leader key', err)
        end
    end
    self.next_publish = 0
end

-- Hold writes for one of our own operations while leading: writes answer
-- NOT_LEADER (the service retries them), the box stays as it is, the key and the
-- lease stay ours. reason names the operation (status: fence_reason).
function methods:hold_writes(reason)
    self.deadline = 0
    self.role = 'fenced'
    self.fence_reason = reason
end

-- After hold_writes(reason): lead and write again if nothing else fenced us
-- meanwhile and the lease is still proven; true if so. opts.read_write: the
-- operation made the box read-only (a switchover's quiesce).
function methods:resume_writes(reason, opts)
    local deadline = self:proven_deadline()
    if self.role ~= 'fenced' or self.fence_reason ~= reason or self.lease_id == nil or self.clock() >= deadline then
        return false
    end
    if opts and opts.read_write then
        self.box.read_only(false)
    end
    self.deadline = deadline
    self.role = 'leader'
    self.fence_reason = nil
    return true
end

return M
