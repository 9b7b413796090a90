-- The synchronous quorum a leader sets (box.cfg.replication_synchro_quorum),
-- re-evaluated every guard tick.
local compat = require('smartcache.compat')

local M = {}
local methods = {}
M.methods = methods  -- mixed into the instance (smartcache.failover.instance)

-- A quorum raise holds writes at most this long for the limbo to drain (raise_quorum).
M.RAISE_DRAIN_S = 0.2
local RAISE_REASON = 'raising the synchronous quorum'

-- The synchronous quorum a leader uses: every attached follower, and never
-- fewer than the configured quorum (a majority by default). Tarantool 2.6.0
-- (Debian's; the fixes for tarantool#5144/#5185/#5195 came later) stalls
-- about 2 % of synchronous writes for replication_synchro_timeout and then
-- rolls them back when more replicas acknowledge than the quorum needs
-- (quorum 2 with two replicas: 480 of 20,000 writes; quorum 3 with two
-- replicas, or 2 with one: none): compat.QUORUM_EXTRA_ACKS_STALL. Durability
-- never drops below the configured quorum.
--
-- "Attached" means attached *and acknowledging*: a follower that is frozen
-- (SIGSTOP) or stalled stays `follow` until its relay times out (4 x
-- replication_timeout), and with it counted every write waited for it: one
-- frozen follower stopped every write for 4.0 s, each in flight answered
-- OUTCOME_UNKNOWN. So a follower whose acknowledged vclock has not reached the
-- LSN we had slow_follower seconds ago (SC_SLOW_FOLLOWER_MS, 500 ms, well under
-- the TTL) no longer counts, and the quorum comes down at once, never below
-- the configured one (a majority). Our LSN, not its idle time: an idle healthy
-- follower acknowledges only heartbeats (every replication_timeout) but has
-- every row we have. Measured on Debian's 2.6.0 (docs/storage-failover.md): lowering
-- replication_synchro_quorum confirms the writes already waiting in the limbo
-- at once (three writes waiting for quorum 3 with one of two replicas frozen
-- were confirmed 0.5 ms after the quorum went to 2). When the follower catches
-- up it counts again and the quorum goes up through the drain (raise_quorum).
--
-- With a topology (smartcache.failover.topology) the floor is a majority of its
-- members, and every attached follower that acknowledges without being a
-- member we know of (unregistered: it has not seen its removal, it is cut off
-- from etcd, we have not read its record) adds one to it: Tarantool counts its
-- acknowledgement like any other, and a write must still be on a majority of
-- the members without it.
function methods:quorum_for(attached, unregistered)
    local floor = self:quorum_floor() + (unregistered or 0)
    if not compat.QUORUM_EXTRA_ACKS_STALL then
        return floor
    end
    return math.max(floor, attached + 1)
end

-- Our own LSN as it was at time t (the samples of the last slow_follower seconds
-- and one before); nil when we have no sample that old.
function methods:own_lsn_at(t)
    local h = self.lsn_history
    local found
    for i = #h, 1, -1 do
        if h[i].t <= t then
            found = h[i].lsn
            break
        end
    end
    return found
end

-- Sample our own LSN (once per guard tick) and drop the samples no longer needed.
function methods:sample_own_lsn(now)
    local h = self.lsn_history
    local lsn = self.box.vclock()[self.box.id()] or 0
    if #h == 0 or h[#h].lsn ~= lsn then
        table.insert(h, {t = now, lsn = lsn})
    end
    -- Keep the newest sample at or before now - slow_follower, and every one after it.
    local cut = now - self.slow_follower
    while #h >= 2 and h[2].t <= cut do
        table.remove(h, 1)
    end
end

-- Downstreams that follow us and acknowledge: (count, uuids of those that follow but do not,
-- uuids of those that acknowledge without being members: topology.lua).
function methods:acknowledging()
    local now = self.clock()
    self:sample_own_lsn(now)
    local target = self:own_lsn_at(now - self.slow_follower)
    local own = self.box.id()
    local n, slow, unregistered = 0, {}, {}
    for _, d in ipairs(self.box.downstreams()) do
        if d.status == 'follow' then
            if target == nil or ((d.vclock or {})[own] or 0) >= target then
                n = n + 1
                if not self:counts_as_member(d.uuid) then
                    table.insert(unregistered, d.uuid)
                end
            else
                table.insert(slow, d.uuid)
            end
        end
    end
    table.sort(slow)
    table.sort(unregistered)
    return n, slow, unregistered
end

function methods:quorum_step()
    if self.role ~= 'leader' and not self.promoting then
        self.lsn_history = {}
        self.slow_followers = nil
        self.unregistered_followers = nil
        return 'no action: not leading'
    end
    local attached, slow, unregistered = self:acknowledging()
    local was_slow = self.slow_followers or {}
    local was_unregistered = self.unregistered_followers or {}
    self.slow_followers = #slow > 0 and slow or nil
    self.unregistered_followers = #unregistered > 0 and unregistered or nil
    local q = self:quorum_for(attached, #unregistered)
    if #slow > #was_slow then
        self.log.warn('failover: followers %s stopped acknowledging for %.2f s: not in the quorum',
            table.concat(slow, ', '), self.slow_follower)
    end
    if #unregistered > #was_unregistered then
        self.log.warn('failover: followers %s acknowledge without being members: each adds one to the quorum',
            table.concat(unregistered, ', '))
    end
    if q == self.effective_quorum then
        return string.format('no action: synchronous quorum %d', q)
    end
    if self.effective_quorum ~= nil and q < self.effective_quorum then
        -- Down at once: writes waiting for the slow follower are confirmed by the
        -- acknowledgements they have (2.6.0, measured; see above).
        self.effective_quorum = q
        self.box.set_quorum(q)
        self.counters.quorum_lowerings = self.counters.quorum_lowerings + 1
        return string.format('lowered the synchronous quorum to %d (%d followers acknowledging%s)', q, attached,
            #slow > 0 and (', ' .. table.concat(slow, ', ') .. ' not') or '')
    end
    if compat.QUORUM_RAISE_DROPS_PENDING and self.role == 'leader' and self.effective_quorum ~= nil
            and q > self.effective_quorum and self.box.limbo_busy ~= nil and self.join_hold == nil then
        return self:raise_quorum(q)
    end
    self.effective_quorum = q
    self.box.set_quorum(q)
    return string.format('set the synchronous quorum to %d (%d followers attached)', q, attached)
end

-- Raise the quorum only with nothing in the limbo. On 2.6.0 writes waiting in
-- the limbo when the quorum goes up (a follower attaches) were not confirmed
-- by the acknowledgements they already had: they timed out, were rolled back on
-- the leader only, and the followers, which kept them, stopped on the next
-- write that reused their event numbers (fault suite: partition-leader-etcd and
-- partition-leader-followers, each about once in seven full runs;
-- compat.QUORUM_RAISE_DROPS_PENDING). So: hold writes (NOT_LEADER, as in a join
-- hold; the service retries), let the limbo drain under the old quorum, raise
-- it, write again. The hold is short: the limbo drains in 0-5 ms, but a write
-- that 2.6.0's quorum bug stalls (quorum 2 with two replicas, see quorum_for)
-- stays until the synchronous timeout, and waiting for it held every write for
-- 2 s; after RAISE_DRAIN_S the quorum goes up anyway, as it did before.
function methods:raise_quorum(q)
    local t0 = self.clock()
    local old = self.effective_quorum
    self.raising_quorum = true  -- the control step must not promote us meanwhile
    self:hold_writes(RAISE_REASON)
    local until_t = t0 + M.RAISE_DRAIN_S
    while self.box.limbo_busy() and self.clock() < until_t do
        self.sleep(0.002)
    end
    local drained = not self.box.limbo_busy()
    self.effective_quorum = q
    local ok, err = pcall(self.box.set_quorum, q)
    self.raising_quorum = false
    self:resume_writes(RAISE_REASON)
    self.counters.quorum_raises = self.counters.quorum_raises + 1
    local ms = math.floor((self.clock() - t0) * 1000)
    local undrained = drained and '' or ' (the limbo did not drain)'
    self.log.info('failover: synchronous quorum %s -> %d after %d ms%s', tostring(old), q, ms, undrained)
    if not ok then
        error(err)
    end
    return string.format('raised the synchronous quorum %s -> %d after %d ms%s', tostring(old), q, ms, undrained)
end

return M
