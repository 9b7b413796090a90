#!/usr/bin/env tarantool
-- The lease / fence / election state machine (smartcache.failover) and the
-- etcd gateway client (smartcache.etcd), against a fake etcd behind a fake
-- http client, with an injected clock: no sockets, no box.cfg, no waiting.
-- Runnable alone: `tarantool tests/lua/failover_test.lua`.
local tap = require('tap')
local fiber = require('fiber')
local json = require('json')
local digest = require('digest')
local fio = require('fio')

local here = fio.dirname(fio.abspath(debug.getinfo(1, 'S').source:sub(2)))
package.path = fio.pathjoin(here, '..', '..', 'lua') .. '/?.lua;' .. package.path  -- tests/lua -> lua/

local etcd = require('smartcache.etcd')
local failover = require('smartcache.failover')

-- A fake clock -------------------------------------------------------------------

local T = {now = 1000, on_sleep = nil}
local function now()
    return T.now
end
local function advance(s)
    T.now = T.now + s
end
-- What the state machine's own waits do: time passes, and the other nodes run.
local function sleep(s)
    advance(s)
    if T.on_sleep ~= nil then
        T.on_sleep()
    end
end

-- A fake etcd: the JSON gateway's shapes, leases that expire on the fake clock ---------

local Fake = {}
Fake.__index = Fake

local function new_fake()
    return setmetatable({kv = {}, leases = {}, revision = 1, next_lease = 1000001,
                         down = false, delay = 0, requests = 0}, Fake)
end

function Fake:expire()
    for id, l in pairs(self.leases) do
        if l.expires_at <= T.now then
            self:revoke(id)
        end
    end
end

function Fake:revoke(id)
    self.leases[id] = nil
    local deleted = false
    for k, e in pairs(self.kv) do
        if e.lease == id then
            self.kv[k] = nil
            deleted = true
        end
    end
    if deleted then
        self.revision = self.revision + 1
    end
end

local function copy(t)
    if type(t) ~= 'table' then
        return t
    end
    local c = {}
    for k, v in pairs(t) do
        c[k] = copy(v)
    end
    return c
end

-- What `etcdctl snapshot save` keeps: keys, leases, the revision.
function Fake:snapshot()
    return {kv = copy(self.kv), leases = copy(self.leases), revision = self.revision}
end

-- `etcdctl snapshot restore` and a start on it: etcd promotes every lease anew (a full TTL).
function Fake:restore(snap)
    self.kv, self.leases, self.revision = copy(snap.kv), copy(snap.leases), snap.revision
    for _, l in pairs(self.leases) do
        l.expires_at = T.now + l.ttl
    end
end

-- Data dir deleted, etcd started again on the same port.
function Fake:wipe()
    self.kv, self.leases, self.revision = {}, {}, 1
end

function Fake:header()
    return {revision = tostring(self.revision), cluster_id = '1'}
end

function Fake:raw(k)
    local e = self.kv[k]
    return {key = digest.base64_encode(k, {nowrap = true}), value = digest.base64_encode(e.value, {nowrap = true}),
            create_revision = tostring(e.create_revision), mod_revision = tostring(e.mod_revision),
            lease = e.lease}
end

function Fake:do_put(k, v, lease)
    self.revision = self.revision + 1
    local e = self.kv[k]
    self.kv[k] = {value = v, lease = lease, mod_revision = self.revision,
                  create_revision = e and e.create_revision or self.revision}
end

