-- Leader lease, self-fencing and election for a replica set of smartcache
-- instances, with etcd as the only judge of who leads (issue 11).
--
-- No instance decides on its own that the leader is gone. etcd holds one key,
-- /smartcache/<cluster>/leader, attached to the leader's lease; whoever holds
-- it leads, and the key's mod_revision is the term. Every instance keeps its
-- own lease alive (keepalive every TTL/3) and publishes its vclock under
-- /smartcache/<cluster>/members/<uuid> on that lease.
--
-- Fencing (the standard lease rule, as in Patroni's leader loop and Chubby):
-- the leader may write only while now < t_sent + TTL - margin, t_sent being
-- the monotonic time at which the last *successful* keepalive was sent. etcd
-- can expire the key no earlier than t_sent + TTL, so a leader cut off from
-- etcd, or frozen (SIGSTOP) and resumed, refuses writes before anyone else can
-- be elected. writable() is that one compare; the guard fiber also turns the
-- instance read-only when the deadline passes.
--
-- Election, when the key is free: every member republishes its vclock; a
-- member takes the key (a transaction with create_revision == 0) only when
-- every other live, eligible member has published since the key went away
-- and none is ahead of it (vclock sum; ties: smallest uuid). The winner stops
-- replicating before it samples the vclock it writes into the key, so that
-- vclock is final for every other instance's component: a follower with more
-- of any of them than the key says holds rows the leader does not have, and
-- is DIVERGED (it stays read-only and disconnected until rebuilt, see rejoin).
--
-- Promotion on Tarantool 2.6.0: box.ctl.clear_synchro_queue() waits
-- 2 x replication_synchro_timeout for someone else to empty the queue, then
-- confirms the old leader's pending transactions up to what a quorum of the
-- replicas *replicating from us* have, and rolls back the rest. So the new
-- leader first waits (bounded) until quorum - 1 followers follow it and have
-- everything it has, then clears with the timeout set to 1 ms: an acknowledged
-- write that reached only the new leader is confirmed, not rolled back
-- (measured: with no follower attached the same call rolls it back).
--
-- The state machine is three steps, each runnable alone against an injected
-- clock, etcd client and box adapter (lua/tests/failover_test.lua):
--   lease_step    grant / keepalive the lease; fence when it is lost
--   control_step  read the leader key; follow, elect, promote; publish
--   guard_step    fence once the deadline passes
local clock = require('clock')
local fiber = require('fiber')
local json = require('json')

local M = {}

M.ROLES = {'leader', 'follower', 'candidate', 'fenced', 'diverged', 'standalone'}
M.REJOIN_MARKER = 'sc_rejoin'
M.REJOIN_EXIT_CODE = 75  -- EX_TEMPFAIL: "restart me"

local F = {}
F.__index = F

-- vclocks ---------------------------------------------------------------------

-- box.info.vclock without component 0 (local rows, never replicated), as a
-- plain {id = lsn} table.
local function clean_vclock(vc)
    local out = {}
    for id, lsn in pairs(vc or {}) do
        id = tonumber(id)
        if id ~= nil and id ~= 0 then
            out[id] = lsn
        end
    end
    return out
end
M.clean_vclock = clean_vclock

-- JSON cannot carry a sparse integer-keyed table: keys become strings.
local function vclock_to_json(vc)
    local out = setmetatable({}, {__serialize = 'map'})
    for id, lsn in pairs(clean_vclock(vc)) do
        out[tostring(id)] = lsn
    end
    return out
end

local function vclock_sum(vc)
    local s = 0
    for _, lsn in pairs(vc) do
        s = s + lsn
    end
    return s
end
M.vclock_sum = vclock_sum

-- a >= b in every component.
local function vclock_ge(a, b)
    for id, lsn in pairs(b) do
        if (a[id] or 0) < lsn then
            return false
        end
    end
    return true
end
M.vclock_ge = vclock_ge

-- The first component, other than the leader's own, in which mine is ahead of
-- the vclock the leader was elected with; nil when there is none.
local function ahead_of(mine, elected, leader_id)
    for id, lsn in pairs(mine) do
        if id ~= leader_id and lsn > (elected[id] or 0) then
            return id
        end
    end
    return nil
end
M.ahead_of = ahead_of

-- Election order: more rows first, then the smaller uuid.
local function better(a, b)
    local sa, sb = vclock_sum(a.vclock), vclock_sum(b.vclock)
    if sa ~= sb then
        return sa > sb
    end
    return a.uuid < b.uuid
end
M.better = better

local function decode(value)
    local ok, doc = pcall(json.decode, value)
    if not ok or type(doc) ~= 'table' then
        return nil
    end
    doc.vclock = clean_vclock(doc.vclock)
    return doc
end

local function is_wal_error(err)
    return type(err) == 'cdata' and err.code == box.error.WAL_IO
        or tostring(err):find('Failed to write to disk', 1, true) ~= nil
end

-- A synchronous write rolled back for want of a quorum: nothing is wrong with
-- the disk, and the limbo is empty afterwards.
local function is_sync_rollback(err)
    return type(err) == 'cdata' and (err.code == box.error.SYNC_ROLLBACK or err.code == box.error.SYNC_QUORUM_TIMEOUT)
end

-- the instance ----------------------------------------------------------------

-- opts:
--   etcd         smartcache.etcd client (or a fake)
--   box          adapter (M.box_adapter for the real one): uuid(), id(), vclock(), replicaset(),
--                read_only(bool), follow(uri|nil), downstreams() -> {{uuid, status, vclock}},
--                clear_synchro_queue(), set_quorum(n), on_promote(), wal_errors() -> counter,
--                disk_check() -> ok, why (the WAL's disk has room and takes a write),
--                quiesce() -> ok, err (read-only once every submitted write is in the WAL)
--   cluster, uri, ttl (s), margin (s), poll (s), quorum (synchronous), election_quorum
--   (a majority of the configured members), candidate (bool), data_dir
--   clock        monotonic seconds (default clock.monotonic)
--   sleep        fiber.sleep (tests: a function that moves the fake clock)
--   log          the log module
function M.new(opts)
    local self = setmetatable({}, F)
    self.etcd = assert(opts.etcd, 'etcd client required')
    self.box = assert(opts.box, 'box adapter required')
    self.cluster = opts.cluster or 'smartcache'
    self.uri = assert(opts.uri, 'uri required')
    self.ttl = opts.ttl or 5
    self.margin = opts.margin or math.max(0.5, self.ttl / 5)
    assert(self.margin < self.ttl, 'lease margin must be below the TTL')
    self.keepalive_interval = self.ttl / 3
    self.poll = opts.poll or 0.2
    self.quorum = opts.quorum or 2                       -- synchronous replication quorum
    self.election_quorum = opts.election_quorum or self.quorum  -- eligible members that must have published
    self.effective_quorum = nil  -- what box.cfg.replication_synchro_quorum is set to by quorum_step
    self.candidate_allowed = opts.candidate ~= false
    self.promote_wait = opts.promote_wait or math.min(2, self.ttl / 2)
    self.election_wait = opts.election_wait or self.ttl
    self.data_dir = opts.data_dir
    self.clock = opts.clock or clock.monotonic
    self.sleep = opts.sleep or fiber.sleep
    self.log = opts.log or require('log')
    local prefix = string.format('/smartcache/%s/', self.cluster)
    self.keys = {prefix = prefix, leader = prefix .. 'leader', members = prefix .. 'members/',
                 replicaset = prefix .. 'replicaset'}

    self.role = 'candidate'
    self.deadline = 0          -- monotonic s: writes allowed while clock() < deadline
    self.term = 0
    self.leader = nil          -- {uuid, id, uri, term, vclock, lease, replicaset}
    self.lease_id = nil
    self.lease_ttl = 0
    self.lease_sent = 0        -- send time of the last successful grant/keepalive
    self.next_keepalive = 0
    self.next_publish = 0
    self.following = nil
    self.absent_since_rev = nil
    self.absent_since = nil
    self.diverged = nil        -- reason, while diverged
    self.wal_broken = nil      -- reason, after a WAL failure made us step down
    self.wal_errors_seen = self.box.wal_errors()
    self.next_disk_check = 0
    self.handing_over = false
    self.promoting = false
    self.last_error = nil
    self.counters = {elections_won = 0, promotions = 0, fences = 0, step_downs = 0, etcd_errors = 0,
                     divergences = 0, switchovers = 0, join_holds = 0, quorum_raises = 0,
                     reconnects = 0}
    self.keys.member = self.keys.members .. self.box.uuid()
    self.uuid = self.box.uuid()
    -- The hot path: one compare against the deadline.
    self.writable = function()
        return self.clock() < self.deadline
    end
    return self
end

function F:etcd_error(what, err)
    self.counters.etcd_errors = self.counters.etcd_errors + 1
    self.last_error = string.format('%s: %s', what, err and err.message or '?')
end

function F:lease_left()
    return math.max(0, self.deadline - self.clock())
end

-- Stop writing now. Never yields before the deadline is gone.
function F:fence(reason)
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
function F:step_down(reason, opts)
    local term = self.term
    self:fence(reason)
    self.counters.step_downs = self.counters.step_downs + 1
    if opts and opts.wal then
        self.wal_broken = reason
    end
    if self.role ~= 'diverged' then
        self.role = 'candidate'
    end
    self.log.error('failover: stepping down: %s', reason)
    if term > 0 then
        local ok, err = self.etcd:delete_if(self.keys.leader, term)
        if ok == nil then
            self:etcd_error('release leader key', err)
        end
    end
    self.next_publish = 0
end

function F:eligible()
    return self.candidate_allowed and self.diverged == nil and self.wal_broken == nil
end

function F:record()
    return {uuid = self.uuid, id = self.box.id(), uri = self.uri, vclock = vclock_to_json(self.box.vclock()),
            role = self.role, term = self.term, eligible = self:eligible(), lease = self.lease_id,
            replicaset = self.box.replicaset(), reason = self.diverged or self.wal_broken}
end

-- Put our member record (on our lease); returns (record, revision) or nil.
function F:publish()
    if self.lease_id == nil then
        return nil
    end
    local rec = self:record()
    local rev, err = self.etcd:put(self.keys.member, json.encode(rec), self.lease_id)
    if rev == nil then
        self:etcd_error('publish', err)
        return nil
    end
    self.next_publish = self.clock() + self.keepalive_interval
    rec.vclock = clean_vclock(rec.vclock)
    return rec, rev
end

-- lease -------------------------------------------------------------------------

function F:lease_step()
    local t_sent = self.clock()
    if self.lease_id == nil then
        local r, err = self.etcd:grant(self.ttl)
        if r == nil then
            self:etcd_error('grant', err)
            return
        end
        self.lease_id, self.lease_ttl, self.lease_sent = r.id, math.min(r.ttl, self.ttl), t_sent
        self.next_keepalive = t_sent + self.keepalive_interval
        self.next_publish = 0
        return
    end
    if t_sent < self.next_keepalive then
        return
    end
    local lease = self.lease_id
    local ttl, err = self.etcd:keepalive(lease)
    if self.lease_id ~= lease then
        return  -- replaced while we waited
    end
    if ttl == nil then
        -- Nothing proven: the deadline runs out on its own. Retry soon.
        self:etcd_error('keepalive', err)
        self.next_keepalive = self.clock() + math.min(self.keepalive_interval, self.poll)
        return
    end
    self.next_keepalive = t_sent + self.keepalive_interval
    if ttl <= 0 then
        self.log.warn('failover: lease %s is gone', lease)
        self.lease_id = nil
        self.lease_ttl = 0
        if self.role == 'leader' then
            self:fence('lease lost')
        end
        return
    end
    self.lease_sent, self.lease_ttl = t_sent, math.min(ttl, self.ttl)
    if self.role == 'leader' then
        -- May lie in the past already (a slow answer): then the guard fences.
        self.deadline = t_sent + self.lease_ttl - self.margin
    end
end

function F:guard_step()
    if self.role == 'leader' and self.clock() >= self.deadline then
        self:fence('lease deadline passed')
    end
end

-- The synchronous quorum a leader uses: every attached follower, and never
-- fewer than the configured quorum (a majority by default). Tarantool 2.6.0
-- (Debian's; the fixes for tarantool#5144/#5185/#5195 came later) stalls
-- about 2 % of synchronous writes for replication_synchro_timeout and then
-- rolls them back when more replicas acknowledge than the quorum needs
-- (quorum 2 with two replicas: 480 of 20,000 writes; quorum 3 with two
-- replicas, or 2 with one: none). Durability never drops below the
-- configured quorum.
function F:quorum_for(attached)
    return math.max(self.quorum, attached + 1)
end

function F:quorum_step()
    if self.role ~= 'leader' and not self.promoting then
        return
    end
    local attached = 0
    for _, d in ipairs(self.box.downstreams()) do
        if d.status == 'follow' then
            attached = attached + 1
        end
    end
    local q = self:quorum_for(attached)
    if q == self.effective_quorum then
        return
    end
    if self.role == 'leader' and self.effective_quorum ~= nil and q > self.effective_quorum
            and self.box.limbo_busy ~= nil and self.join_hold == nil then
        return self:raise_quorum(q)
    end
    self.effective_quorum = q
    self.box.set_quorum(q)
end

-- Raise the quorum only with nothing in the limbo. On 2.6.0 writes waiting in
-- the limbo when the quorum goes up (a follower attaches) were not confirmed
-- by the acknowledgements they already had: they timed out, were rolled back on
-- the leader only, and the followers, which kept them, stopped on the next
-- write that reused their event numbers (fault suite: partition-leader-etcd and
-- partition-leader-followers, each about once in seven full runs). So: hold
-- writes (NOT_LEADER, as in a join hold; the service retries), let the limbo
-- drain under the old quorum, raise it, write again. The hold is short: the
-- limbo drains in 0-5 ms, but a write that 2.6.0's quorum bug stalls (quorum
-- 2 with two replicas, see quorum_for) stays until the synchronous timeout, and
-- waiting for it held every write for 2 s; after RAISE_DRAIN_S the quorum goes
-- up anyway, as it did before.
M.RAISE_DRAIN_S = 0.2
function F:raise_quorum(q)
    local t0 = self.clock()
    local old = self.effective_quorum
    self.handing_over = true  -- the control step must not promote us meanwhile
    self.deadline = 0
    self.role = 'fenced'
    self.fence_reason = 'raising the synchronous quorum'
    local until_t = t0 + M.RAISE_DRAIN_S
    while self.box.limbo_busy() and self.clock() < until_t do
        self.sleep(0.002)
    end
    local drained = not self.box.limbo_busy()
    self.effective_quorum = q
    local ok, err = pcall(self.box.set_quorum, q)
    self.handing_over = false
    local d = self.lease_sent + self.lease_ttl - self.margin
    if self.role == 'fenced' and self.fence_reason == 'raising the synchronous quorum'
            and self.lease_id ~= nil and self.clock() < d then
        self.deadline = d
        self.role = 'leader'
        self.fence_reason = nil
    end
    self.counters.quorum_raises = self.counters.quorum_raises + 1
    self.log.info('failover: synchronous quorum %s -> %d after %d ms%s', tostring(old), q,
        math.floor((self.clock() - t0) * 1000), drained and '' or ' (the limbo did not drain)')
    if not ok then
        error(err)
    end
end

-- control -------------------------------------------------------------------------

-- The WAL's disk, checked every keepalive interval and at once when procedures
-- count new WAL errors: free space below the minimum, or a write that fails,
-- makes the instance ineligible, and a leader steps down (fences itself and
-- frees the key) so that a healthy follower takes over. Stepping down *before*
-- the disk is full matters on 2.6.0: a synchronous write failing in the WAL
-- under concurrent load crashed it (SIGSEGV in txn_free) in our tests.
-- Clears itself when the disk is fine again.
function F:check_disk()
    local n = self.box.wal_errors()
    local now = self.clock()
    if n <= self.wal_errors_seen and now < self.next_disk_check then
        return
    end
    self.wal_errors_seen = n
    self.next_disk_check = now + self.keepalive_interval
    local ok, why = self.box.disk_check()
    if ok then
        if self.wal_broken ~= nil then
            self.log.info('failover: the WAL disk is fine again')
            self.wal_broken = nil
            self.next_publish = 0
        end
        return
    end
    if self.wal_broken == nil then
        self.log.error('failover: %s', tostring(why))
        self.next_publish = 0
    end
    self.wal_broken = tostring(why)
    if self.role == 'leader' or self.role == 'fenced' then
        self:step_down(self.wal_broken, {wal = true})
    end
end

function F:diverge(reason)
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
end

-- Replicate from uri (nil: from nobody). A new source, or none, starts the
-- watch of the upstream afresh: a problem of the old one is no longer ours
-- (a follower promoted while its upstream was broken stayed unhealthy for good).
function F:set_following(uri)
    self.box.follow(uri)
    self.following = uri
    self.upstream_since, self.upstream_problem = nil, nil
end

-- A follower's replication from the leader. On 2.6.0 an applier that stopped
-- on an error (its WAL disk was full, a row it could not apply) stays stopped:
-- reconnect it every UPSTREAM_RETRY_S, and report it (health) while it does
-- not follow.
M.UPSTREAM_RETRY_S = 5
function F:watch_upstream(leader)
    local up = self.box.upstream()
    if up == nil or up.status == 'follow' then
        self.upstream_since, self.upstream_problem = nil, nil
        return
    end
    local now = self.clock()
    self.upstream_since = self.upstream_since or now
    self.upstream_problem = string.format('replication from the leader %s for %.0f s%s', up.status,
        now - self.upstream_since, up.message and (': ' .. tostring(up.message)) or '')
    if up.status == 'stopped' and now >= (self.next_reconnect or 0) then
        self.next_reconnect = now + M.UPSTREAM_RETRY_S
        self.counters.reconnects = self.counters.reconnects + 1
        self.log.warn('failover: %s; reconnecting', self.upstream_problem)
        self.box.follow(nil)
        self.box.follow(leader.uri)
    end
end

function F:follow(leader)
    local mine = self.box.vclock()
    local rs = self.box.replicaset()
    local reason
    if leader.replicaset ~= nil and rs ~= nil and leader.replicaset ~= rs then
        reason = string.format('replica set %s, the leader is in %s', rs, leader.replicaset)
    else
        local id = ahead_of(mine, leader.vclock, leader.id)
        if id ~= nil then
            reason = string.format('has rows of instance %d up to lsn %d, leader %s was elected with %d',
                id, mine[id], leader.uuid, leader.vclock[id] or 0)
        end
    end
    if reason ~= nil then
        return self:diverge(reason)
    end
    if self.diverged ~= nil then
        self.log.info('failover: no longer diverged: leader %s has every row we have', leader.uuid)
        self.diverged = nil
    end
    if self.following ~= leader.uri then
        self.log.info('failover: following leader %s at %s (term %d)', leader.uuid, leader.uri, leader.term)
        self:set_following(leader.uri)
    else
        self:watch_upstream(leader)
    end
    if self.role ~= 'follower' then
        self.role = 'follower'
        self.next_publish = 0
    end
    self.term = leader.term
end

-- Live members other than us: {uuid -> {record, mod_revision}}.
function F:members()
    local list, err = self.etcd:range_prefix(self.keys.members)
    if list == nil then
        self:etcd_error('members', err)
        return nil
    end
    local out = {}
    for _, kv in ipairs(list) do
        local m = decode(kv.value)
        if m ~= nil and m.uuid ~= nil and m.uuid ~= self.uuid then
            m.mod_revision = kv.mod_revision
            out[m.uuid] = m
        end
    end
    return out
end

-- The key is free: publish, and take it if no live eligible member is ahead of us.
function F:elect()
    local me = self:publish()
    if me == nil or not me.eligible then
        return
    end
    local members = self:members()
    if members == nil then
        return
    end
    local patient = self.clock() - self.absent_since < self.election_wait
    local fresh = 1  -- us
    for _, m in pairs(members) do
        if m.eligible then
            if m.mod_revision <= self.absent_since_rev then
                -- Published before the key went away: its vclock may be stale. Wait for it,
                -- up to election_wait (a member that cannot publish then cannot lead either).
                if patient then
                    return
                end
            elseif better(m, me) then
                return
            else
                fresh = fresh + 1
            end
        end
    end
    -- A majority of the configured members must have spoken: an acknowledged
    -- (synchronous) write is on a majority, two majorities share a member, and
    -- we are not behind any member we heard from.
    if fresh < self.election_quorum then
        return
    end
    -- We are the best. Stop receiving, so the vclock in the key is final.
    if self.following ~= nil then
        self:set_following(nil)
    end
    local vclock = self.box.vclock()
    local value = {uuid = self.uuid, id = self.box.id(), uri = self.uri, vclock = vclock_to_json(vclock),
                   replicaset = self.box.replicaset()}
    local ok, rev = self.etcd:create(self.keys.leader, json.encode(value), self.lease_id)
    if ok == nil then
        self:etcd_error('take leader key', rev)
        return
    end
    if not ok then
        return  -- someone else was faster: the next step follows them
    end
    self.counters.elections_won = self.counters.elections_won + 1
    self.log.info('failover: won the election (term %d)', rev)
    return self:promote({uuid = self.uuid, id = value.id, uri = self.uri, term = rev, vclock = vclock,
                         lease = self.lease_id, replicaset = value.replicaset})
end

-- Until quorum - 1 live members replicate from us and have all we have, or timeout.
function F:wait_followers(timeout)
    local members = self:members() or {}
    local live = 0
    for _, m in pairs(members) do
        if m.reason == nil then  -- diverged or broken members do not replicate from us
            live = live + 1
        end
    end
    local need = math.min(self.quorum - 1, live)
    if need <= 0 then
        return true
    end
    local target = self.box.vclock()
    local until_t = self.clock() + timeout
    while true do
        local n = 0
        for _, d in ipairs(self.box.downstreams()) do
            if d.status == 'follow' and vclock_ge(d.vclock, target) then
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
-- key is rewritten (same lease, checked by revision) and its new revision is
-- the term.
function F:rebase(leader)
    local mine = self.box.vclock()
    if ahead_of(mine, leader.vclock, self.box.id()) == nil then
        return
    end
    local vc = {}
    for id, lsn in pairs(leader.vclock) do
        vc[id] = lsn
    end
    for id, lsn in pairs(mine) do
        if id ~= self.box.id() and lsn > (vc[id] or 0) then
            vc[id] = lsn
        end
    end
    local value = {uuid = self.uuid, id = self.box.id(), uri = self.uri, vclock = vclock_to_json(vc),
                   replicaset = self.box.replicaset()}
    local ok, rev = self.etcd:txn({{key = self.keys.leader, target = 'MOD', value = leader.term}},
        {require('smartcache.etcd').op_put(self.keys.leader, json.encode(value), self.lease_id)}, {})
    if not ok then
        error('the leader key changed during promotion: ' .. tostring(type(rev) == 'table' and rev.message or rev))
    end
    leader.vclock, leader.term = vc, rev
end

-- The key is ours: become writable, in this order.
function F:promote(leader)
    if self.promoting then
        return
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
        self.box.read_only(false)
        self.box.on_promote()
    end)
    self.promoting = false
    self.leader = leader
    self.term = leader.term
    if not ok then
        return self:step_down('promotion failed: ' .. tostring(err), {wal = is_wal_error(err)})
    end
    local deadline = self.lease_sent + self.lease_ttl - self.margin
    if self.lease_id ~= lease or self.clock() >= deadline then
        self.role = 'leader'  -- so that fence counts and logs it
        return self:fence('lease not proven after promotion')
    end
    self.deadline = deadline
    self.role = 'leader'
    self.fence_reason = nil
    self.counters.promotions = self.counters.promotions + 1
    self.log.info('failover: leader (term %d), writable for %.2f s unless renewed', self.term, self:lease_left())
    self:publish()
    -- Record the replica set if etcd does not (say, etcd was rebuilt): an empty
    -- instance then joins it instead of bootstrapping a new one.
    local rs = self.box.replicaset()
    if rs ~= nil and not self.replicaset_recorded then
        local created = self.etcd:create(self.keys.replicaset, rs)
        self.replicaset_recorded = created ~= nil
    end
end

function F:no_leader(rev)
    if self.role == 'leader' then
        self:fence('leader key gone')
    end
    self.leader = nil
    if self.absent_since_rev == nil then
        self.absent_since_rev, self.absent_since = rev, self.clock()
    end
    if self.role ~= 'diverged' then
        self.role = 'candidate'
    end
    return self:elect()
end

function F:control_step()
    self:check_disk()
    if self.lease_id == nil then
        if self.role == 'leader' then
            self:fence('no lease')
        end
        return
    end
    local kv, rev = self.etcd:get(self.keys.leader)
    if kv == nil then
        self:etcd_error('read leader key', rev)
        return
    end
    if kv == false then
        return self:no_leader(rev)
    end
    self.absent_since_rev, self.absent_since = nil, nil
    local v = decode(kv.value) or {}
    local leader = {uuid = v.uuid, id = v.id, uri = v.uri, vclock = v.vclock or {}, term = kv.mod_revision,
                    lease = kv.lease, replicaset = v.replicaset}
    if leader.uuid == self.uuid then
        if kv.lease ~= self.lease_id then
            -- Our key from an earlier life (a lease we no longer hold): free it now
            -- rather than wait out its TTL. Only this instance writes with our uuid.
            self.log.info('failover: removing the leader key of a previous run')
            local ok, err = self.etcd:delete_if(self.keys.leader, kv.mod_revision)
            if ok == nil then
                self:etcd_error('remove stale key', err)
            end
        elseif self.role ~= 'leader' and not self.handing_over then
            self:promote(leader)
        else
            self.leader, self.term = leader, leader.term
        end
    else
        if self.role == 'leader' or self.role == 'fenced' then
            self:fence('another leader: ' .. tostring(leader.uuid))
        end
        self.leader = leader
        self:follow(leader)
    end
    if self.clock() >= self.next_publish then
        self:publish()
    end
end

-- operator actions -----------------------------------------------------------------

-- Planned hand-over to candidate_uuid (nil: the most up-to-date eligible member).
-- Stops writing, waits until the candidate has every row, moves the key to the
-- candidate's lease in one transaction, and waits until the candidate reports
-- itself leader. Returns a result map; pause_ms is the measured write pause.
function F:switchover(candidate_uuid, timeout_s)
    if self.role ~= 'leader' or not self.writable() then
        return {status = 'NOT_LEADER', leader_uuid = self.leader and self.leader.uuid, role = self.role}
    end
    local members = self:members()
    if members == nil then
        return {status = 'ERROR', message = 'etcd unavailable: ' .. tostring(self.last_error)}
    end
    local cand
    if candidate_uuid ~= nil then
        cand = members[candidate_uuid]
        if cand == nil then
            return {status = 'NOT_FOUND', message = 'no live member ' .. tostring(candidate_uuid)}
        end
    else
        for _, m in pairs(members) do
            if m.eligible and (cand == nil or better(m, cand)) then
                cand = m
            end
        end
        if cand == nil then
            return {status = 'NOT_FOUND', message = 'no live eligible member'}
        end
    end
    if not cand.eligible or cand.lease == nil then
        return {status = 'BAD_REQUEST', message = 'member is not eligible: ' .. tostring(cand.reason)}
    end
    self.handing_over = true
    local ok, res = pcall(self.hand_over, self, cand, timeout_s)
    self.handing_over = false
    if not ok then
        self.log.error('failover: switchover failed: %s', tostring(res))
        return {status = 'ERROR', message = tostring(res)}
    end
    return res
end

function F:hand_over(cand, timeout_s)
    local t0 = self.clock()
    local until_t = t0 + timeout_s
    local term = self.term
    -- 1. Stop writing, then let every write already submitted reach the WAL
    -- (and its quorum): a write of our own queues behind them.
    self.deadline = 0
    self.role = 'fenced'
    self.fence_reason = 'switchover'
    local barrier_ok, barrier_err = self.box.quiesce()
    local target = self.box.vclock()
    local function resume(status, message)
        -- Still ours and the lease still proven: take writes again.
        local d = self.lease_sent + self.lease_ttl - self.margin
        if self.lease_id ~= nil and self.clock() < d and barrier_ok then
            self.box.read_only(false)
            self.deadline = d
            self.role = 'leader'
            self.fence_reason = nil
        end
        return {status = status, message = message, pause_ms = math.floor((self.clock() - t0) * 1000),
                candidate_uuid = cand.uuid}
    end
    if not barrier_ok then
        self:step_down('WAL write failed during switchover: ' .. tostring(barrier_err), {wal = true})
        return {status = 'ERROR', message = 'WAL write failed: ' .. tostring(barrier_err)}
    end
    -- 2. The candidate catches up, with everything we have: rows that come
    -- after the sample (a late CONFIRM) move the target.
    while true do
        local caught = false
        for _, d in ipairs(self.box.downstreams()) do
            if d.uuid == cand.uuid and d.status == 'follow' and vclock_ge(d.vclock, target) then
                caught = true
            end
        end
        if caught then
            local now_vc = self.box.vclock()
            if vclock_ge(target, now_vc) then
                break
            end
            target = now_vc
        end
        if self.clock() >= until_t then
            return resume('TIMEOUT', 'the candidate did not catch up')
        end
        self.sleep(0.005)
    end
    local caught_up_ms = math.floor((self.clock() - t0) * 1000)
    -- 3. The key moves to the candidate's lease, if it is still ours.
    local value = {uuid = cand.uuid, id = cand.id, uri = cand.uri, vclock = vclock_to_json(target),
                   replicaset = self.box.replicaset()}
    local ok, rev = self.etcd:txn({{key = self.keys.leader, target = 'MOD', value = term}},
        {require('smartcache.etcd').op_put(self.keys.leader, json.encode(value), cand.lease)}, {})
    if ok == nil then
        -- The outcome is unknown: the key may have moved. Stay fenced; the control
        -- step promotes us again if the key is still ours.
        return {status = 'ERROR', message = 'etcd unavailable: ' .. tostring(rev and rev.message),
                candidate_uuid = cand.uuid}
    end
    if not ok then
        self.role = 'candidate'
        return {status = 'ERROR', message = 'the leader key changed under us', candidate_uuid = cand.uuid}
    end
    self.counters.switchovers = self.counters.switchovers + 1
    self.role = 'follower'
    self.term = rev
    self.leader = {uuid = cand.uuid, id = cand.id, uri = cand.uri, term = rev, vclock = target,
                   lease = cand.lease, replicaset = value.replicaset}
    self:set_following(cand.uri)
    self.next_publish = 0
    self.log.info('failover: handed the leader key to %s (term %d)', cand.uuid, rev)
    -- 4. Wait until the candidate says it leads (it polls the key).
    while self.clock() < until_t do
        local kv = self.etcd:get(self.keys.members .. cand.uuid)
        local m = kv and decode(kv.value)
        if m ~= nil and m.role == 'leader' and (tonumber(m.term) or 0) >= rev then
            return {status = 'OK', pause_ms = math.floor((self.clock() - t0) * 1000), caught_up_ms = caught_up_ms,
                    candidate_uuid = cand.uuid, term = m.term}
        end
        self.sleep(0.01)
    end
    return {status = 'TIMEOUT', message = 'key handed over; the candidate has not reported leading yet',
            pause_ms = math.floor((self.clock() - t0) * 1000), candidate_uuid = cand.uuid, term = rev}
end

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
function F:bounded_drain(timeout_s)
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

-- A replica's join, asked of the leader by the joining instance before it
-- joins. Tarantool 2.6.0 cannot take a CONFIRM or ROLLBACK row in the final
-- stage of a join (tarantool#5566, fixed later: the joining instance dies with
-- "Unknown request type 40"), and under synchronous load such rows are there.
-- So: stop writing, let every pending synchronous write get its CONFIRM (a
-- write of our own queues behind them), stay writable for Tarantool itself (it
-- registers the replica in _cluster), and take writes again once the joining
-- instance is registered or follows us, or after timeout_s. Writes meanwhile
-- answer NOT_LEADER, as during a switchover; the service retries them.
function F:hold_for_join(uuid, timeout_s)
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
    self.handing_over = true  -- the control step must not promote us again meanwhile
    self.deadline = 0
    self.role = 'fenced'
    self.fence_reason = 'join of ' .. tostring(uuid)
    self.box.forget_joined(uuid)
    local ok, err = self:bounded_drain(self.join_drain_timeout_s or join_drain_timeout_s())
    if not ok and is_sync_rollback(err) then
        -- The synchronous writes in flight were rolled back for want of a quorum (at a
        -- cluster's first start no follower is in yet): the limbo is empty, all a join
        -- needs. (Stepping down here kept the first followers out: each retry of their
        -- join met the next doomed write.)
        self.log.info('failover: writes in flight before the join of %s rolled back (%s)', uuid, tostring(err))
        ok = true
    end
    if not ok then
        self.handing_over = false
        local wal = is_wal_error(err)
        self:step_down((wal and 'WAL write failed' or 'drain failed') .. ' before a join: ' .. tostring(err),
            {wal = wal})
        return {status = 'ERROR', message = 'drain before the join failed: ' .. tostring(err)}
    end
    self.join_hold = {uuids = {[uuid] = true}, started = t0, ['until'] = t0 + timeout_s}
    self.counters.join_holds = self.counters.join_holds + 1
    self.log.info('failover: writes held for the join of %s (drained in %d ms)', uuid,
        math.floor((self.clock() - t0) * 1000))
    return {status = 'OK', drain_ms = math.floor((self.clock() - t0) * 1000)}
end

-- Every guard tick while a join hold lasts: release it once each joiner is in.
function F:join_hold_step()
    local hold = self.join_hold
    if hold == nil then
        return
    end
    local waiting = false
    for uuid in pairs(hold.uuids) do
        if not self.box.joined(uuid) then
            waiting = true
        end
    end
    local now = self.clock()
    if waiting and now < hold['until'] then
        return
    end
    self.join_hold = nil
    self.handing_over = false
    local held_ms = math.floor((now - hold.started) * 1000)
    local d = self.lease_sent + self.lease_ttl - self.margin
    if self.role == 'fenced' and self.lease_id ~= nil and now < d then
        self.deadline = d
        self.role = 'leader'
        self.fence_reason = nil
    end
    if waiting then
        self.log.warn('failover: join hold released after %d ms without the joiner in (timeout)', held_ms)
    else
        self.log.info('failover: join hold released after %d ms: the joiner is registered', held_ms)
    end
    self.last_join_hold_ms = held_ms
end

-- What role() and /health report. Absent values are box.NULL, so every key is always there.
function F:status()
    local leader = self.leader or {}
    local null = box.NULL
    return {
        role = self.role, writable = self.writable(), term = self.term,
        lease_left_ms = math.floor(self:lease_left() * 1000),
        leader_uuid = leader.uuid or null, leader_uri = leader.uri or null,
        instance_uuid = self.uuid, uri = self.uri,
        fenced = self.role == 'fenced', fence_reason = self.fence_reason or null,
        diverged = self.diverged or null, wal_broken = self.wal_broken or null,
        eligible = self:eligible(), lease_id = self.lease_id or null, etcd_error = self.last_error or null,
        quorum = self.effective_quorum or self.quorum,
        upstream_problem = self.upstream_problem or null,
        upstream_broken_s = self.upstream_since and (self.clock() - self.upstream_since) or null,
        counters = self.counters,
    }
end

-- fibers ---------------------------------------------------------------------------

local function loop(name, self, step, pause)
    fiber.name(name)
    while not self.stopped do
        local ok, err = pcall(step, self)
        if not ok then
            self.log.error('%s: %s', name, tostring(err))
        end
        if self.stopped then
            break
        end
        self.sleep(pause(self))
    end
end

function F:start()
    self.stopped = false
    self.fibers = {
        fiber.create(loop, 'failover_lease', self, F.lease_step, function(s)
            if s.lease_id == nil then
                return s.poll
            end
            return math.max(0.01, math.min(s.poll, s.next_keepalive - s.clock()))
        end),
        fiber.create(loop, 'failover_guard', self, function(s)
            s:guard_step()
            s:quorum_step()
            s:join_hold_step()
        end, function(s)
            if s.join_hold ~= nil then
                return 0.01
            end
            if s.role == 'leader' then
                return math.max(0.001, math.min(0.05, s.deadline - s.clock()))
            end
            return 0.05
        end),
        fiber.create(loop, 'failover_control', self, F.control_step, function(s)
            return s.poll
        end),
    }
    return self
end

function F:stop()
    self.stopped = true
end

-- the real box -----------------------------------------------------------------------

-- opts: user, password (the replication user), on_promote (admin writes of a new leader).
function M.box_adapter(opts)
    local stats = require('smartcache.stats')
    local fio = require('fio')
    -- A write of our own that queues behind every pending one; synchronous when
    -- synchronous writes are in flight (on 2.6.0 an asynchronous one must not
    -- enter the limbo: smartcache.quorum, GUARDED).
    local function probe()
        box.atomic(function()
            box.space.sc_meta:replace({'failover_probe', fiber.time()})
            require('smartcache.quorum').join()
        end)
    end
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
    -- Has the WAL's filesystem room, and does it take a write? Asked of the
    -- disk directly, not through the WAL: a write's ER_WAL_IO does not say
    -- which (on 2.6.0 an asynchronous write stuck in the limbo fails the writes
    -- behind it with it too: smartcache.quorum).
    local function disk_check()
        local runtime = require('smartcache.runtime')
        local free, min_free = runtime.disk_free(box.cfg.wal_dir)
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
            return false, 'WAL disk does not take a write: ' .. tostring(werr or require('errno').strerror())
        end
        return true
    end
    return {
        uuid = function() return box.info.uuid end,
        id = function() return box.info.id end,
        vclock = function() return clean_vclock(box.info.vclock) end,
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
                                       vclock = clean_vclock(r.downstream.vclock)})
                end
            end
            return out
        end,
        -- 2.6.0 waits 2 x replication_synchro_timeout for someone else first;
        -- nobody else will, so that wait is made 1 ms (see the module comment).
        clear_synchro_queue = function()
            local timeout = box.cfg.replication_synchro_timeout
            box.cfg({replication_synchro_timeout = 0.001})
            local ok, err = pcall(box.ctl.clear_synchro_queue)
            box.cfg({replication_synchro_timeout = timeout})
            if not ok then
                error(err)
            end
        end,
        set_quorum = function(q)
            box.cfg({replication_synchro_quorum = q})
        end,
        -- A synchronous transaction of ours has not ended (smartcache.quorum counts them).
        limbo_busy = function()
            return require('smartcache.quorum').inflight > 0
        end,
        on_promote = opts.on_promote or function() end,
        wal_errors = function() return stats.wal_errors end,
        disk_check = disk_check,
        -- Writes queue in the WAL in order (and async ones behind pending sync
        -- ones), so once our own write returns, every write submitted before it
        -- is in the WAL. Expiry holds still meanwhile, then the box turns read-only.
        -- Our one upstream (a follower replicates from the leader only): {status, message} or nil.
        upstream = function()
            for _, r in pairs(box.info.replication) do
                if r.upstream ~= nil then
                    return {status = r.upstream.status, message = r.upstream.message}
                end
            end
            return nil
        end,
        -- Like quiesce, but the box stays writable (a join registers the replica).
        drain = function()
            local expiry = require('smartcache.expiry')
            local paused = expiry.paused
            expiry.paused = true
            local ok, err = pcall(probe)
            expiry.paused = paused
            return ok, err
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
        quiesce = function()
            local expiry = require('smartcache.expiry')
            local paused = expiry.paused
            expiry.paused = true
            local ok, err = pcall(probe)
            pcall(box.cfg, {read_only = true})
            expiry.paused = paused
            return ok, err
        end,
    }
