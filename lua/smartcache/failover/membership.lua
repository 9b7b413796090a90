-- Changes of the topology (sc.topology_init, sc.topology_add, sc.topology_remove),
-- made by the leader, one member at a time, each a compare-and-swap on the
-- topology key's mod_revision *and* the leader key's (only the leader of the
-- moment changes membership, and a change never crosses a leader change).
--
--   init    the first topology, made of every live member record (not
--           unregistered ones) and us; refused while fewer than SC_CLUSTER_SIZE
--           are live (force: with those that are). Idempotent.
--   add     a member appended (version + 1); an empty instance waiting for it
--           (init.lua) then joins the leader by the usual path.
--   remove  two steps. 1: the member is marked leaving: it stops replicating and
--           turns read-only (`unregistered`), and its acknowledgements no longer
--           count (each adds one to the quorum instead: sync_quorum.lua), while it
--           still counts in the majority; we wait, bounded, until it replicates
--           from us no more and its record says unregistered (or it has none: it
--           is down). 2: it goes from the list, and the majority shrinks. The
--           leader itself is never removed: switch over first.
-- After each write the leader acts on the new version at once, and waits
-- (bounded) until every live member's record says it acts on it too, so that two
-- changes never overlap in anyone's view. docs/storage-failover.md (Topology) has the proof.
local etcd = require('smartcache.etcd')
local topology = require('smartcache.failover.topology')

local M = {}
local methods = {}
M.methods = methods  -- mixed into the instance (smartcache.failover.instance)

-- A change that keeps losing its compare-and-swap gives up after this many tries.
M.CAS_ATTEMPTS = 5
-- How long a change waits for every live member to act on the new version (s).
M.APPLY_WAIT_S = 3
-- How often a removal looks whether the member has let go.
M.DETACH_POLL_S = 0.1

local function unavailable(err)
    return {status = 'ERROR', reason = 'ETCD_UNAVAILABLE',
            message = 'etcd unavailable: ' .. tostring(err and err.message or err)}
end

-- We hold the key with our lease and lead (or one of our own operations holds writes a moment).
function methods:leading()
    return self.leader ~= nil and self.leader.uuid == self.uuid and self.leader.lease == self.lease_id
        and (self.role == 'leader' or (self.role == 'fenced' and self:writes_held() ~= nil))
end

local function not_leader(self)
    return {status = 'NOT_LEADER', message = 'membership changes go through the leader',
            leader_uuid = self.leader and self.leader.uuid or box.NULL, role = self.role}
end