function Fake:do_range(key, range_end)
    local keys = {}
    for k in pairs(self.kv) do
        if (range_end == nil and k == key) or (range_end ~= nil and k >= key and k < range_end) then
            table.insert(keys, k)
        end
    end
    table.sort(keys)
    local kvs = {}
    for _, k in ipairs(keys) do
        table.insert(kvs, self:raw(k))
    end
    return {header = self:header(), kvs = #kvs > 0 and kvs or nil, count = tostring(#kvs)}
end

local function d(s)
    return s and digest.base64_decode(s) or nil
end

function Fake:compare(c)
    local e = self.kv[d(c.key)]
    local actual
    if c.target == 'CREATE' then
        actual, c.want = e and e.create_revision or 0, tonumber(c.create_revision)
    elseif c.target == 'MOD' then
        actual, c.want = e and e.mod_revision or 0, tonumber(c.mod_revision)
    elseif c.target == 'LEASE' then
        actual, c.want = e and e.lease or '0', c.lease
    else
        actual, c.want = e and e.value, d(c.value)
    end
    assert(c.result == 'EQUAL', 'fake etcd: only EQUAL compares')
    return actual == c.want
end

function Fake:op(o)
    if o.request_put ~= nil then
        local p = o.request_put
        self:do_put(d(p.key), d(p.value), p.lease)
        return {response_put = {header = self:header()}}
    elseif o.request_delete_range ~= nil then
        local k = d(o.request_delete_range.key)
        if self.kv[k] ~= nil then
            self.kv[k] = nil
            self.revision = self.revision + 1
        end
        return {response_delete_range = {header = self:header()}}
    elseif o.request_range ~= nil then
        return {response_range = self:do_range(d(o.request_range.key))}
    end
    error('fake etcd: unknown op')
end

function Fake:handle(path, body)
    if path == '/v3/lease/grant' then
        local id = tostring(self.next_lease)
        self.next_lease = self.next_lease + 1
        local ttl = math.max(2, body.TTL)
        self.leases[id] = {ttl = ttl, expires_at = T.now + ttl}
        return 200, {header = self:header(), ID = id, TTL = tostring(ttl)}
    elseif path == '/v3/lease/keepalive' then
        local l = self.leases[body.ID]
        if l == nil then
            return 200, {result = {header = self:header(), ID = body.ID}}  -- no TTL: gone
        end
        l.expires_at = T.now + l.ttl
        return 200, {result = {header = self:header(), ID = body.ID, TTL = tostring(l.ttl)}}
    elseif path == '/v3/lease/revoke' then
        if self.leases[body.ID] == nil then
            return 404, {error = 'etcdserver: requested lease not found', code = 5,
                         message = 'etcdserver: requested lease not found'}
        end
        self:revoke(body.ID)
        return 200, {header = self:header()}
    elseif path == '/v3/kv/range' then
        return 200, self:do_range(d(body.key), d(body.range_end))
    elseif path == '/v3/kv/put' then
        if body.lease ~= nil and self.leases[body.lease] == nil then
            return 404, {error = 'etcdserver: requested lease not found', code = 5,
                         message = 'etcdserver: requested lease not found'}
        end
        self:do_put(d(body.key), d(body.value), body.lease)
        return 200, {header = self:header()}
    elseif path == '/v3/kv/txn' then
        local ok = true
        for _, c in ipairs(body.compare or {}) do
            ok = ok and self:compare(c)
        end
        local responses = {}
        for _, o in ipairs(ok and body.success or body.failure or {}) do
            table.insert(responses, self:op(o))
        end
        return 200, {header = self:header(), succeeded = ok or nil, responses = responses}
    end
    return 404, {error = 'Not Found', code = 5, message = 'Not Found'}
end

-- The http.client interface: request(self, method, url, body, opts) -> {status, body}.
function Fake:request(method, url, body, opts)
    assert(method == 'POST')
    self.requests = self.requests + 1
    if self.down then
        advance(0.001)
        return {status = 595, reason = "Couldn't connect to server"}
    end
    if self.delay > 0 then
        if self.delay >= opts.timeout then
            advance(opts.timeout)
            return {status = 408, reason = 'Timeout was reached'}
        end
        advance(self.delay)
    end
    self:expire()
    local status, doc = self:handle(url:match('^https?://[^/]+(/.*)$'), json.decode(body))
    return {status = status, body = json.encode(doc)}
end

-- A fake box per node -------------------------------------------------------------------

local nodes = {}

local function new_box(uuid, id, uri)
    local b = {uuid_ = uuid, id_ = id, uri = uri, vc = {}, ro = true, following = nil, calls = {},
               wal_errors_ = 0, wal_fail = false, rs = 'rs-1'}
    b.uuid = function() return b.uuid_ end
    b.id = function() return b.id_ end
    b.vclock = function()
        local c = {}
        for k, v in pairs(b.vc) do
            c[k] = v
        end
        return c
    end
    b.replicaset = function() return b.rs end
    b.read_only = function(ro)
        b.ro = ro
        table.insert(b.calls, ro and 'read_only' or 'read_write')
    end
    b.follow = function(to)
        b.following = to
        table.insert(b.calls, 'follow ' .. tostring(to))
    end
    -- Everyone whose box follows our uri is a downstream, with its own vclock.
    b.downstreams = function()
        local out = {}
        for _, n in pairs(nodes) do
            if n.box.following == b.uri then
                table.insert(out, {uuid = n.box.uuid_, status = 'follow', vclock = n.box.vclock()})
            end
        end
        return out
    end
    b.clear_synchro_queue = function() table.insert(b.calls, 'clear_synchro_queue') end
    b.set_quorum = function(q) b.quorum = q end
    b.on_promote = function()
        table.insert(b.calls, 'on_promote')
        if b.wal_fail then
            error('Failed to write to disk')
        end
    end
    b.wal_errors = function() return b.wal_errors_ end
    b.disk_check = function()
        if b.wal_fail then
            return false, 'WAL disk does not take a write: No space left on device'
        end
        return true
    end
    b.quiesce = function()
        table.insert(b.calls, 'quiesce')
        b.ro = true
        return true
    end
    b.upstream_ = nil
    b.upstream = function() return b.upstream_ end
    b.registered = {}
    b.drain = function()
        table.insert(b.calls, 'drain')
        return true
    end
    b.joined = function(u) return b.registered[u] == true end
    b.forget_joined = function(u) b.registered[u] = nil end
    return b
end

local quiet = {info = function() end, warn = function() end, error = function() end}

local TTL, MARGIN, POLL = 5, 1, 0.2

local function new_node(fake, name, uuid, id, quorum, extra)
    local b = new_box(uuid, id, name .. ':3301')
    local opts = {
        etcd = etcd.new({endpoints = {'http://etcd:2379'}, http = fake, timeout = 1}),
        box = b, cluster = 'test', uri = b.uri, ttl = TTL, margin = MARGIN, poll = POLL, quorum = quorum or 2,
        clock = now, sleep = sleep, log = quiet, data_dir = '/nonexistent', store = failover.memory_store(),
        request_rejoin = function(reason)
            table.insert(b.calls, 'rejoin ' .. reason)
            return '/nonexistent/sc_rejoin'
        end,
    }
    for k, v in pairs(extra or {}) do
        opts[k] = v
    end
    local inst = failover.new(opts)
    local n = {name = name, box = b, fo = inst}
    nodes[name] = n
    return n
end

local function reset()
    nodes = {}
    T.on_sleep = nil
end

-- A fresh fake etcd and n nodes a, b, c... (uuids aaaa, bbbb, ...; ids 1, 2, ...), each with the
-- synchronous quorum given (default 2); returns the fake and the nodes.
local function cluster(n, quorum)
    reset()
    local fake = new_fake()
    local out = {}
    for i = 1, n do
        local name = string.char(96 + i)
        table.insert(out, new_node(fake, name, name:rep(4), i, quorum))
    end
    return fake, unpack(out)
end

-- One round of every node's steps, skipping frozen ones and those inside a step
-- (a node waiting inside a step lets the others run: T.on_sleep).
local function round(list)
    for _, n in ipairs(list) do
        if not n.frozen and not n.busy then
            n.busy = true
            n.fo:lease_step()
            n.fo:guard_step()
            n.fo:control_step()
            n.busy = false
        end
    end
end

local in_hook = false
local function concurrently(list)
    T.on_sleep = function()
        if not in_hook then
            in_hook = true
            round(list)
            in_hook = false
        end
    end
end

-- Let time pass in poll-sized rounds, checking at each one that at most one node may write.
local function run_for(list, seconds, t)
    local until_t = T.now + seconds
    local worst = 0
    local hook = T.on_sleep
    if hook == nil then
        concurrently(list)
    end
    while T.now < until_t do
        advance(POLL)
        round(list)
        local w = 0
        for _, n in ipairs(list) do
            if n.fo.writable() then
                w = w + 1
            end
        end
        worst = math.max(worst, w)
    end
    T.on_sleep = hook
    if t ~= nil then
        t:ok(worst <= 1, string.format('never two writable (max %d)', worst))
    end
    return worst
end

local function leader_of(list)
    for _, n in ipairs(list) do
        if n.fo.role == 'leader' then
            return n
        end
    end
end

local LEADER_KEY = '/smartcache/test/leader'

-- Tests ------------------------------------------------------------------------------

local test = tap.test('failover')
test:plan(61)

test:test('etcd client speaks the gateway: leases, create, txn, range, delete', function(t)
    t:plan(14)
    local fake = new_fake()
    local c = etcd.new({endpoints = {'http://etcd:2379/'}, http = fake})
    local lease = c:grant(5)
    t:is(type(lease.id), 'string', 'lease id stays a string')
    t:is(lease.ttl, 5, 'ttl granted')
    t:is(c:keepalive(lease.id), 5, 'keepalive returns the ttl')
    local ok, rev = c:create('/a/leader', 'v1', lease.id)
    t:ok(ok, 'created')
    local again, _, existing = c:create('/a/leader', 'v2', lease.id)
    t:is(again, false, 'second create refused')
    t:is(existing.value, 'v1', 'and answers what is there')
    local kv = c:get('/a/leader')
    t:is(kv.mod_revision, rev, 'get: mod_revision is the create revision')
    c:put('/a/members/x', 'mx', lease.id)
    c:put('/a/membersz', 'outside', nil)
    local list = c:range_prefix('/a/members/')
    t:is(#list, 1, 'prefix range stops at the prefix end')
    t:is(c:delete_if('/a/leader', rev + 100), false, 'delete_if with a wrong revision does nothing')
    t:is(c:delete_if('/a/leader', rev), true, 'delete_if with the right revision deletes')
    t:is(c:get('/a/leader'), false, 'absent key is false, not an error')
    advance(6)
    t:is(c:keepalive(lease.id), 0, 'an expired lease keeps alive to 0')
    t:is(c:revoke(lease.id), true, 'revoking a gone lease is fine')
    fake.down = true
    local r, err = c:get('/a/x')
    t:ok(r == nil and err.kind == 'unavailable', 'unreachable etcd: nil, unavailable')
end)

test:test('a lone member takes the free key, promotes in order, and is writable', function(t)
    t:plan(8)
    local fake, a = cluster(1, 1)
    t:is(a.fo.writable(), false, 'not writable before anything')
    round({a})
    t:is(a.fo.role, 'leader', 'leader after one round')
    t:ok(a.fo.writable(), 'writable')
    t:is(a.box.ro, false, 'box read-write')
    t:is(table.concat(a.box.calls, ','), 'clear_synchro_queue,read_write,on_promote',
        'clear_synchro_queue before read-write, admin writes last')
    local kv = fake.kv[LEADER_KEY]
    t:is(json.decode(kv.value).uuid, 'aaaa', 'key holds our uuid')
    t:ok(a.fo.term == 1 and json.decode(kv.value).term == 1, "the term is a counter in the key's value: 1 first")
    t:ok(math.abs(a.fo:lease_left() - (TTL - MARGIN)) < 1e-6, 'deadline = t_sent + TTL - margin')
end)

test:test('keepalive moves the deadline from the time it was sent', function(t)
    t:plan(3)
    local fake, a = cluster(1, 1)
    round({a})
    advance(TTL / 3)
    fake.delay = 0.5  -- slow answer: the deadline counts from the send
    local sent = T.now
    a.fo:lease_step()
    t:ok(math.abs(a.fo.deadline - (sent + TTL - MARGIN)) < 1e-6, 'deadline from t_sent, not from the answer')
    fake.delay = 0.9  -- slower than margin would allow if counted from the answer
    advance(TTL / 3)
    sent = T.now
    a.fo:lease_step()
    t:ok(math.abs(a.fo.deadline - (sent + TTL - MARGIN)) < 1e-6, 'again')
    t:ok(a.fo.writable(), 'still writable')
end)

test:test('etcd unreachable: the leader fences itself before etcd can expire its key', function(t)
    t:plan(7)
    local fake, a = cluster(1, 1)
    round({a})
    local last_ok = a.fo.lease_sent
    fake.down = true
    local fenced_at
    while fenced_at == nil and T.now < last_ok + 2 * TTL do
        advance(0.05)
        a.fo:lease_step()
        a.fo:guard_step()
        if not a.fo.writable() and fenced_at == nil then
            fenced_at = T.now
        end
    end
    t:ok(fenced_at ~= nil, 'stopped writing')
    t:ok(fenced_at <= last_ok + TTL - MARGIN + 0.05, 'at t_sent + TTL - margin')
    t:is(a.fo.role, 'fenced', 'role fenced')
    t:is(a.box.ro, true, 'box read-only')
    -- etcd's own clock expires the lease only at the last keepalive it saw + TTL.
    fake.down = false
    fake:expire()
    t:ok(fake.kv[LEADER_KEY] ~= nil and T.now < last_ok + TTL, 'etcd still holds the key when we fenced')
    -- Back within the TTL, the key is still ours: the leader resumes.
    a.fo.next_keepalive = 0
    round({a})
    t:is(a.fo.role, 'leader', 'resumes when the lease is proven again and the key is still ours')
    t:ok(a.fo.writable(), 'writable again')
end)

test:test('etcd slower than the request timeout: no proof, fence on time', function(t)
    t:plan(3)
    local fake, a = cluster(1, 1)
    round({a})
    local deadline = a.fo.deadline
    fake.delay = 5  -- every request times out (1 s)
    while T.now <= deadline + 0.1 do
        a.fo:lease_step()
        a.fo:guard_step()
        advance(0.1)
    end
    t:ok(T.now > deadline, 'time passed the deadline')
    t:is(a.fo.writable(), false, 'not writable')
    t:is(a.fo.role, 'fenced', 'fenced')
end)

test:test('lease lost: fence at once, new lease, follow the new leader', function(t)
    t:plan(7)
    local fake, a, b = cluster(2)
    run_for({a, b}, 1)
    t:is(a.fo.role, 'leader', 'a leads')
    local old_lease = a.fo.lease_id
    fake:revoke(old_lease)  -- say an operator revoked it
    a.fo.next_keepalive = 0
    a.fo:lease_step()
    t:is(a.fo.writable(), false, 'lease gone: not writable')
    t:is(a.fo.role, 'fenced', 'fenced')
    t:is(a.fo.lease_id, nil, 'lease dropped')
    run_for({b, a}, 1, t)
    local l = leader_of({a, b})
    t:ok(l ~= nil, 'a leader again after a new election')
    t:ok(a.fo.lease_id ~= nil and a.fo.lease_id ~= old_lease, 'a runs on a new lease')
end)

test:test('SIGSTOP for 2 x TTL: refuses writes on resume, before any step runs', function(t)
    t:plan(9)
    local _, a, b, c = cluster(3)
    local all = {a, b, c}
    run_for(all, 1, t)
    t:is(a.fo.role, 'leader', 'a leads (smallest uuid, equal vclocks)')
    a.frozen = true
    run_for(all, 2 * TTL, t)
    local nb = leader_of({b, c})
    t:ok(nb ~= nil, 'another member took over while a was stopped')
    a.frozen = false
    t:is(a.fo.writable(), false, 'a refuses writes the moment it resumes (clock jumped past its deadline)')
    a.fo:guard_step()
    t:is(a.box.ro, true, 'the guard makes it read-only')
    run_for(all, 1, t)
    t:is(a.fo.role, 'follower', 'a follows')
    t:is(a.box.following, nb.box.uri, 'replicating from the new leader')
end)

test:test('election: the most up-to-date eligible member wins; ties go to the smallest uuid', function(t)
    t:plan(7)
    local fake, a, b, c = cluster(3)
    a.box.vc = {[1] = 10}
    b.box.vc = {[1] = 12}
    c.box.vc = {[1] = 11}
    run_for({a, b, c}, 1, t)
    t:is(leader_of({a, b, c}), b, 'b has the most rows and wins')
    t:is(json.decode(fake.kv[LEADER_KEY].value).vclock['1'], 12, 'the key holds the vclock it was elected with')
    -- Kill b; a and c are equal: the smaller uuid wins.
    b.frozen = true
    a.box.vc = {[1] = 12}
    c.box.vc = {[1] = 12}
    run_for({a, b, c}, TTL + 1, t)
    t:is(leader_of({a, c}), a, 'tie: smallest uuid')
    -- An ineligible member is not waited for and cannot win.
    local _
    _, a, b, c = cluster(3)
    b.fo.candidate_allowed = false
    b.box.vc = {[1] = 50}
    run_for({a, b, c}, 1)
    t:is(leader_of({a, b, c}), a, 'SC_CANDIDATE=false never leads, even when ahead')
    -- Without a majority of eligible members, nobody is elected.
    _, a, b = cluster(2)
    b.fo.candidate_allowed = false
    run_for({a, b}, 2)
    t:is(leader_of({a, b}), nil, 'one eligible member of a quorum of two does not elect itself')
end)

test:test('election waits for members whose published vclock may be stale', function(t)
    t:plan(3)
    local fake, a, b, c = cluster(3)
    run_for({a, b, c}, 1)
    t:is(a.fo.role, 'leader', 'a leads')
    -- c stops publishing, but its lease (and so its member record) stays alive.
    c.frozen = true
    a.fo:step_down('test')
    local waited = 0
    while leader_of({a, b}) == nil and waited < 3 * TTL do
        advance(POLL)
        waited = waited + POLL
        fake.leases[c.fo.lease_id].expires_at = T.now + TTL
        round({a, b})
    end
    t:ok(waited >= TTL, string.format('nobody is elected while c may be ahead (%.1f s)', waited))
    t:ok(leader_of({a, b}) ~= nil and waited < TTL + 1, 'then a majority that spoke elects')
end)

test:test('a follower with rows the leader was not elected with is DIVERGED', function(t)
    t:plan(6)
    local _, a, b, c = cluster(3)
    a.box.vc = {[1] = 20}
    b.box.vc = {[1] = 15}
    c.box.vc = {[1] = 15}
    run_for({a, b, c}, 1)
    t:is(a.fo.role, 'leader', 'a leads')
    -- a writes rows that never reach the others, then dies; b takes over.
    a.box.vc = {[1] = 25}
    a.frozen = true
    b.box.vc = {[1] = 20}
    c.box.vc = {[1] = 19}
    run_for({a, b, c}, TTL + 1)
    t:is(b.fo.role, 'leader', 'b leads')
    -- a comes back: it has rows 21..25 of instance 1 that b never had.
    a.frozen = false
    run_for({a, b, c}, 2)
    t:is(a.fo.role, 'diverged', 'a is DIVERGED')
    t:is(a.box.following, nil, 'and replicates from nobody')
    t:is(a.fo:eligible(), false, 'and cannot be elected')
    t:is(a.fo.writable(), false, 'and does not write')
end)

test:test('a leader whose WAL fails steps down and releases the key', function(t)
    t:plan(6)
    local fake, a, b, c = cluster(3)
    run_for({a, b, c}, 1)
    t:is(a.fo.role, 'leader', 'a leads')
    a.box.wal_fail = true
    a.box.wal_errors_ = 3  -- procedures counted WAL errors
    a.fo:control_step()
    t:is(a.fo.writable(), false, 'a stopped writing')
    t:is(fake.kv[LEADER_KEY], nil, 'and freed the key at once')
    t:ok(a.fo.wal_broken ~= nil, 'marked broken, not eligible')
    run_for({a, b, c}, 1)
    t:is(b.fo.role, 'leader', 'b took over without waiting for the TTL')
    t:is(a.fo.role, 'follower', 'a follows')
end)

test:test('switchover: stop, catch up, hand the key to the candidate, measure the pause', function(t)
    t:plan(9)
    local _, a, b, c = cluster(3)
    local all = {a, b, c}
    run_for(all, 1)
    t:is(a.fo.role, 'leader', 'a leads')
    a.box.vc = {[1] = 30}
    b.box.vc = {[1] = 28}  -- catches up during the switchover
    local worst = 0
    T.on_sleep = function()
        b.box.vc = {[1] = 30}
        for _, n in ipairs({b, c}) do
            n.fo:lease_step()
            n.fo:control_step()
        end
        local w = (a.fo.writable() and 1 or 0) + (b.fo.writable() and 1 or 0) + (c.fo.writable() and 1 or 0)
        worst = math.max(worst, w)
    end
    local r = a.fo:switchover('bbbb', 5)
    T.on_sleep = nil
    t:is(r.status, 'OK', 'OK')
    t:is(b.fo.role, 'leader', 'b leads')
    t:is(a.fo.role, 'follower', 'a follows')
    t:is(a.box.following, b.box.uri, 'a replicates from b')
    t:ok(r.pause_ms >= 0 and r.pause_ms < 1000, 'pause measured: ' .. tostring(r.pause_ms) .. ' ms')
    t:ok(worst <= 1, 'never two writable during the hand-over')
    t:is(a.box.calls[#a.box.calls - 1], 'quiesce', 'writes drained before the hand-over')
    t:is(a.fo:switchover('cccc', 1).status, 'NOT_LEADER', 'only the leader hands over')
end)

test:test('switchover to a candidate that cannot catch up: TIMEOUT, the leader resumes', function(t)
    t:plan(3)
    local _, a, b = cluster(2)
    run_for({a, b}, 1)
    a.box.vc = {[1] = 30}
    b.box.vc = {[1] = 1}
    local r = a.fo:switchover('bbbb', 0.3)
    t:is(r.status, 'TIMEOUT', 'TIMEOUT')
    t:is(a.fo.role, 'leader', 'a still leads')
    t:ok(a.fo.writable(), 'and writes again')
end)

test:test('a box turned read-only during a switchover: not a WAL failure; the leader leads on if it may', function(t)
    t:plan(6)
    local _, a, b = cluster(2)
    run_for({a, b}, 1)
    local lease_passed = false
    a.box.quiesce = function()
        a.box.ro = true  -- the guard, while the barrier is written
        if lease_passed then
            advance(TTL + 1)
        end
        return false, box.error.new(box.error.READONLY)
    end
    local r = a.fo:switchover('bbbb', 5)
    t:is(r.status, 'ERROR', 'ERROR: ' .. tostring(r.message))
    t:ok(a.fo.role == 'leader' and a.fo.writable(), 'the lease still proven: it leads and writes on')
    t:is(a.fo.wal_broken, nil, 'the WAL is not marked broken')
    lease_passed = true
    r = a.fo:switchover('bbbb', 5)
    t:is(r.status, 'NOT_LEADER', 'the lease passed meanwhile: NOT_LEADER: ' .. tostring(r.message))
    t:ok(not a.fo.writable(), 'and it does not write')
    t:ok(a.fo.wal_broken == nil and a.fo:eligible(), 'still eligible to lead again')
end)

test:test('promotion waits for a follower to replicate from the new leader before clearing the queue', function(t)
    t:plan(3)
    local _, a, b, c = cluster(3)
    run_for({a, b, c}, 1)
    a.frozen = true
    local order = {}
    local followed_at
    T.on_sleep = function()
        -- c (not b) notices the new leader while b waits in promote()
        c.fo:lease_step()
        c.fo:control_step()
        if c.box.following == b.box.uri and followed_at == nil then
            followed_at = #b.box.calls
            table.insert(order, 'c follows b')
        end
    end
    run_for({b, c}, TTL + 1)
    T.on_sleep = nil
    t:is(b.fo.role, 'leader', 'b leads')
    local clear_at
    for i, call in ipairs(b.box.calls) do
        if call == 'clear_synchro_queue' then
            clear_at = i
        end
    end
    t:ok(followed_at ~= nil and clear_at ~= nil, 'both happened')
    t:ok(followed_at ~= nil and clear_at ~= nil and followed_at < clear_at,
        'a follower was attached before clear_synchro_queue')
end)

test:test('a leader key left by our previous run is removed, not waited out', function(t)
    t:plan(2)
    local fake, a = cluster(1, 1)
    round({a})
    -- "restart": a new instance with the same uuid and no lease
    nodes = {}
    local a2 = new_node(fake, 'a', 'aaaa', 1, 1)
    a2.fo:lease_step()
    a2.fo:control_step()
    t:is(fake.kv[LEADER_KEY], nil, 'old key removed at once')
    round({a2})
    t:is(a2.fo.role, 'leader', 'and the restarted instance leads again')
end)

test:test("the leader's synchronous quorum counts every attached follower, never below the configured one", function(t)
    t:plan(3)
    local _, a, b, c = cluster(3)
    run_for({a, b, c}, 1)
    a.fo:quorum_step()
    t:is(a.box.quorum, 3, 'two followers attached: 3 (2.6.0 stalls when more replicas ack than needed)')
    c.box.following = nil
    a.fo:quorum_step()
    t:is(a.box.quorum, 2, 'one attached: the configured 2')
    b.box.following = nil
    a.fo:quorum_step()
    t:is(a.box.quorum, 2, 'none attached: still 2, writes wait for a follower')
end)

test:test('a WAL disk that runs out of room makes any member ineligible until it has room again', function(t)
    t:plan(6)
    local _, a, b, c = cluster(3)
    run_for({a, b, c}, 1)
    b.box.wal_fail = true  -- no WAL errors counted: found by the periodic check
    run_for({a, b, c}, TTL / 3 + POLL)
    t:ok(b.fo.wal_broken ~= nil, 'the follower noticed by itself')
    t:is(b.fo:eligible(), false, 'and is not eligible')
    a.box.wal_fail = true
    run_for({a, b, c}, TTL / 3 + POLL)
    t:is(a.fo.role ~= 'leader' and not a.fo.writable(), true, 'the leader stepped down without a failed write')
    t:is(leader_of({a, b, c}), nil, 'one healthy member of three elects nobody')
    b.box.wal_fail = false
    run_for({a, b, c}, TTL / 3 + 2 * POLL)
    t:is(b.fo.wal_broken, nil, 'room again: eligible again')
    t:ok(leader_of({a, b, c}) ~= nil and leader_of({a, b, c}) ~= a, 'and a healthy member leads')
end)

test:test('a row the candidate got after the hand-over moves the baseline: the old leader is not DIVERGED', function(t)
    t:plan(4)
    local fake, a, b, c = cluster(3)
    run_for({a, b, c}, 1)
    a.box.vc = {[1] = 30}
    b.box.vc = {[1] = 30}
    c.box.vc = {[1] = 30}
    local moved = false
    T.on_sleep = function()
        if not moved and json.decode((fake.kv[LEADER_KEY] or {value = '{}'}).value).uuid == 'bbbb' then
            moved = true  -- a late CONFIRM: written by a after the key moved, received by b and c
            a.box.vc, b.box.vc, c.box.vc = {[1] = 31}, {[1] = 31}, {[1] = 31}
        end
        for _, n in ipairs({b, c}) do
            n.fo:lease_step()
            n.fo:control_step()
        end
    end
    local old_term = a.fo.term
    local r = a.fo:switchover('bbbb', 5)
    T.on_sleep = nil
    t:is(r.status, 'OK', 'switched over')
    t:is(json.decode(fake.kv[LEADER_KEY].value).vclock['1'], 31, 'the new leader rewrote the baseline')
    t:ok(r.term == b.fo.term and r.term == old_term + 1, 'the hand-over takes the next term; the rewrite keeps it')
    run_for({a, b, c}, 1)
    t:is(a.fo.role, 'follower', 'the old leader follows, not DIVERGED')
end)

test:test('join hold: writes stop, drain, and resume once the joiner is registered', function(t)
    t:plan(9)
    local _, a, b = cluster(2)
    run_for({a, b}, 1)
    t:is(a.fo.role, 'leader', 'a leads')
    t:is(b.fo:hold_for_join('dddd', 10).status, 'NOT_LEADER', 'only the leader holds')
    local r = a.fo:hold_for_join('dddd', 10)
    t:is(r.status, 'OK', 'held')
    t:is(a.box.calls[#a.box.calls], 'drain', 'pending writes drained first')
    t:ok(not a.fo.writable() and not a.box.ro, 'writes stop; the box stays writable for the registration')
    run_for({a, b}, 1)
    t:ok(not a.fo.writable(), 'still held while the joiner is not registered, through lease renewals')
    a.box.registered['dddd'] = true
    a.fo:join_hold_step()
    t:ok(a.fo.writable(), 'writes again once it is')
    t:is(a.fo.role, 'leader', 'still the leader')
    t:is(a.fo.join_hold, nil, 'hold gone')
end)

test:test('join hold: released by its timeout when the joiner never registers', function(t)
    t:plan(3)
    local _, a, b = cluster(2)
    run_for({a, b}, 1)
    t:is(a.fo:hold_for_join('dddd', 2).status, 'OK', 'held')
    run_for({a, b}, 1)
    a.fo:join_hold_step()
    t:ok(not a.fo.writable(), 'held before the timeout')
    run_for({a, b}, 1.5)
    a.fo:join_hold_step()
    t:ok(a.fo.writable(), 'writes again after it')
end)

test:test('a follower whose applier stopped reconnects it and reports it until it follows', function(t)
    t:plan(6)
    local _, a, b = cluster(2)
    run_for({a, b}, 1)
    t:is(b.fo.role, 'follower', 'b follows')
    b.box.upstream_ = {status = 'stopped', message = 'Failed to write to disk'}
    local before = #b.box.calls
    run_for({a, b}, 1)
    t:is(b.box.calls[before + 1], 'follow nil', 'replication reset')
    t:is(b.box.calls[before + 2], 'follow ' .. a.box.uri, 'and pointed at the leader again')
    t:like(b.fo:status().upstream_problem, 'stopped .*Failed to write to disk', 'reported')
    t:is(b.fo.counters.reconnects, 1, 'once per retry interval, not every step')
    b.box.upstream_ = {status = 'follow'}
    run_for({a, b}, 1)
    t:is(b.fo:status().upstream_problem, nil, 'cleared once it follows')
end)

test:test('a follower promoted while its upstream was broken does not report it as leader', function(t)
    t:plan(5)
    local _, a, b, c = cluster(3)
    run_for({a, b, c}, 1)
    t:is(b.fo.role, 'follower', 'b follows')
    b.box.upstream_ = {status = 'disconnected', message = 'timed out'}
    run_for({a, b, c}, 6)
    t:ok(b.fo:status().upstream_broken_s >= 5, 'the broken upstream is reported')
    run_for({b, c}, 3 * TTL)  -- a is gone
    t:is(b.fo.role, 'leader', 'b leads')
    t:is(b.fo:status().upstream_problem, nil, 'no upstream problem once it leads')
    t:is(b.fo:status().upstream_broken_s, nil, 'nor a time')
end)

-- A one-member set whose only instance leads (a cluster's first start).
local function lone_leader()
    local fake, a = cluster(1, 1)
    run_for({a}, 1)
    return a, fake
end

test:test('a join hold whose drain does not finish steps down instead of staying fenced', function(t)
    t:plan(4)
    local a = lone_leader()
    t:is(a.fo.role, 'leader', 'a lone leader')
    a.fo.join_drain_timeout_s = 0.1
    local drain_ended = false
    a.box.drain = function()
        fiber.sleep(0.5)  -- a write stuck in the limbo (it ends here so the test leaves no fiber behind)
        drain_ended = true
        return true
    end
    local r = a.fo:hold_for_join('ffff', 2)
    t:is(r.status, 'ERROR', 'the hold fails: ' .. tostring(r.message))
    t:ok(not drain_ended, 'after the bound, not when the drain ends (the drain is still running)')
    t:isnt(a.fo.role, 'leader', 'and the leader stepped down, so another can lead')
    fiber.sleep(0.5)
end)

test:test('a join hold whose drain meets a rollback for want of a quorum holds; a WAL error steps down', function(t)
    t:plan(6)
    local a = lone_leader()
    t:is(a.fo.role, 'leader', 'a lone leader (a first start: no follower yet)')
    a.box.drain = function() return false, box.error.new(box.error.SYNC_ROLLBACK) end
    local r = a.fo:hold_for_join('dddd', 2)
    t:is(r.status, 'OK', 'held: the rollback emptied the limbo')
    t:is(a.fo.wal_broken, nil, 'and the disk is not blamed')
    run_for({a}, 3)
    a.fo:join_hold_step()
    t:is(a.fo.role, 'leader', 'leads again after the hold')
    a.box.drain = function() return false, box.error.new(box.error.WAL_IO) end
    r = a.fo:hold_for_join('eeee', 2)
    t:is(r.status, 'ERROR', 'a WAL error is an error')
    t:ok(a.fo.wal_broken ~= nil, 'and steps down for the disk')
end)

test:test('the quorum goes up only once the limbo has drained, with writes held meanwhile', function(t)
    t:plan(7)
    local a, fake = lone_leader()
    a.fo:quorum_step()
    t:is(a.box.quorum, 1, 'a lone leader: quorum 1')
    local busy = 3
    a.box.limbo_busy = function() return busy > 0 end
    local seen = {}
    a.box.set_quorum = function(q)
        seen = {q = q, busy = busy > 0, writable = a.fo.writable()}
        a.box.quorum = q
    end
    local sleep0 = a.fo.sleep
    a.fo.sleep = function(s)
        busy = busy - 1
        t:ok(not a.fo.writable() or busy < 0, 'no writes while the limbo drains')
        sleep0(s)
    end
    a.box.following = nil
    local b = new_node(fake, 'b', 'bbbb', 2)
    b.box.following = a.box.uri  -- a follower attaches
    a.fo:quorum_step()
    t:is(seen.q, 2, 'raised to 2')
    t:ok(not seen.busy and not seen.writable, 'with the limbo empty and writes held')
    t:ok(a.fo.writable() and a.fo.role == 'leader', 'writable again after it')
end)

test:test('proven_deadline is the last proof of the lease: t_sent + TTL - margin', function(t)
    t:plan(4)
    local a = lone_leader()
    t:ok(math.abs(a.fo:proven_deadline() - (a.fo.lease_sent + TTL - MARGIN)) < 1e-9, 'from the last send')
    t:is(a.fo.deadline, a.fo:proven_deadline(), "a leader's deadline is it")
    advance(TTL / 3)
    local sent = T.now
    a.fo:lease_step()
    t:ok(math.abs(a.fo:proven_deadline() - (sent + TTL - MARGIN)) < 1e-9, 'a keepalive moves it')
    t:is(a.fo.deadline, a.fo:proven_deadline(), 'and the deadline with it')
end)

test:test('hold_writes / resume_writes: writes again only for the same hold, while the lease is proven', function(t)
    t:plan(12)
    local a = lone_leader()
    a.fo:hold_writes('testing')
    t:ok(not a.fo.writable(), 'held: not writable')
    t:is(a.fo.role, 'fenced', 'fenced')
    t:is(a.fo:status().fence_reason, 'testing', 'the hold is the fence reason')
    t:is(a.box.ro, false, 'the box stays writable')
    t:is(a.fo:resume_writes('another hold'), false, 'another hold does not resume it')
    t:is(a.fo:resume_writes('testing'), true, 'its own does')
    t:ok(a.fo.writable() and a.fo.role == 'leader', 'writable, the leader again')
    a.fo:hold_writes('testing')
    advance(TTL)  -- past the proven deadline, no keepalive
    t:is(a.fo:resume_writes('testing'), false, 'not once the lease is no longer proven')
    t:ok(not a.fo.writable(), 'still not writable')
    a = lone_leader()
    a.fo:hold_writes('testing')
    a.fo:step_down('something else')
    t:is(a.fo:resume_writes('testing'), false, 'not after something else changed the role')
    a = lone_leader()
    a.box.ro = true
    a.fo:hold_writes('quiesced')
    t:is(a.fo:resume_writes('quiesced', {read_write = true}), true, 'read_write: resumed')
    t:is(a.box.calls[#a.box.calls], 'read_write', 'and the box made writable again')
end)

test:test('each step returns the decision it took', function(t)
    t:plan(11)
    local fake, a = cluster(1, 1)
    t:like(a.fo:lease_step(), '^granted lease %d+', 'lease: granted')
    t:like(a.fo:lease_step(), '^no action: lease %d+ proven', 'lease: nothing due')
    t:like(a.fo:guard_step(), '^no action: not the leader %(candidate%)', 'guard: not leading')
    t:like(a.fo:control_step(), '^won the election %(term %d+%); promoted: leader', 'control: elected and promoted')
    t:like(a.fo:guard_step(), '^no action: I am the leader with the lease', 'guard: the leader with the lease')
    t:is(a.fo:control_step(), 'no action: I am the leader with the lease', 'control: the leader')
    local b = new_node(fake, 'b', 'bbbb', 2, 1)
    b.fo:lease_step()
    t:like(b.fo:control_step(), '^following aaaa %(term %d+%)', 'control: following')
    advance(TTL / 3)
    t:like(a.fo:lease_step(), '^renewed lease %d+: writable for', 'lease: renewed')
    fake.down = true
    advance(TTL / 3)
    t:like(a.fo:lease_step(), '^nothing proven: keepalive', 'lease: nothing proven')
    advance(TTL)
    t:like(a.fo:guard_step(), '^fenced: lease not proven since %d', 'guard: fenced')
    t:like(a.fo:control_step(), '^no action: read leader key', 'control: etcd unavailable')
end)

test:test("status() shows each loop's last decision; a hold says which operation holds writes", function(t)
    t:plan(9)
    local fake, a = cluster(1, 1)
    local before = a.fo:status().decisions
    t:ok(before.lease == box.NULL and before.guard == box.NULL and before.control == box.NULL,
        'every loop is there before it ran, as null')
    local lease, control = a.fo:tick('lease'), a.fo:tick('control')
    local guard = a.fo:tick('guard')
    local said = a.fo:status().decisions
    t:is(said.lease, lease, 'the lease loop')
    t:is(said.control, control, 'the control loop')
    t:is(said.guard, guard, 'the guard loop')
    t:like(guard, '^no action: I am the leader with the lease', 'a leader with nothing to do')
    local b = new_node(fake, 'b', 'bbbb', 2, 1)
    b.box.following = a.box.uri  -- a follower attaches
    t:like(a.fo:tick('guard'), '^set the synchronous quorum to 2', 'the guard loop says what its quorum step did')
    t:is(a.fo:hold_for_join('dddd', 10).status, 'OK', 'a join hold')
    t:is(a.fo:writes_held(), 'join hold', 'writes held by the join hold')
    t:like(a.fo:tick('guard'), '^holding writes for the join of dddd', 'the guard loop says so')
end)

test:test('the loop steps keep their decisions through an error', function(t)
    t:plan(2)
    local a = lone_leader()
    a.fo.etcd = {get = function() error('boom') end, get_many = function() error('boom') end}
    t:like(a.fo:tick('control'), '^error: .*boom', 'the error is the decision')
    t:like(a.fo:status().decisions.control, 'boom', 'and status shows it')
end)


-- Terms and a DCS that goes back (failover/terms.lua) ---------------------------------

local function rejoin_calls(n)
    local out = {}
    for _, call in ipairs(n.box.calls) do
        if call:match('^rejoin ') then
            table.insert(out, call)
        end
    end
    return out
end

local function writable_count(list)
    local w = 0
    for _, n in ipairs(list) do
        if n.fo.writable() then
            w = w + 1
        end
    end
    return w
end

test:test('terms count leader changes, are kept durably, and a restart starts from them', function(t)
    t:plan(7)
    local fake, a, b, c = cluster(3)
    run_for({a, b, c}, 1)
    t:is(a.fo.term, 1, 'the first leader has term 1')
    t:is(b.fo:status().term, 1, 'its followers report term 1')
    a.frozen = true
    run_for({a, b, c}, TTL + 2)
    local l = leader_of({b, c})
    t:is(l and l.fo.term, 2, 'the next leader has term 2: a leader change, not an etcd revision')
    t:is(json.decode(fake.kv[LEADER_KEY].value).term, 2, 'the key says so')
    t:is(c.fo.store.data.term, 2, 'each instance wrote the highest term it saw to its store')
    local again = new_node(fake, 'c2', 'cccc', 3, 2, {store = c.fo.store})
    t:is(again.fo.max_term, 2, 'a restarted instance starts from the term it recorded')
    t:ok(l and json.decode(fake.kv['/smartcache/test/members/' .. l.box.uuid_].value).seen_term == 2,
        'members publish the highest term they have seen')
end)

test:test('an etcd restored from an older snapshot: nobody obeys its stale key, the named former leader included',
    function(t)
    t:plan(10)
    local fake, a, b, c = cluster(3)
    local all = {a, b, c}
    for _, n in ipairs(all) do
        n.box.vc = {[1] = 10}
    end
    run_for(all, 1)
    t:is(a.fo.role, 'leader', 'a leads term 1')
    local snap = fake:snapshot()  -- its leader key names a, on the lease a still holds
    T.on_sleep = function()
        for _, n in ipairs({b, c}) do
            n.fo:lease_step()
            n.fo:control_step()
        end
    end
    t:is(a.fo:switchover('bbbb', 5).status, 'OK', 'switched over to b (term 2)')
    T.on_sleep = nil
    run_for(all, 1)
    b.box.vc, c.box.vc = {[1] = 10, [2] = 40}, {[1] = 10, [2] = 40}  -- b writes; a lags behind
    run_for(all, 1)
    fake:restore(snap)
    local restored_at = T.now
    local worst, a_wrote, first_at, said = 0, false, nil, nil
    while T.now < restored_at + 3 * TTL do
        advance(POLL)
        round(all)
        worst = math.max(worst, writable_count(all))
        a_wrote = a_wrote or a.fo.writable()
        said = said or a.fo:status().dcs_regressed
        if first_at == nil and leader_of(all) ~= nil then
            first_at = T.now
        end
    end
    t:is(a_wrote, false, 'the former leader the restored key names never took writes')
    t:ok(worst <= 1, 'never two writable')
    t:like(tostring(said), 'term 1 names aaaa, term 2 was seen', 'the stale key is reported: ' .. tostring(said))
    t:ok(first_at ~= nil and first_at >= restored_at + TTL + MARGIN,
        string.format('no leader until TTL + margin after the rollback (%.2f s)', (first_at or 0) - restored_at))
    local l = leader_of(all)
    t:ok(l == b or l == c, 'a member with every acknowledged row leads: ' .. tostring(l and l.name))
    t:ok(l ~= nil and l.fo.term >= 3, 'in a new term above every term seen: ' .. tostring(l and l.fo.term))
    t:ok(a.fo.counters.dcs_regressions >= 1 and b.fo.counters.dcs_regressions >= 1
         and c.fo.counters.dcs_regressions >= 1, 'each instance counted it')
    t:is(a.fo.role, 'follower', 'and the former leader follows')
end)

test:test('a wiped etcd with the leader frozen: no election until every earlier lease has passed', function(t)
    t:plan(8)
    local fake, a, b, c = cluster(3)
    local all = {a, b, c}
    run_for(all, 1)
    t:is(a.fo.role, 'leader', 'a leads term 1')
    advance(TTL / 3)
    a.fo:lease_step()  -- renewed just now: its lease has TTL - margin to run
    local a_deadline = a.fo.deadline
    a.frozen = true
    fake:wipe()
    local wiped_at = T.now
    local first_at
    while first_at == nil and T.now < wiped_at + 4 * TTL do
        advance(POLL)
        round(all)
        if leader_of({b, c}) ~= nil then
            first_at = T.now
        end
    end
    t:ok(first_at ~= nil and first_at >= wiped_at + TTL + MARGIN,
        string.format('no leader until TTL + margin after the wipe (%.2f s)', (first_at or 0) - wiped_at))
    t:ok(first_at ~= nil and first_at > a_deadline, 'the frozen leader could no longer write by then')
    t:ok(b.fo.counters.dcs_regressions >= 1 and c.fo.counters.dcs_regressions >= 1, 'the loss was counted')
    t:ok(fake.kv['/smartcache/test/replicaset'] ~= nil, 'the replica set is recorded again')
    a.frozen = false  -- resumes after the new key appeared
    t:is(a.fo.writable(), false, 'the resumed leader does not write')
    run_for(all, 2, t)
    t:ok(leader_of(all).fo.term == 2, 'the new leader has term 2: terms did not go back with etcd')
end)

test:test('an etcd restored to a snapshot that still holds the current key: reported, and the same leader leads',
    function(t)
    t:plan(5)
    local fake, a, b, c = cluster(3)
    local all = {a, b, c}
    run_for(all, 1)
    t:is(a.fo.role, 'leader', 'a leads term 1')
    local snap = fake:snapshot()
    run_for(all, 2)  -- members republish: the revision grows past the snapshot's
    fake:restore(snap)
    local worst = 0
    for _ = 1, 10 do
        advance(POLL)
        round(all)
        worst = math.max(worst, writable_count(all))
    end
    t:ok(worst <= 1, 'never two writable')
    t:ok(b.fo.counters.dcs_regressions >= 1, 'the lower revision was seen and counted')
    t:is(leader_of(all), a, 'the key is not stale: its leader leads again, no election needed')
    t:is(a.fo.term, 1, 'in the same term')
end)

test:test('members stop replicating before publishing for an election: a row the old leader then sends reaches no one',
    function(t)
    t:plan(7)
    local fake, a, b, c = cluster(3)
    local all = {a, b, c}
    for _, n in ipairs(all) do
        n.box.vc = {[1] = 87870}
    end
    run_for(all, 1)
    t:is(a.fo.role, 'leader', 'a leads')
    a.frozen = true
    -- The moment the first member publishes a final vclock, a resumes and sends one more
    -- row to whoever still replicates from it.
    local sent, following_at_publish = false, {}
    local handle = fake.handle
    fake.handle = function(self, path, body)
        if path == '/v3/kv/put' then
            local rec = json.decode(d(body.value))
            if rec.final then
                table.insert(following_at_publish, nodes[rec.uri:match('^(%w+):')].box.following or 'nobody')
            end
            if not sent and rec.final and rec.uuid ~= 'aaaa' then
                sent = true
                a.frozen = false
                a.box.vc = {[1] = 87871}
                for _, n in ipairs({b, c}) do
                    if n.box.following == a.box.uri then
                        n.box.vc = {[1] = 87871}
                    end
                end
            end
        end
        return handle(self, path, body)
    end
    run_for(all, 3 * TTL, t)
    fake.handle = handle
    t:ok(sent, 'the old leader sent its row during the election')
    local ok = #following_at_publish > 0
    for _, f in ipairs(following_at_publish) do
        ok = ok and f == 'nobody'
    end
    t:ok(ok, 'every final vclock was published replicating from nobody')
    local diverged = {}
    for _, n in ipairs({b, c}) do
        if n.fo.diverged ~= nil then
            table.insert(diverged, n.name .. ': ' .. n.fo.diverged)
        end
    end
    t:is(table.concat(diverged, '; '), '', 'no follower DIVERGED: the new leader has its quorum')
    local l = leader_of({b, c})
    t:ok(l ~= nil and l.box.vc[1] == 87870 and (b.box.vc[1] == 87870 and c.box.vc[1] == 87870),
        'the new leader has every row any follower has')
    -- The old leader's own row (written before the freeze, acknowledged by nobody) is beyond the key:
    -- it proves that and rebuilds itself, no person needed.
    t:ok(a.fo.diverged == nil or #rejoin_calls(a) == 1, 'the old leader follows, or rebuilds itself: '
        .. tostring(a.fo.diverged))
end)

test:test('election order: the newest data_term first, then the vclock sum, then the smallest uuid', function(t)
    t:plan(4)
    local vclock = require('smartcache.failover.vclock')
    local old = {uuid = 'aaaa', data_term = 3, vclock = {[1] = 50}}
    local new = {uuid = 'bbbb', data_term = 5, vclock = {[1] = 40, [2] = 2}}
    t:ok(vclock.better(new, old), 'every row of term 5 beats more rows of term 3 (nobody acknowledged those)')
    t:ok(not vclock.better(old, new), 'and not the other way')
    t:ok(vclock.better({uuid = 'b', data_term = 5, vclock = {[1] = 9}},
        {uuid = 'a', data_term = 5, vclock = {[1] = 8}}), 'same term: more rows')
    t:ok(vclock.better({uuid = 'a', vclock = {[1] = 8}}, {uuid = 'b', vclock = {[1] = 8}}), 'then the smaller uuid')
end)

-- One slow follower (failover/sync_quorum.lua) -----------------------------------------

test:test('a follower that stops acknowledging leaves the synchronous quorum, never below a majority, and comes back',
    function(t)
    t:plan(8)
    local _, a, b, c = cluster(3)
    run_for({a, b, c}, 1)
    a.fo:quorum_step()
    t:is(a.box.quorum, 3, 'both followers acknowledge: 3')
    local function write(followers, seconds)
        local until_t = T.now + seconds
        while T.now < until_t do
            advance(0.05)
            a.box.vc[1] = (a.box.vc[1] or 0) + 1
            for _, f in ipairs(followers) do
                f.box.vc[1] = a.box.vc[1]
            end
            a.fo:quorum_step()
        end
    end
    local t0 = T.now
    local lowered_at
    while lowered_at == nil and T.now < t0 + 2 do
        write({b}, 0.05)  -- c is frozen: it acknowledges nothing more
        if a.box.quorum == 2 then
            lowered_at = T.now
        end
    end
    t:ok(lowered_at ~= nil and lowered_at - t0 <= a.fo.slow_follower + 0.1,
        string.format('lowered to 2 after %.2f s', (lowered_at or 99) - t0))
    t:is(a.fo:status().slow_followers[1], 'cccc', 'status names the follower that stopped acknowledging')
    t:is(a.fo.counters.quorum_lowerings, 1, 'counted')
    write({}, 1)  -- b stalls too
    t:is(a.box.quorum, 2, 'never below the configured majority')
    write({b, c}, 0.1)  -- both caught up
    t:is(a.box.quorum, 3, 'back to every follower once they acknowledge again')
    advance(10)  -- nothing written: idle followers acknowledge only heartbeats
    a.fo:quorum_step()
    t:is(a.box.quorum, 3, 'idle followers with every row stay in the quorum')
    t:is(#a.fo:status().slow_followers, 0, 'and none is reported slow')
end)

-- Rebuilding by itself (failover/rejoin.lua) ----------------------------------------------

test:test('the auto-rejoin proof holds for own rows written while leading, beyond the key, and refuses otherwise',
    function(t)
    t:plan(9)
    local proof = require('smartcache.failover.rejoin').proof
    local function case(over)
        local a = {mine = {[1] = 25, [2] = 7}, own_id = 1, replicaset = 'rs', led = {term = 4, from_lsn = 15},
                   leader = {term = 5, id = 2, vclock = {[1] = 20, [2] = 7}, replicaset = 'rs'}}
        for k, v in pairs(over) do
            a[k] = v
        end
        return proof(a)
    end
    local ok, why = case({})
    t:ok(ok, 'own rows 21..25 of term 4, key of term 5: never acknowledged: ' .. tostring(why))
    t:is(select(2, case({mine = {[1] = 25, [2] = 7, [3] = 4}})):match('^rows of instance 3') ~= nil, true,
        'refused: rows of another instance beyond the key')
    t:like(select(2, case({led = {term = 4, from_lsn = 21}})), 'from before term 4',
        'refused: rows of a term it did not lead')
    t:like(select(2, case({led = box.NULL})), 'no record of a term', 'refused: no record of leading')
    t:like(select(2, case({led = {term = 5, from_lsn = 15}})), 'not after term 5',
        'refused: the key is not of a later term')
    t:like(select(2, case({regressed_term = 4})), 'DCS went back', 'refused: the DCS went back since it led')
    t:like(select(2, case({leader = {term = 5, id = 2, vclock = {}, vclock_unreadable = true}})), 'cannot be read',
        'refused: a key vclock it cannot read')
    t:like(select(2, case({replicaset = 'other'})), 'another replica set', 'refused: another replica set')
    t:like(select(2, case({mine = {[1] = 20, [2] = 9}})), 'no rows of our own', 'refused: nothing of its own beyond')
end)

local function diverge_old_leader(extra)
    local _, a, b, c = cluster(3)
    if extra then
        a.fo.auto_rejoin = extra.auto_rejoin ~= false
    end
    a.box.vc, b.box.vc, c.box.vc = {[1] = 20}, {[1] = 20}, {[1] = 20}
    run_for({a, b, c}, 1)
    a.box.vc = {[1] = 25}  -- written as leader of term 1, never replicated
    if extra and extra.foreign then
        a.box.vc[3] = 4  -- rows of instance 3 that nobody else has
    end
    a.frozen = true
    run_for({a, b, c}, TTL + 1)
    a.frozen = false
    run_for({a, b, c}, 2)
    return a, b
end


test:test('an old leader that comes back DIVERGED with only unacknowledged rows of its own term rebuilds itself',
    function(t)
    t:plan(4)
    local a, b = diverge_old_leader()
    t:is(b.fo.role, 'leader', 'b leads term 2')
    t:is(a.fo.role, 'diverged', 'a is DIVERGED')
    t:is(#rejoin_calls(a), 1, 'and asked for its rebuild once: ' .. tostring(rejoin_calls(a)[1]))
    t:is(a.fo.counters.auto_rejoins, 1, 'counted')
end)

test:test('auto-rejoin stays DIVERGED where the proof fails, and when SC_AUTO_REJOIN is false', function(t)
    t:plan(4)
    local a = diverge_old_leader({foreign = true})
    t:is(a.fo.role, 'diverged', 'rows of another instance: DIVERGED')
    t:is(#rejoin_calls(a), 0, 'not rebuilt')
    t:like(a.fo:status().rejoin_refused, 'rows of instance 3', 'status says why')
    a = diverge_old_leader({auto_rejoin = false})
    t:is(#rejoin_calls(a), 0, 'SC_AUTO_REJOIN=false: only cluster rejoin rebuilds it')
end)

test:test('a follower whose applier stops on a conflict again after a reconnect rebuilds itself from the leader',
    function(t)
    t:plan(6)
    local _, a, b = cluster(2)
    run_for({a, b}, 1)
    t:is(b.fo.role, 'follower', 'b follows')
    local dup = "Duplicate key exists in unique index 'primary' in space 'events_20261206'"
    b.box.upstream_ = {status = 'stopped', message = dup}
    run_for({a, b}, 0.4)
    t:is(b.fo.counters.reconnects, 1, 'the first stop: reconnected')
    t:is(#rejoin_calls(b), 0, 'not rebuilt yet: a reconnect may be enough')
    run_for({a, b}, 1)  -- it stopped on the same row again
    t:is(#rejoin_calls(b), 1, 'then rebuilt, once: ' .. tostring(rejoin_calls(b)[1]))
    t:is(b.fo.counters.conflict_rebuilds, 1, 'counted')
    t:like(rejoin_calls(b)[1] or '', 'rolled back, never acknowledged', 'the reason says why nothing is lost')
end)

test:test('a follower stopped on a conflict with SC_AUTO_REJOIN=false says what a person must check', function(t)
    t:plan(3)
    local _, a, b = cluster(2)
    b.fo.auto_rejoin = false
    run_for({a, b}, 1)
    b.box.upstream_ = {status = 'stopped', message = "Duplicate key exists in unique index 'primary'"}
    run_for({a, b}, 2)
    t:is(#rejoin_calls(b), 0, 'not rebuilt')
    t:like(b.fo:status().rejoin_refused, 'Check: the leader leads', 'status names the check')
    b.box.upstream_ = {status = 'stopped', message = 'Failed to write to disk'}
    b.fo.auto_rejoin = true
    b.fo.rejoin_refused = nil
    run_for({a, b}, 2)
    t:is(#rejoin_calls(b), 0, 'a disk error is no conflict: reconnected, never rebuilt')
end)

test:test("the quorum's proof: the leader and enough followers of its term show they lack the rows", function(t)
    t:plan(6)
    local qp = require('smartcache.failover.rejoin').quorum_proof
    local function case(members, over)
        local a = {mine = {[1] = 25, [2] = 7}, own_id = 1, count = 3, floor = 2,
                   leader = {uuid = 'bbbb', term = 5, id = 2, vclock = {[1] = 20, [2] = 7}}, members = members}
        for k, v in pairs(over or {}) do
            a[k] = v
        end
        return qp(a)
    end
    local follower = {role = 'follower', term = 5, vclock = {[1] = 20, [2] = 9}}
    local ok, why = case({bbbb = {role = 'leader', term = 5}, cccc = follower})
    t:ok(ok, 'the leader and one follower of term 5: no quorum of 2 of 3 held rows 21..25: ' .. tostring(why))
    t:like(select(2, case({cccc = {role = 'follower', term = 5, vclock = {[1] = 22}}})), '1 of the 3 members',
        'refused: the follower holds some of them')
    t:like(select(2, case({cccc = {role = 'follower', term = 4, vclock = {[1] = 20}}})), '1 of the 3 members',
        'refused: a record of an earlier term (stale, or a restored etcd)')
    t:like(select(2, case({cccc = {role = 'diverged', term = 5, vclock = {[1] = 20}, reason = 'x'}})),
        '1 of the 3 members', 'refused: a DIVERGED member proves nothing')
    t:like(select(2, case({cccc = follower}, {mine = {[1] = 25, [3] = 1}})), 'rows of instance 3',
        'refused: rows of another instance')
    t:ok(case({c = follower, d = follower}, {count = 5, floor = 3}),
        'five members, quorum 3: the leader and two followers are enough')
end)

test:test('an old leader frozen across an etcd wipe comes back DIVERGED and rebuilds itself by the quorum proof',
    function(t)
    t:plan(5)
    local fake, a, b, c = cluster(3)
    local all = {a, b, c}
    a.box.vc, b.box.vc, c.box.vc = {[1] = 20}, {[1] = 20}, {[1] = 20}
    run_for(all, 1)
    t:is(a.fo.role, 'leader', 'a leads term 1')
    fake.revision = fake.revision + 100000  -- a long-running etcd: its revision is far past a fresh one's
    run_for(all, 1)
    a.box.vc = {[1] = 25}  -- written as leader, never replicated (the quorum never had them)
    a.frozen = true
    fake:wipe()
    run_for({b, c}, 4 * TTL)
    local l = leader_of({b, c})
    t:ok(l ~= nil and l.fo.term == 2, 'a new leader of term 2')
    a.frozen = false
    run_for(all, 2)
    t:ok(a.fo.counters.dcs_regressions >= 1, 'the old leader saw the DCS go back')
    t:is(#rejoin_calls(a), 1, 'and still rebuilt itself: ' .. tostring(a.fo.rejoin_refused))
    t:like(rejoin_calls(a)[1] or '', 'auto: ', 'by itself')
end)

test:test('set-aside directories: a bounded count, the oldest removed first', function(t)
    t:plan(5)
    local rejoin = require('smartcache.failover.rejoin')
    local dir = fio.tempdir()
    for _, n in ipairs({'aside-20200101T000000-1', 'aside-20210101T000000-1', 'aside-20220101T000000-1'}) do
        fio.mktree(fio.pathjoin(dir, n))
    end
    t:is(rejoin.set_aside(dir, 2, quiet), nil, 'nothing without the marker')
    for _, f in ipairs({'00000000000000000001.xlog', '00000000000000000001.snap', rejoin.MARKER}) do
        local fh = fio.open(fio.pathjoin(dir, f), {'O_WRONLY', 'O_CREAT'}, tonumber('644', 8))
        fh:close()
    end
    local store = failover.file_store(dir)
    store.save({term = 7, leader_uuid = 'bbbb', rev = 90, data_term = 7, led = {term = 6, from_lsn = 3}})
    local r = rejoin.set_aside(dir, 2, quiet)
    t:is(r.moved, 2, 'the WAL and the snapshot moved aside')
    local st = store.load()
    t:ok(st.term == 7 and st.data_term == 0 and st.led == nil,
        'the terms stay; data_term and the term led go with the data')
    t:is(r.removed, 2, 'the two oldest set-aside directories removed')
    local left = fio.glob(fio.pathjoin(dir, 'aside-*'))
    table.sort(left)
    t:is_deeply({#left, fio.basename(left[1])}, {2, 'aside-20220101T000000-1'}, 'the newest kept')
    fio.rmtree(dir)
end)

test:test('concurrent saves of the terms all land, the newest last', function(t)
    t:plan(3)
    reset()
    local dir = fio.tempdir()
    local fake = new_fake()
    local n = new_node(fake, 'a', 'aaaa', 1, 2, {store = failover.file_store(dir)})
    local results, done = {}, fiber.channel(8)
    for i = 1, 8 do
        fiber.create(function()
            n.fo.max_term = math.max(n.fo.max_term, i)
            table.insert(results, n.fo:save_terms())
            done:put(true)
        end)
    end
    for _ = 1, 8 do
        done:get(5)
    end
    t:is(#results, 8, 'every save returned')
    local all_ok = true
    for _, ok in ipairs(results) do
        all_ok = all_ok and ok
    end
    t:ok(all_ok, 'none failed (a shared temporary file made the second rename fail)')
    t:is(failover.file_store(dir).load().term, 8, 'the file holds the newest term')
    fio.rmtree(dir)
end)

-- Topology: the members as data in etcd (failover/topology.lua, failover/membership.lua) --------

local topology = require('smartcache.failover.topology')
local TOPOLOGY_KEY = '/smartcache/test/topology'

-- Put a topology into the fake etcd: addresses (a member each; 'x!' not eligible, 'x-' leaving).
local function put_topology(fake, version, addresses)
    local members = {}
    for _, a in ipairs(addresses) do
        local name, flag = a:match('^(%a+)([!%-]?)$')
        table.insert(members, {address = name .. ':3301', eligible = flag ~= '!', leaving = flag == '-'})
    end
    fake:do_put(TOPOLOGY_KEY, topology.encode({version = version, members = members}))
end

local function stored_topology(fake)
    local e = fake.kv[TOPOLOGY_KEY]
    return e and topology.decode(e.value)
end

local function names(t)
    local out = {}
    for _, m in ipairs(t and t.members or {}) do
        table.insert(out, m.address:match('^(%a+)') .. (m.leaving and '-' or '') .. (m.eligible and '' or '!'))
    end
    return table.concat(out, ',')
end

-- A three-member cluster, formed (a leads), and sleeps that let every node run meanwhile.
local function formed(n)
    local fake, a, b, c, dd = cluster(n or 3)
    local list = {a, b, c, dd}
    run_for(list, 1)
    concurrently(list)
    return fake, a, b, c, dd
end

test:test('no topology: the majority and the quorum come from the configuration, as before', function(t)
    t:plan(6)
    local fake, a, b, c = formed()
    T.on_sleep = nil
    t:is(fake.kv[TOPOLOGY_KEY], nil, 'etcd holds no topology')
    local st = a.fo:status()
    t:ok(st.topology_version == box.NULL and st.registered == box.NULL, 'status: no topology, no registration')
    t:is(st.majority, a.fo.election_quorum, 'the election majority is the configured one')
    a.fo:quorum_step()
    t:is(a.box.quorum, 3, 'every attached follower counts (two followers: 3)')
    c.box.following = nil
    a.fo:quorum_step()
    t:is(a.box.quorum, 2, 'never below the configured quorum')
    t:ok(b.fo.role == 'follower' and c.fo.role == 'follower', 'any instance follows')
end)

test:test('a topology makes the majority and the quorum floor: a majority of its members, eligible or not',
    function(t)
    t:plan(7)
    local fake, a, b, c = formed()
    T.on_sleep = nil
    put_topology(fake, 1, {'a', 'b', 'c', 'd!'})  -- d: listed, not eligible, not running
    run_for({a, b, c}, 0.5)
    t:is(a.fo:election_majority(), 3, 'four members (one not eligible): a majority is 3')
    t:is(a.fo:quorum_floor(), 3, 'and so is the floor of the synchronous quorum')
    a.fo:quorum_step()
    t:is(a.box.quorum, 3, 'two followers acknowledging: 3')
    c.box.following = nil
    a.fo:quorum_step()
    t:is(a.box.quorum, 3, 'one acknowledging: still 3, a majority of four (no topology: 2)')
    put_topology(fake, 2, {'a', 'b', 'c', 'd!', 'e!'})
    run_for({a, b}, 0.5)
    t:is(a.fo:status().majority, 3, 'five members, two not eligible: 3')
    t:is(a.fo:status().topology_members, 5, 'status: five members')
    t:is(b.fo:status().topology_version, 2, 'every member acts on the newest version')
end)

test:test('a member listed not eligible counts in the majority and never leads', function(t)
    t:plan(3)
    local fake, a, b, c = formed()
    T.on_sleep = nil
    put_topology(fake, 1, {'a', 'b', 'c!'})
    run_for({a, b, c}, 0.5)
    t:is(c.fo:eligible(), false, 'c is not eligible')
    a.frozen = true
    c.box.vc = {[1] = 0}
    run_for({a, b, c}, TTL + 2, t)
    t:is(leader_of({b, c}), b, 'b wins with c: two of three members, c counted though not eligible')
end)

test:test('an instance absent from the topology never replicates, and follows once it is added', function(t)
    t:plan(10)
    local fake, a, b, c = formed()
    T.on_sleep = nil
    put_topology(fake, 1, {'a', 'b'})
    local followed = false
    for _ = 1, 10 do
        run_for({a, b, c}, POLL)
        followed = followed or c.box.following ~= nil
    end
    t:is(c.fo.role, 'unregistered', 'c is unregistered')
    t:ok(not followed and c.box.ro, 'it replicates from nobody and is read-only')
    local rec = json.decode(fake.kv['/smartcache/test/members/cccc'].value)
    t:ok(rec.role == 'unregistered' and rec.eligible == false and rec.registered == 'absent',
        'its member record says so')
    t:like(c.fo.decisions.control or c.fo:control_step(), '^unregistered: c:3301 is not in topology version 1',
        'its decision says why')
    a.fo:quorum_step()
    t:is(a.box.quorum, 2, 'the leader: one follower, a majority of two')
    -- Say c has not seen the topology yet and still replicates: its acknowledgements do not count.
    c.box.following = a.box.uri
    c.box.vc = a.box.vclock()
    a.fo:quorum_step()
    t:is(a.box.quorum, 3, 'an unregistered follower adds one to the quorum instead of counting in it')
    t:is(a.fo:status().unregistered_followers[1], 'cccc', 'status names it')
    c.box.following = nil
    -- Elections ignore it: it never wins, and is never waited for.
    c.box.vc = {[1] = 999}
    a.frozen = true
    run_for({a, b, c}, TTL + 2, t)
    t:is(leader_of({b, c}), nil, 'b alone is not a majority of {a, b}; c does not count')
    a.frozen = false
    put_topology(fake, 2, {'a', 'b', 'c'})
    c.box.vc = {}
    run_for({a, b, c}, 1)
    t:is(c.fo.role, 'follower', 'added: c follows the leader')
end)

test:test('an empty instance joins only once it is a member of a topology that exists', function(t)
    t:plan(5)
    local kv = {value = topology.encode({version = 3, members = {{address = 'a:3301'}, {address = 'b:3301'}}})}
    t:is(topology.boot_registration(false, 'c:3301', nil), nil, 'no topology: join as before')
    t:is(topology.boot_registration(kv, 'a:3301', nil), 'member', 'a member joins')
    local reg, why = topology.boot_registration(kv, 'c:3301', nil)
    t:ok(reg == 'absent' and why:find('cluster add c:3301', 1, true) ~= nil, 'absent: waits, and says what to run')
    local known = topology.decode(topology.encode({version = 4, members = {{address = 'a:3301'}}}))
    t:is(topology.boot_registration(false, 'b:3301', known), 'absent', 'etcd lost it: the terms file knows')
    t:is(topology.boot_registration(kv, 'b:3301', known), 'absent', 'etcd holds an older one: the newer counts')
end)

test:test('cluster init makes the first topology from the live members, once; refused while some are missing',
    function(t)
    t:plan(5)
    local fake, a = formed()
    a.fo.cluster_size = 4
    t:is(a.fo:topology_init().reason, 'INCOMPLETE', 'three live of SC_CLUSTER_SIZE 4: refused')
    a.fo.cluster_size = 3
    local r = a.fo:topology_init()
    t:ok(r.status == 'OK' and r.created, 'created')
    t:is(names(stored_topology(fake)), 'a,b,c', 'of the three live members')
    t:is(#r.not_applied_by, 0, 'every member acts on it when init answers')
    r = a.fo:topology_init()
    t:ok(r.status == 'OK' and not r.created and stored_topology(fake).version == 1, 'again: nothing changes')
    T.on_sleep = nil
end)

test:test('cluster add: a fourth instance waits unregistered, then joins and counts in the quorum', function(t)
    t:plan(7)
    local fake, a, b, c, dd = formed(4)
    T.on_sleep = nil
    dd.box.following = nil
    put_topology(fake, 1, {'a', 'b', 'c'})
    run_for({a, b, c, dd}, 1)
    t:is(dd.fo.role, 'unregistered', 'd is not a member yet')
    concurrently({a, b, c, dd})
    local r = a.fo:topology_add('d:3301', 8304)
    t:ok(r.status == 'OK' and r.version == 2, 'added: version 2')
    t:is(names(stored_topology(fake)), 'a,b,c,d', 'd is listed')
    T.on_sleep = nil
    run_for({a, b, c, dd}, 1)
    t:is(dd.fo.role, 'follower', 'd follows the leader')
    a.fo:quorum_step()
    t:is(a.box.quorum, 4, 'three followers acknowledging: 4')
    c.box.following = nil
    a.fo:quorum_step()
    t:is(a.box.quorum, 3, 'one stops: 3, a majority of four, so a write needs d')
    t:is(stored_topology(fake).members[4].http_port, 8304, 'its HTTP port is recorded')
end)

test:test('the leader refuses to be removed; changes go through the leader; precise answers', function(t)
    t:plan(7)
    local fake, a, b = formed()
    t:is(a.fo:topology_init().status, 'OK', 'a topology')
    local r = a.fo:topology_remove('a:3301', 1)
    t:ok(r.reason == 'IS_LEADER' and r.message:find('switch over first', 1, true) ~= nil,
        'the leader: switch over first')
    t:is(names(stored_topology(fake)), 'a,b,c', 'nothing changed')
    t:is(b.fo:topology_remove('c:3301', 1).status, 'NOT_LEADER', 'a follower changes nothing')
    t:is(a.fo:topology_add('b:3301').reason, 'ALREADY_MEMBER', 'add of a member: already a member')
    t:is(a.fo:topology_remove('z:3301', 1).reason, 'NOT_MEMBER', 'remove of another: not a member')
    fake.down = true
    t:is(a.fo:topology_add('z:3301').reason, 'ETCD_UNAVAILABLE', 'etcd down: etcd unavailable')
    fake.down = false
    T.on_sleep = nil
end)

test:test('a change that loses its compare-and-swap reads again and retries', function(t)
    t:plan(2)
    local fake, a = formed()
    a.fo:topology_init()
    local handle, raced = fake.handle, false
    fake.handle = function(self, path, body)
        if path == '/v3/kv/txn' and not raced and #(body.compare or {}) == 2
                and digest.base64_decode(body.compare[1].key) == TOPOLOGY_KEY then
            raced = true
            self:do_put(TOPOLOGY_KEY, self.kv[TOPOLOGY_KEY].value)  -- someone else wrote it meanwhile
        end
        return handle(self, path, body)
    end
    local r = a.fo:topology_add('d:3301')
    fake.handle = handle
    T.on_sleep = nil
    t:ok(raced and r.status == 'OK', 'added after the lost race')
    t:is(names(stored_topology(fake)), 'a,b,c,d', 'once')
end)

test:test('a removed follower leaves the quorum before the topology changes, and never replicates again',
    function(t)
    t:plan(9)
    local fake, a, b, c = formed()
    a.fo:topology_init()
    -- What the other instances did when each version was written.
    local seen = {}
    local do_put = fake.do_put
    fake.do_put = function(self, k, v, lease)
        if k == TOPOLOGY_KEY then
            table.insert(seen, {t = topology.decode(v), c_follows = c.box.following ~= nil, c_role = c.fo.role,
                                floor = a.fo:quorum_floor()})
        end
        return do_put(self, k, v, lease)
    end
    local r = a.fo:topology_remove('c:3301', 5)
    fake.do_put = do_put
    T.on_sleep = nil
    t:is(r.status, 'OK', 'removed: ' .. tostring(r.message))
    t:is(#seen, 2, 'in two writes')
    t:is(names(seen[1].t), 'a,b,c-', 'first c is marked leaving')
    t:ok(seen[1].c_follows, 'while it still replicated')
    t:ok(not seen[2].c_follows and seen[2].c_role == 'unregistered',
        'then it is out: unregistered, replicating from nobody, before the list changes')
    t:is(seen[2].floor, 2, 'leaving, c still counted in the majority of three')
    t:is(names(stored_topology(fake)), 'a,b', 'then the list has two members')
    local followed = false
    for _ = 1, 10 do
        run_for({a, b, c}, POLL)
        followed = followed or c.box.following ~= nil
    end
    t:ok(not followed and c.fo.role == 'unregistered', 'c never replicates again')
    a.fo:quorum_step()
    t:is(a.box.quorum, 2, 'the quorum: a majority of two')
end)

test:test('a removal whose member does not let go times out, and its acknowledgements do not count meanwhile',
    function(t)
    t:plan(4)
    local fake, a, b, c = formed()
    a.fo:topology_init()
    c.frozen = true  -- it never sees it is leaving, and its box still replicates
    local r = a.fo:topology_remove('c:3301', 1)
    T.on_sleep = nil
    t:is(r.status, 'TIMEOUT', 'timed out: ' .. tostring(r.message))
    t:is(names(stored_topology(fake)), 'a,b,c-', 'c stays marked leaving')
    a.fo:quorum_step()
    t:is(a.box.quorum, 3, "its acknowledgements add one to the quorum: a majority of three plus c's")
    c.frozen = false
    run_for({a, b, c}, 0.5)
    concurrently({a, b, c})
    t:is(a.fo:topology_remove('c:3301', 5).status, 'OK', 'once it lets go, removing it again finishes')
    T.on_sleep = nil
    local _ = b
end)

test:test('a leader that finds itself out of the topology steps down and frees the key', function(t)
    t:plan(4)
    local fake, a, b, c = formed()
    T.on_sleep = nil
    put_topology(fake, 1, {'b', 'c'})
    run_for({a, b, c}, 0.5)
    t:is(a.fo.role, 'unregistered', 'a is unregistered')
    t:is(a.box.ro, true, 'read-only')
    run_for({a, b, c}, TTL + 2, t)
    t:ok(leader_of({b, c}) ~= nil, 'a member leads')
end)

test:test('an election counts against the topology it read: a change meanwhile makes it count again', function(t)
    t:plan(2)
    local fake, a, b, c = formed()
    T.on_sleep = nil
    put_topology(fake, 1, {'a', 'b', 'c'})
    run_for({a, b, c}, 0.5)
    a.frozen = true
    local handle, changed = fake.handle, false
    fake.handle = function(self, path, body)
        if path == '/v3/kv/txn' and not changed and #(body.compare or {}) == 2
                and body.compare[1].target == 'CREATE' then
            changed = true
            put_topology(self, 2, {'a', 'b', 'c'})  -- a new version (a member added and removed, say)
        end
        return handle(self, path, body)
    end
    run_for({a, b, c}, TTL + 2)
    fake.handle = handle
    t:ok(changed, 'the topology changed as a member took the key')
    t:ok(leader_of({b, c}) ~= nil and leader_of({b, c}).fo.topology.version == 2,
        'the winner counted again, against version 2')
end)

test:test('etcd losing the topology: every member acts on the newest it saw, and the leader writes it back',
    function(t)
    t:plan(4)
    local fake, a, b = formed()
    a.fo:topology_init()
    T.on_sleep = nil
    fake.kv[TOPOLOGY_KEY] = nil
    fake.revision = fake.revision + 1
    b.fo:control_step()
    t:like(b.fo:status().topology_problem, 'etcd has no topology; version 1 was seen', 'a follower says so')
    t:is(b.fo:status().topology_version, 1, 'and acts on version 1')
    run_for({a, b}, 2)
    t:is(names(stored_topology(fake)), 'a,b,c', 'the leader wrote it back')
    t:is(b.fo:status().topology_problem, box.NULL, 'the problem clears')
end)

os.exit(test:check() and 0 or 1)