end

-- the module's instance (HA mode) ------------------------------------------------------

M.instance = nil

-- One cheap check for write procedures; util.writable is this in HA mode.
function M.writable()
    local inst = M.instance
    if inst == nil then
        return box.info.ro == false
    end
    return inst.writable()
end

-- Environment -> settings; nil when SC_ETCD is unset (no HA: a standalone or
-- legacy master/replica instance).
function M.settings_from_env(util)
    local etcd = util.env_string('SC_ETCD', '')
    if etcd == '' then
        return nil
    end
    local endpoints = {}
    for e in etcd:gmatch('[^,%s]+') do
        if not e:find('://', 1, true) then
            e = 'http://' .. e
        end
        table.insert(endpoints, e)
    end
    local ttl = util.env_number('SC_LEADER_TTL_S', 5)
    local size = util.env_number('SC_CLUSTER_SIZE', 3)
    return {
        endpoints = endpoints,
        cluster = util.env_string('SC_CLUSTER', 'smartcache'),
        ttl = ttl,
        margin = util.env_number('SC_LEASE_MARGIN_MS', math.max(500, ttl * 200)) / 1000,
        poll = util.env_number('SC_FAILOVER_POLL_MS', 200) / 1000,
        etcd_timeout = util.env_number('SC_ETCD_TIMEOUT_MS', math.min(1000, ttl * 1000 / 3)) / 1000,
        size = size,
        quorum = util.env_number('SC_SYNC_QUORUM', math.floor(size / 2) + 1),
        election_quorum = math.floor(size / 2) + 1,
        candidate = util.env_string('SC_CANDIDATE', 'true') ~= 'false',
    }