-- A first topology: every live member record but unregistered ones, and us; nil and the
-- answer when fewer than SC_CLUSTER_SIZE are live (unless force).
function methods:seed_topology(force)
    local members = self:members()
    if members == nil then
        return nil, unavailable(self.last_error)
    end
    local list, seen = {}, {}
    local function add(uri, http_port, candidate)
        if type(uri) == 'string' and not seen[uri] and topology.valid_address(uri) then
            seen[uri] = true
            table.insert(list, {address = uri, http_port = tonumber(http_port), eligible = candidate ~= false})
        end
    end
    add(self.uri, self.http_port, self.candidate_allowed)
    for _, m in pairs(members) do
        if m.role ~= 'unregistered' then
            add(m.uri, m.http_port, m.candidate)
        end
    end
    local t = topology.normalize({version = 0, members = list})
    if #t.members < self.cluster_size and not force then
        return nil, {status = 'BAD_REQUEST', reason = 'INCOMPLETE', live = topology.addresses(t),
                     message = string.format('only %d of the %d configured members (SC_CLUSTER_SIZE) are live '
                         .. '(%s): start the others, or force', #t.members, self.cluster_size, topology.addresses(t))}
    end
    return t
end

-- Change the topology by compare-and-swap. change(current, info) returns the topology to write,
-- or nil and the answer (nothing to write); info: {absent = etcd has none, seeded = current was
-- just made from the live records}. Returns the topology written, or nil and the answer.
function methods:change_topology(change, force)
    for _ = 1, M.CAS_ATTEMPTS do
        if not self:leading() then
            return nil, not_leader(self)
        end
        local kv, err = self.etcd:get(self.keys.topology)
        if kv == nil then
            return nil, unavailable(err)
        end
        local info = {absent = kv == false, seeded = false}
        local current, rev = self.known_topology, 0
        if kv ~= false then
            rev = kv.mod_revision
            local t, why = topology.decode(kv.value)
            if t == nil then
                return nil, {status = 'ERROR', reason = 'UNREADABLE',
                             message = 'the topology in etcd cannot be read: ' .. why}
            end
            if current == nil or t.version >= current.version then
                current = t  -- else etcd went back: build on the newest we know
            end
        elseif current == nil then
            local seed, answer = self:seed_topology(force)
            if seed == nil then
                return nil, answer
            end
            current, info.seeded = seed, true
        end
        local new, answer = change(topology.copy(current), info)
        if new == nil then
            return nil, answer
        end
        new.version = math.max(current.version, self.known_topology and self.known_topology.version or 0) + 1
        local value = topology.encode(new)
        local ok, res = self.etcd:txn({{key = self.keys.topology, target = 'MOD', value = rev},
                                       {key = self.keys.leader, target = 'MOD', value = self.leader.rev}},
            {etcd.op_put(self.keys.topology, value)}, {})
        if ok == nil then
            -- Unknown outcome: read it back (the version makes our value unique).
            local again = self.etcd:get(self.keys.topology)
            if not (again and again.value == value) then
                return nil, unavailable(res)
            end
            ok, res = true, again.mod_revision
        end
        if ok then
            self:see_rev(res, 'topology change')
            self:see_topology({value = value, mod_revision = res})
            self.log.info('failover: wrote topology version %d: %s', new.version, topology.addresses(new))
            return self.topology, info
        end
        -- The topology or the leader key changed since we read them: read again.
    end
    return nil, {status = 'CONFLICT', reason = 'LOST_RACES', message = string.format(
        'the topology or the leader key changed under each of %d compare-and-swaps: try again', M.CAS_ATTEMPTS)}
end

-- Until every live member acts on version (its record says so), or until_t: the uris of
-- those that do not yet.
function methods:wait_applied(version, until_t)
    while true do
        local behind = {}
        local members = self:members()
        for _, m in pairs(members or {}) do
            if topology.registration(self.topology, m.uri) ~= 'absent' and m.role ~= 'unregistered'
                    and (tonumber(m.topology_version) or 0) < version then
                table.insert(behind, tostring(m.uri))
            end
        end
        if members ~= nil and #behind == 0 then
            return behind
        end
        if self.clock() >= until_t then
            table.sort(behind)
            return behind
        end
        self.sleep(M.DETACH_POLL_S)
    end
end

local function answer_ok(self, extra, behind)
    local t = self.topology
    local out = {status = 'OK', version = t.version, members = topology.addresses(t),
                 not_applied_by = setmetatable(behind or {}, {__serialize = 'seq'})}
    for k, v in pairs(extra or {}) do
        out[k] = v
    end
    return out
end

-- sc.topology_init(force?): the first topology, from the live members; OK if there is one.
function methods:topology_init(force)
    local created = false
    local t, info = self:change_topology(function(current, info)
        if not info.absent then
            return nil, {status = 'OK', created = false}
        end
        created = true
        return current
    end, force)
    if t == nil then
        local answer = info
        if answer.status == 'OK' and self.topology ~= nil then
            return answer_ok(self, {created = false})
        end
        return answer
    end
    local behind = self:wait_applied(t.version, self.clock() + M.APPLY_WAIT_S)
    return answer_ok(self, {created = created, seeded = info.seeded}, behind)
end

-- A live record of that address: {role, uuid, http_port}, or nil.
function methods:record_of(address)
    for _, m in pairs(self:members() or {}) do
        if m.uri == address then
            return m
        end
    end
    return nil
end

-- sc.topology_add(address, http_port?, eligible?)
function methods:topology_add(address, http_port, eligible)
    local waiting = self:record_of(address)
    local t, info = self:change_topology(function(current, i)
        local m = topology.find(current, address)
        if m ~= nil then
            local what = m.leaving and ' is a member being removed: run cluster remove again to finish'
                or (' is a member already' .. (i.seeded and ' (the live members made the first topology)' or ''))
            return nil, {status = 'ALREADY_EXISTS', reason = 'ALREADY_MEMBER', leaving = m.leaving,
                         seeded = i.seeded, message = address .. what}
        end
        table.insert(current.members, {address = address, eligible = eligible ~= false,
                                       http_port = http_port or (waiting and tonumber(waiting.http_port))})
        return topology.normalize(current)
    end)
    if t == nil then
        return info
    end
    local behind = self:wait_applied(t.version, self.clock() + M.APPLY_WAIT_S)
    return answer_ok(self, {added = address, seeded = info.seeded,
                            waiting = waiting ~= nil and waiting.role == 'unregistered'}, behind)
end

-- Has the member at address let go of us? true and how ('unregistered', 'down'), or false and why.
function methods:detached(address)
    local members = self:members()
    if members == nil then
        return false, 'etcd unavailable: ' .. tostring(self.last_error)
    end
    local uuids, record = {}, nil
    for _, m in pairs(members) do
        if m.uri == address then
            uuids[m.uuid] = true
            if record == nil or m.role ~= 'unregistered' then
                record = m
            end
        end
    end
    for uuid, uri in pairs(self.uris) do
        if uri == address then
            uuids[uuid] = true
        end
    end
    for _, d in ipairs(self.box.downstreams()) do
        if uuids[d.uuid] and d.status == 'follow' then
            return false, 'it still replicates from us'
        end
    end
    if record ~= nil and record.role ~= 'unregistered' then
        return false, 'its member record says ' .. tostring(record.role)
    end
    return true, record and 'unregistered' or 'down'
end

-- sc.topology_remove(address, timeout_s)
function methods:topology_remove(address, timeout_s)
    if address == self.uri then
        return {status = 'BAD_REQUEST', reason = 'IS_LEADER', message = address .. ' is the leader: switch over first '
            .. '(smartcache-cli cluster switchover), then remove it'}
    end
    local t0 = self.clock()
    local until_t = t0 + timeout_s
    -- 1. Marked leaving: it lets go of us, and its acknowledgements stop counting.
    local t, info = self:change_topology(function(current, i)
        local m = topology.find(current, address)
        if m == nil then
            return nil, {status = 'NOT_FOUND', reason = 'NOT_MEMBER', seeded = i.seeded,
                         message = address .. ' is not a member'}
        end
        if m.leaving then
            return nil, {marked = 'leaving'}  -- marked already (a removal that timed out): wait again
        end
        m.leaving = true
        return current
    end)
    if t == nil and info.marked ~= 'leaving' then
        return info
    end
    local how
    while true do
        local ok, why = self:detached(address)
        if ok then
            how = why
            break
        end
        if self.clock() >= until_t then
            return {status = 'TIMEOUT', reason = 'STILL_ATTACHED', version = self.topology and self.topology.version,
                    message = string.format('%s is marked leaving but %s after %d ms: its acknowledgements no '
                        .. 'longer count; run cluster remove again', address, why,
                        math.floor((self.clock() - t0) * 1000))}
        end
        self.sleep(M.DETACH_POLL_S)
    end
    local detached_ms = math.floor((self.clock() - t0) * 1000)
    -- 2. Out of the list: the majority shrinks.
    t, info = self:change_topology(function(current)
        local m, i = topology.find(current, address)
        if m == nil then
            return nil, {marked = 'gone'}  -- another removal finished it
        end
        if not m.leaving then
            return nil, {status = 'CONFLICT', reason = 'READDED',
                         message = address .. ' was added back during its removal'}
        end
        table.remove(current.members, i)
        return current
    end)
    if t == nil and info.marked ~= 'gone' then
        return info
    end
    local behind = self:wait_applied(self.topology.version, math.max(until_t, self.clock() + 1))
    return answer_ok(self, {removed = address, detached = how, detached_ms = detached_ms}, behind)
end

return M
