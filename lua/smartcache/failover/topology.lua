-- The members of a cluster as data in etcd: /smartcache/<cluster>/topology
-- holds {version, members = [{address, http_port, eligible, leaving}]}, changed
-- only by compare-and-swap on its mod_revision (smartcache.failover.membership),
-- read by every instance in the same request as the leader key.
--
-- With a topology, membership is that list, not configuration:
--   * the election majority and the synchronous quorum's floor are a majority of
--     the members listed (eligible or not: every member acknowledges writes, so an
--     election majority must meet every write quorum; a leaving member still
--     counts until it is gone);
--   * an instance whose address (SC_ADVERTISE) is absent, or marked leaving, is
--     `unregistered`: it replicates from nobody, is read-only, never a candidate
--     (its acknowledgements would count in Tarantool's quorum while it cannot win
--     an election, and the others need not have what it acknowledged);
--   * the leader counts, on top of that floor, every follower that acknowledges
--     but is not a member it knows of (an instance that has not seen its removal
--     yet, one cut off from etcd, one whose record it has not read): such
--     acknowledgements never stand in for a member's.
-- Without the key everything is as before it existed: SC_CLUSTER_SIZE makes the
-- majority and every instance counts. docs/storage-failover.md (Topology) has
-- the safety argument for each step.
--
-- A DCS that forgets or goes back: each instance keeps the newest topology it
-- saw durably (the terms file, smartcache.failover.terms); when etcd has none or
-- an older version, it acts on the one it knows, says so (`topology_problem`),
-- and the leader writes it back.
local json = require('json')
local etcd = require('smartcache.etcd')

local M = {}
local methods = {}
M.methods = methods  -- mixed into the instance (smartcache.failover.instance)

M.KEY = 'topology'
-- The leader rewrites a topology etcd lost at most this often (s).
M.REPAIR_INTERVAL_S = 1

function M.majority(n)
    return math.floor(n / 2) + 1
end

local function by_address(a, b)
    return a.address < b.address
end

-- host:port, IPv6 as [addr]:port; a port 1..65535, no spaces or commas.
function M.valid_address(address)
    if type(address) ~= 'string' or address:find('[%s,]') then
        return false
    end
    local port = tonumber(address:match('^[^:]+:(%d+)$') or address:match('^%[[%x:]+%]:(%d+)$'))
    return port ~= nil and port >= 1 and port <= 65535
end

-- A topology from a decoded document (etcd's value, or the terms file's copy); nil, why when it is not one.
function M.normalize(doc)
    if type(doc) ~= 'table' or type(doc.members) ~= 'table' then
        return nil, 'no members list'
    end
    local out = {version = tonumber(doc.version) or 0, members = {}}
    local seen = {}
    for _, m in ipairs(doc.members) do
        if type(m) ~= 'table' or not M.valid_address(m.address) then
            return nil, 'a member without a valid address'
        end
        if seen[m.address] then
            return nil, 'member ' .. m.address .. ' listed twice'
        end
        seen[m.address] = true
        table.insert(out.members, {address = m.address, http_port = tonumber(m.http_port),
                                   eligible = m.eligible ~= false, leaving = m.leaving == true})
    end
    if #out.members == 0 then
        return nil, 'no members'
    end
    table.sort(out.members, by_address)
    return out
end

function M.decode(value)
    local ok, doc = pcall(json.decode, value)
    if not ok then
        return nil, 'not JSON'
    end
    return M.normalize(doc)
end

-- As stored: members sorted by address, every field present (http_port null when unknown).
function M.encode(t)
    local members = setmetatable({}, {__serialize = 'seq'})
    local list = {}
    for _, m in ipairs(t.members) do
        table.insert(list, m)
    end
    table.sort(list, by_address)
    for _, m in ipairs(list) do
        table.insert(members, {address = m.address, http_port = m.http_port or box.NULL, eligible = m.eligible ~= false,
                               leaving = m.leaving == true})
    end
    return json.encode({version = t.version, members = members})
end

function M.copy(t)
    return M.decode(M.encode(t))
end

function M.find(t, address)
    for i, m in ipairs(t and t.members or {}) do
        if m.address == address then
            return m, i
        end
    end
    return nil
end

-- Where address stands in t: 'member', 'leaving' or 'absent'; nil without a topology.
function M.registration(t, address)
    if t == nil then
        return nil
    end
    local m = M.find(t, address)
    if m == nil then
        return 'absent'
    end
    return m.leaving and 'leaving' or 'member'
end

function M.addresses(t)
    local out = {}
    for _, m in ipairs(t.members) do
        table.insert(out, m.address .. (m.leaving and ' (leaving)' or ''))
    end
    return table.concat(out, ', ')
end

------------------------------------------------------------------------
-- The instance's view.

-- The topology key as read this control step (kv; false: absent; nil: not read).
function methods:see_topology(kv)
    if kv == nil then
        return
    end
    local known = self.known_topology
    local use, problem = nil, nil
    if kv == false then
        self.topology_rev = 0
        if known ~= nil then
            use = known
            problem = string.format('etcd has no topology; version %d was seen: acting on it', known.version)
        end
    else
        self.topology_rev = kv.mod_revision
        local t, why = M.decode(kv.value)
        if t == nil then
            use = known
            problem = string.format('the topology in etcd cannot be read (%s)%s', why,
                known and string.format(': acting on version %d, seen before', known.version) or '')
        elseif known ~= nil and t.version < known.version then
            use = known
            problem = string.format('etcd holds topology version %d, version %d was seen: acting on %d', t.version,
                known.version, known.version)
        else
            use = t
            if known == nil or t.version ~= known.version or M.encode(t) ~= M.encode(known) then
                self.known_topology = t
                self:save_terms()
            end
        end
    end
    if problem ~= self.topology_problem then
        if problem ~= nil then
            self.log.error('failover: %s', problem)
        else
            self.log.info('failover: the topology in etcd is readable and current again')
        end
        self.topology_problem = problem
    end
    local before = self.topology and M.encode(self.topology)
    self.topology = use
    if use ~= nil and M.encode(use) ~= before then
        self.log.info('failover: topology version %d: %s', use.version, M.addresses(use))
        self.next_publish = 0  -- the others see at once which version we act on
    end
    self.registration = M.registration(use, self.uri)