end

-- Install inst as this process's failover: util.writable becomes its lease check.
function M.install(inst, util)
    M.instance = inst
    if util ~= nil then
        util.writable = inst.writable
    end
    return inst
end

-- Procedures (registered in api.lua) ------------------------------------------------

-- sc.role(): what the service asks every instance every <= 500 ms.
function M.role()
    local stats = require('smartcache.stats')
    local inst = M.instance
    local out
    if inst == nil then
        local null = box.NULL
        local writable = box.info.ro == false
        out = {role = 'standalone', writable = writable, term = 0, lease_left_ms = 0,
               instance_uuid = box.info.uuid, uri = box.cfg.listen,
               leader_uuid = writable and box.info.uuid or null, leader_uri = writable and box.cfg.listen or null,
               fenced = false, fence_reason = null, diverged = null, wal_broken = null, eligible = false,
               lease_id = null, etcd_error = null, quorum = box.cfg.replication_synchro_quorum,
               upstream_problem = null, upstream_broken_s = null}
    else
        out = inst:status()
        out.counters = nil
    end
    out.status = 'OK'
    out.vclock = setmetatable(clean_vclock(box.info.vclock), {__serialize = 'map'})
    out.read_only = box.info.ro
    out.time_ms = math.floor(fiber.time() * 1000)  -- the service measures its clock offset from this
    out.sync_queue_len = box.NULL  -- Tarantool 2.6.0 does not expose it (box.info.synchro came in 2.8)
    out.replication = stats.replication()
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
function M.switchover(candidate_uuid, timeout_ms)
    local inst = M.instance
    if inst == nil then
        return {status = 'BAD_REQUEST', message = 'failover is not configured (SC_ETCD)'}
    end
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
end

