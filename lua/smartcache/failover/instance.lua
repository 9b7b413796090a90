-- One instance's failover state and its three fibers. The state machine's
-- steps live in the concept modules next to this one, mixed into the class
-- below; each step returns the decision it took as a short sentence (as
-- Patroni's _run_cycle does), and status() shows the last one of each loop:
--   lease    grant / keep alive the lease; fence when it is lost  (lease.lua)
--   guard    fence once the deadline passes (lease.lua); set the synchronous
--            quorum (sync_quorum.lua); end a join hold (join_hold.lua)
--   control  read the leader key; follow, elect, promote (control.lua, election.lua,
--            watch.lua); publish our member record (here)
-- Each step runs alone against an injected clock, etcd client and box adapter
-- (tests/lua/failover_test.lua).
local clock = require('clock')
local fiber = require('fiber')
local log = require('log')
local json = require('json')
local vclock = require('smartcache.failover.vclock')
local lease = require('smartcache.failover.lease')
local election = require('smartcache.failover.election')
local control = require('smartcache.failover.control')
local watch = require('smartcache.failover.watch')
local sync_quorum = require('smartcache.failover.sync_quorum')
local switchover = require('smartcache.failover.switchover')
local join_hold = require('smartcache.failover.join_hold')
local terms = require('smartcache.failover.terms')
local rejoin = require('smartcache.failover.rejoin')
local topology = require('smartcache.failover.topology')
local membership = require('smartcache.failover.membership')

local M = {}

M.ROLES = {'leader', 'follower', 'candidate', 'fenced', 'diverged', 'unregistered', 'starting', 'standalone'}

local F = {}
F.__index = F

-- opts:
--   etcd         smartcache.etcd client (or a fake)
--   box          adapter (smartcache.failover.box_adapter for the real one): uuid(), id(), vclock(),
--                replicaset(), read_only(bool), follow(uri|nil), downstreams() -> {{uuid, status, vclock}},
--                clear_synchro_queue(), set_quorum(n), on_promote(), wal_errors() -> counter,
--                disk_check() -> ok, why (the WAL's disk has room and takes a write),
--                quiesce() -> ok, err (read-only once every submitted write is in the WAL)
--   cluster, uri, ttl (s), margin (s), poll (s), quorum (synchronous), election_quorum
--   (a majority of the configured members), candidate (bool), data_dir
--   cluster_size  SC_CLUSTER_SIZE: the members a first topology needs live (membership.lua)
--   quorum_min   SC_SYNC_QUORUM when set explicitly: the quorum's floor never goes below it (topology.lua)
--   http_port    our operator HTTP port (published; a first topology takes it from there)
--   store        where the terms are kept durably: load() -> table, save(table) -> ok, err
--                (default: smartcache.failover.terms.file_store(data_dir))
--   auto_rejoin  a DIVERGED instance that can prove its extra rows were never acknowledged
--                rebuilds itself (default true; SC_AUTO_REJOIN)
--   request_rejoin  function(reason) -> marker or nil, err (default: rejoin.request in data_dir)
--   slow_follower  (s) a follower that has not acknowledged our rows of this long ago no
--                longer counts in the synchronous quorum (default 0.5; SC_SLOW_FOLLOWER_MS)
--   set_aside    what init.lua set aside at this start ({dir, moved, removed}) or nil
--   lease        {id, ttl, sent}: a lease granted already (init.lua's bootstrap)
--   following    the uri replication points at already (init.lua's join)
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
    self.cluster_size = opts.cluster_size or self.election_quorum
    self.quorum_min = opts.quorum_min
    self.http_port = opts.http_port
    self.effective_quorum = nil  -- what box.cfg.replication_synchro_quorum is set to by quorum_step
    self.candidate_allowed = opts.candidate ~= false
    self.promote_wait = opts.promote_wait or math.min(2, self.ttl / 2)
    self.election_wait = opts.election_wait or self.ttl
    self.data_dir = opts.data_dir
    self.store = opts.store or (opts.data_dir and terms.file_store(opts.data_dir)) or terms.memory_store()
    self.auto_rejoin = opts.auto_rejoin ~= false
    self.request_rejoin = opts.request_rejoin or function(reason)
        return rejoin.request(self.data_dir, reason, self.uuid, self.log)
    end
    self.slow_follower = opts.slow_follower or 0.5
    self.lsn_history = {}      -- our own LSN over the last slow_follower seconds (sync_quorum.lua)
    self.clock = opts.clock or clock.monotonic
    self.sleep = opts.sleep or fiber.sleep
    self.log = opts.log or log
    local prefix = string.format('/smartcache/%s/', self.cluster)
    self.keys = {prefix = prefix, leader = prefix .. 'leader', members = prefix .. 'members/',
                 replicaset = prefix .. 'replicaset', topology = prefix .. topology.KEY}

    self.role = 'candidate'
    self.deadline = 0          -- monotonic s: writes allowed while clock() < deadline
    self.term = 0              -- the term led or followed (the leader key's explicit term)
    self.leader = nil          -- {uuid, id, uri, term, rev, vclock, lease, replicaset}
    self.dcs_regressed = nil   -- why we last saw the DCS go back (reason), until a leader is elected again
    self.dcs_hold_until = 0    -- no election before this (monotonic s)
    self.vclock_final = false  -- we stopped replicating for this election and our vclock settled
    self.lease_id = nil
    self.lease_ttl = 0
    self.lease_sent = 0        -- send time of the last successful grant/keepalive
    self.next_keepalive = 0
    self.next_publish = 0
    self.following = opts.following
    self.absent_since_rev = nil
    self.absent_since = nil
    self.diverged = nil        -- reason, while diverged
    self.wal_broken = nil      -- reason, after a WAL failure made us step down
    self.wal_errors_seen = self.box.wal_errors()
    self.next_disk_check = 0
    -- Our operations that hold writes while the key stays ours (writes_held): the control
    -- step must not promote us meanwhile.
    self.switching_over = false  -- a switchover is handing the key over
    self.raising_quorum = false  -- the quorum waits for the limbo to drain before it goes up
    self.join_draining = nil     -- the joiner whose hold drains the limbo
    self.join_hold = nil         -- a join hold in force: {uuids, started, until, reason}
    self.promoting = false
    -- topology.lua: what etcd's topology says (nil: no topology), where we stand in it, and
    -- the uri of every member uuid we have read a record of (the leader's quorum needs it).
    self.topology = nil
    self.topology_rev = 0      -- the topology key's mod_revision as last read (0: absent)
    self.registration = nil    -- 'member', 'leaving', 'absent'; nil without a topology
    self.topology_problem = nil
    self.uris = {}
    self.uris_stale = false
    self.uris_read_at = nil
    self.last_error = nil
    self.decisions = {}        -- loop name -> the last decision of its step
    self.counters = {elections_won = 0, promotions = 0, fences = 0, step_downs = 0, etcd_errors = 0,
                     divergences = 0, switchovers = 0, join_holds = 0, quorum_raises = 0,
                     reconnects = 0, dcs_regressions = 0, auto_rejoins = 0, conflict_rebuilds = 0, quorum_lowerings = 0,
                     set_asides = opts.set_aside and 1 or 0, set_asides_removed = opts.set_aside and
                     opts.set_aside.removed or 0}
    self.keys.member = self.keys.members .. self.box.uuid()
    self.uuid = self.box.uuid()
    self:load_terms()
    self.topology = self.known_topology  -- until etcd is read: the newest we saw, durably
    self.registration = topology.registration(self.topology, self.uri)
    if opts.lease ~= nil then
        self.lease_id, self.lease_ttl, self.lease_sent = opts.lease.id, opts.lease.ttl, opts.lease.sent
        self.next_keepalive = opts.lease.sent + self.keepalive_interval
    end
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

function F:eligible()
    return self.candidate_allowed and self.diverged == nil and self.wal_broken == nil and self:registered()
        and self:topology_eligible()
end

-- The operation of ours that holds writes now ('switchover', 'quorum raise',
-- 'join hold'), or nil.
function F:writes_held()
    if self.switching_over then
        return 'switchover'
    elseif self.raising_quorum then
        return 'quorum raise'
    elseif self.join_draining ~= nil or self.join_hold ~= nil then
        return 'join hold'
    end
    return nil
end

function F:record()
    return {uuid = self.uuid, id = self.box.id(), uri = self.uri, vclock = vclock.to_json(self.box.vclock()),
            role = self.role, term = self.term, eligible = self:eligible(), lease = self.lease_id,
            replicaset = self.box.replicaset(),
            reason = self.diverged or self.wal_broken or self:unregistered_reason(),
            -- terms.lua: the highest term seen (and its leader), the election's first key
            seen_term = self.max_term, seen_term_leader = self.max_term_leader, data_term = self.data_term,
            -- election.lua: we replicate from nobody and our vclock settled; we hold elections
            final = self.vclock_final, dcs_hold = self:dcs_hold_left() > 0,
            -- topology.lua: where we stand and which version we act on; our HTTP port and
            -- SC_CANDIDATE (what a first topology is made of: membership.lua)
            registered = self.registration, topology_version = self.topology and self.topology.version,
            http_port = self.http_port, candidate = self.candidate_allowed}
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
    if self:see_rev(rev, 'publish') ~= nil then
        return nil  -- the DCS went back: nothing it holds counts until it is read again
    end
    self.next_publish = self.clock() + self.keepalive_interval
    rec.vclock = vclock.clean(rec.vclock)
    return rec, rev
end

-- Live members other than us: {uuid -> {record, mod_revision}}.
function F:members()
    local list, rev = self.etcd:range_prefix(self.keys.members)
    if list == nil then
        self:etcd_error('members', rev)
        return nil
    end
    if self:see_rev(rev, 'members') ~= nil then
        return nil
    end
    self.uris_stale = false
    local out = {}
    for _, kv in ipairs(list) do
        local m = vclock.decode(kv.value)
        if m ~= nil and m.uuid ~= nil and m.uuid ~= self.uuid then
            m.mod_revision = kv.mod_revision
            out[m.uuid] = m
            if type(m.uri) == 'string' then
                self.uris[m.uuid] = m.uri  -- kept after the record goes (sync_quorum.lua)
            end
        end
    end
    return out
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
        -- Terms and the DCS (terms.lua): the highest term seen, durably, and its leader; the
        -- highest etcd revision seen; why the DCS was last seen going back, and how long
        -- elections are still held for it; the term of the newest leader whose rows we have.
        max_term = self.max_term, max_term_leader = self.max_term_leader or null,
        etcd_revision = self.max_rev, data_term = self.data_term,
        dcs_regressed = self.dcs_regressed or null,
        dcs_hold_left_ms = math.floor(self:dcs_hold_left() * 1000),
        -- rejoin.lua: SC_AUTO_REJOIN, and why a DIVERGED instance does not rebuild itself.
        auto_rejoin = self.auto_rejoin, rejoin_refused = self.rejoin_refused or null,
        -- sync_quorum.lua: attached followers that stopped acknowledging (not in the quorum).
        slow_followers = setmetatable(self.slow_followers or {}, {__serialize = 'seq'}),
        -- topology.lua: the topology we act on (version, members), where we stand in it, what is
        -- wrong with etcd's copy, the majority an election needs, and the followers that
        -- acknowledge without being members (they add to the quorum instead of counting in it).
        topology_version = self.topology and self.topology.version or null,
        topology_members = self.topology and #self.topology.members or null,
        registered = self.registration or null, topology_problem = self.topology_problem or null,
        majority = self:election_majority(),
        unregistered_followers = setmetatable(self.unregistered_followers or {}, {__serialize = 'seq'}),
        -- The last decision of each loop's step (null until it ran).
        decisions = setmetatable({lease = self.decisions.lease or null, guard = self.decisions.guard or null,
                                  control = self.decisions.control or null}, {__serialize = 'map'}),
        counters = self.counters,
    }
end

-- The concept modules' methods, each name defined once (here or there).
for _, concept in ipairs({lease, control, election, watch, sync_quorum, switchover, join_hold, terms, rejoin, topology,
                          membership}) do
    for method, fn in pairs(concept.methods) do
        assert(F[method] == nil, 'failover: two modules define ' .. method)
        F[method] = fn
    end
end

------------------------------------------------------------------------

-- The guard loop runs three steps: its decision is what any of them did, or the guard's.
local function guard_tick(s)
    local said = {}
    local guard = s:guard_step()
    for _, d in ipairs({guard, s:quorum_step(), s:join_hold_step()}) do
        if d:sub(1, 9) ~= 'no action' then
            table.insert(said, d)
        end
    end
    return #said > 0 and table.concat(said, '; ') or guard
end

-- name -> {fiber name, the step, the pause after it}.
local LOOPS = {
    lease = {'failover_lease', F.lease_step, function(s)
        if s.lease_id == nil then
            return s.poll
        end
        return math.max(0.01, math.min(s.poll, s.next_keepalive - s.clock()))
    end},
    guard = {'failover_guard', guard_tick, function(s)
        if s.join_hold ~= nil then
            return 0.01
        end
        if s.role == 'leader' then
            return math.max(0.001, math.min(0.05, s.deadline - s.clock()))
        end
        return 0.05
    end},
    control = {'failover_control', F.control_step, function(s)
        return s.poll
    end},
}

-- One run of a loop's step; its decision is kept for status() and returned.
function F:tick(loop)
    local fiber_name, step = LOOPS[loop][1], LOOPS[loop][2]
    local ok, decision = pcall(step, self)
    if not ok then
        self.log.error('%s: %s', fiber_name, tostring(decision))
        decision = 'error: ' .. tostring(decision)
    end
    self.decisions[loop] = decision
    return decision
end

local function run(self, loop)
    fiber.name(LOOPS[loop][1])
    local pause = LOOPS[loop][3]
    while not self.stopped do
        self:tick(loop)
        if self.stopped then
            break
        end
        self.sleep(pause(self))
    end
end

function F:start()
    self.stopped = false
    self.fibers = {}
    for _, loop in ipairs({'lease', 'guard', 'control'}) do
        table.insert(self.fibers, fiber.create(run, self, loop))
    end
    return self
end

function F:stop()
    self.stopped = true
end

return M