end

-- In the topology (or there is none): we may replicate and be elected.
function methods:registered()
    return self.registration == nil or self.registration == 'member'
end

-- The topology's word on our candidacy (true without one).
function methods:topology_eligible()
    local m = M.find(self.topology, self.uri)
    return m == nil or m.eligible ~= false
end

-- Why we are unregistered (nil when we are not).
function methods:unregistered_reason()
    if self:registered() then
        return nil
    end
    return string.format('%s %s topology version %d', self.uri,
        self.registration == 'leaving' and 'is being removed from' or 'is not in', self.topology.version)
end

-- Members that must take part in an election: a majority of the topology's, or of SC_CLUSTER_SIZE.
function methods:election_majority()
    if self.topology == nil then
        return self.election_quorum
    end
    return M.majority(#self.topology.members)
end

-- The synchronous quorum's floor before unregistered acknowledgements: a majority of the
-- members (never below an SC_SYNC_QUORUM set explicitly), or the configured quorum.
function methods:quorum_floor()
    if self.topology == nil then
        return self.quorum
    end
    return math.max(M.majority(#self.topology.members), self.quorum_min or 0)
end

-- Does this member record take part in an election (its vclock counted and compared)?
-- Without a topology, as before: the eligible ones. With one: every member listed (not leaving)
-- that is healthy, eligible or not: each acknowledged writes.
function methods:votes(m)
    if self.topology == nil then
        return m.eligible == true
    end
    return M.registration(self.topology, m.uri) == 'member' and m.reason == nil
end

-- Does a downstream's acknowledgement stand for a member? Without a topology every one does.
-- A uuid we have no record of counts as no member until the control step has read the records.
function methods:counts_as_member(uuid)
    if self.topology == nil then
        return true
    end
    local uri = self.uris[uuid]
    if uri == nil then
        self.uris_stale = true
        return false
    end
    return M.registration(self.topology, uri) == 'member'
end

-- The leader: write back the topology etcd lost or holds an older version of, unless a live
-- member knows a newer one than ours (then say so and leave it). A sentence, or nil.
function methods:repair_topology()
    local known = self.known_topology
    if self.topology_problem == nil or known == nil or self.clock() < (self.next_topology_repair or 0) then
        return nil
    end
    self.next_topology_repair = self.clock() + M.REPAIR_INTERVAL_S
    local members = self:members()
    if members == nil then
        return nil
    end
    for _, m in pairs(members) do
        if (tonumber(m.topology_version) or 0) > known.version then
            return string.format('topology not written back: %s knows version %s, we know %d', m.uuid,
                tostring(m.topology_version), known.version)
        end
    end
    local value = M.encode(known)
    local ok, rev = self.etcd:txn({{key = self.keys.topology, target = 'MOD', value = self.topology_rev}},
        {etcd.op_put(self.keys.topology, value)}, {})
    if not ok then
        return nil  -- unavailable, or it changed: the next step reads it again
    end
    self:see_rev(rev, 'write the topology back')
    self.log.warn('failover: wrote topology version %d back to etcd', known.version)
    self:see_topology({value = value, mod_revision = rev})
    return string.format('wrote topology version %d back to etcd', known.version)
end

------------------------------------------------------------------------
-- An empty instance at start (init.lua): it may join, or bootstrap, only once it is a member.

-- registration, why, version (why nil: go on as before). kv: the topology key as read;
-- known: the topology the terms file holds (etcd having none).
function M.boot_registration(kv, uri, known)
    local t = known
    if kv then
        local decoded = M.decode(kv.value)
        if decoded ~= nil and (known == nil or decoded.version >= known.version) then
            t = decoded
        end
    end
    local reg = M.registration(t, uri)
    if reg == nil or reg == 'member' then
        return reg
    end
    return reg, string.format('%s is %s topology version %d: smartcache-cli cluster add %s', uri,
        reg == 'leaving' and 'being removed from' or 'not in', t.version, uri), t.version
end

-- While it waits, an empty instance holds a lease and publishes a member record saying so
-- (cluster status shows it; cluster add sees it waiting). opts: client, key (its member key),
-- uuid, uri, http_port, candidate, ttl, clock.
function M.waiter(opts)
    local w = {lease = nil, next_keepalive = 0}
    function w.tick(why, registered, version)
        local now = opts.clock()
        if w.lease == nil then
            local r = opts.client:grant(opts.ttl)
            if r == nil then
                return
            end
            w.lease, w.next_keepalive = r.id, 0
        end
        if now < w.next_keepalive then
            return
        end
        local ttl = opts.client:keepalive(w.lease)
        if ttl == 0 then
            w.lease = nil
            return
        end
        w.next_keepalive = now + opts.ttl / 3
        opts.client:put(opts.key, json.encode({uuid = opts.uuid, uri = opts.uri, role = 'unregistered', term = 0,
            vclock = setmetatable({}, {__serialize = 'map'}), eligible = false, lease = w.lease, reason = why,
            http_port = opts.http_port, candidate = opts.candidate, registered = registered,
            topology_version = version, final = false}), w.lease)
    end
    function w.done()
        if w.lease ~= nil then
            opts.client:revoke(w.lease)
            w.lease = nil
        end
    end
    return w
end

return M