-- sc.join_hold(instance_uuid, timeout_ms?), on the leader, by an instance
-- about to join it (as the replication user): see F:hold_for_join.
function M.join_hold(instance_uuid, timeout_ms)
    local inst = M.instance
    if inst == nil then
        return {status = 'BAD_REQUEST', message = 'failover is not configured (SC_ETCD)'}
    end
    if type(instance_uuid) ~= 'string' or #instance_uuid ~= 36 then
        return {status = 'BAD_REQUEST', message = 'instance_uuid must be a uuid string'}
    end
    local timeout_s, bad = timeout_s_of(timeout_ms, 10000)
    if timeout_s == nil then
        return bad
    end
    return inst:hold_for_join(instance_uuid, timeout_s)
end

-- sc.rejoin(instance_uuid, force?), on the instance to rebuild: leaves a marker
-- in its data dir and exits with REJOIN_EXIT_CODE; at the next start init.lua
-- moves the files aside and joins the leader empty.
function M.rejoin(instance_uuid, force)
    local inst = M.instance
    if inst == nil then
        return {status = 'BAD_REQUEST', message = 'failover is not configured (SC_ETCD)'}
    end
    if instance_uuid ~= box.info.uuid then
        return {status = 'BAD_REQUEST', message = 'this is instance ' .. box.info.uuid}
    end
    if inst.role == 'leader' or inst.role == 'fenced' or inst.writable() then
        return {status = 'BAD_REQUEST', message = 'the leader cannot rejoin: switch over first'}
    end
    if inst.diverged == nil and force ~= true then
        return {status = 'BAD_REQUEST', message = 'not diverged; force = true rebuilds it anyway'}
    end
    local fio = require('fio')
    local marker = fio.pathjoin(inst.data_dir, M.REJOIN_MARKER)
    local fh = fio.open(marker, {'O_WRONLY', 'O_CREAT', 'O_TRUNC'}, tonumber('644', 8))
    if fh == nil then
        return {status = 'ERROR', message = 'cannot write ' .. marker}
    end
    fh:write(json.encode({at = os.time(), reason = inst.diverged or 'forced', uuid = inst.uuid}))
    fh:close()
    inst.log.warn('failover: rejoin requested (%s): exiting with code %d to be restarted empty',
        inst.diverged or 'forced', M.REJOIN_EXIT_CODE)
    fiber.create(function()
        fiber.name('rejoin_exit')
        fiber.sleep(0.2)  -- let the answer go out
        os.exit(M.REJOIN_EXIT_CODE)
    end)
    return {status = 'OK', instance_uuid = inst.uuid, data_dir = inst.data_dir, marker = marker,
            exit_code = M.REJOIN_EXIT_CODE}
end

return M
