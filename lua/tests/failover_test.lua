#!/usr/bin/env tarantool
-- The lease / fence / election state machine (smartcache.failover) and the
-- etcd gateway client (smartcache.etcd), against a fake etcd behind a fake
-- http client, with an injected clock: no sockets, no box.cfg, no waiting.
-- Runnable alone: `cd lua && tarantool tests/failover_test.lua`.
local tap = require('tap')
local fiber = require('fiber')
local json = require('json')
local digest = require('digest')
local fio = require('fio')

local here = fio.dirname(fio.abspath(debug.getinfo(1, 'S').source:sub(2)))
package.path = fio.dirname(here) .. '/?.lua;' .. package.path

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

local function new_node(fake, name, uuid, id, quorum)
    local b = new_box(uuid, id, name .. ':3301')
    local inst = failover.new({
        etcd = etcd.new({endpoints = {'http://etcd:2379'}, http = fake, timeout = 1}),
        box = b, cluster = 'test', uri = b.uri, ttl = TTL, margin = MARGIN, poll = POLL, quorum = quorum or 2,
        clock = now, sleep = sleep, log = quiet, data_dir = '/nonexistent',
    })
    local n = {name = name, box = b, fo = inst}
    nodes[name] = n
    return n
end

local function reset()
    nodes = {}
    T.on_sleep = nil
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
test:plan(25)

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
    reset()
    local fake = new_fake()
    local a = new_node(fake, 'a', 'aaaa', 1, 1)
    t:is(a.fo.writable(), false, 'not writable before anything')
    round({a})
    t:is(a.fo.role, 'leader', 'leader after one round')
    t:ok(a.fo.writable(), 'writable')
    t:is(a.box.ro, false, 'box read-write')
    t:is(table.concat(a.box.calls, ','), 'clear_synchro_queue,read_write,on_promote',
        'clear_synchro_queue before read-write, admin writes last')
    local kv = fake.kv[LEADER_KEY]
    t:is(json.decode(kv.value).uuid, 'aaaa', 'key holds our uuid')
    t:is(a.fo.term, kv.mod_revision, 'term is the key revision')
    t:ok(math.abs(a.fo:lease_left() - (TTL - MARGIN)) < 1e-6, 'deadline = t_sent + TTL - margin')
end)

test:test('keepalive moves the deadline from the time it was sent', function(t)
    t:plan(3)
    reset()
    local fake = new_fake()
    local a = new_node(fake, 'a', 'aaaa', 1, 1)
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
    reset()
    local fake = new_fake()
    local a = new_node(fake, 'a', 'aaaa', 1, 1)
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
    reset()
    local fake = new_fake()
    local a = new_node(fake, 'a', 'aaaa', 1, 1)
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
    reset()
    local fake = new_fake()
    local a = new_node(fake, 'a', 'aaaa', 1)
    local b = new_node(fake, 'b', 'bbbb', 2)
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
    reset()
    local fake = new_fake()
    local a = new_node(fake, 'a', 'aaaa', 1)
    local b = new_node(fake, 'b', 'bbbb', 2)
    local c = new_node(fake, 'c', 'cccc', 3)
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
    reset()
    local fake = new_fake()
    local a = new_node(fake, 'a', 'aaaa', 1)
    local b = new_node(fake, 'b', 'bbbb', 2)
    local c = new_node(fake, 'c', 'cccc', 3)
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
    reset()
    fake = new_fake()
    a = new_node(fake, 'a', 'aaaa', 1)
    b = new_node(fake, 'b', 'bbbb', 2)
    c = new_node(fake, 'c', 'cccc', 3)
    b.fo.candidate_allowed = false
    b.box.vc = {[1] = 50}
    run_for({a, b, c}, 1)
    t:is(leader_of({a, b, c}), a, 'SC_CANDIDATE=false never leads, even when ahead')
    -- Without a majority of eligible members, nobody is elected.
    reset()
    fake = new_fake()
    a = new_node(fake, 'a', 'aaaa', 1)
    b = new_node(fake, 'b', 'bbbb', 2)
    b.fo.candidate_allowed = false
    run_for({a, b}, 2)
    t:is(leader_of({a, b}), nil, 'one eligible member of a quorum of two does not elect itself')
end)

test:test('election waits for members whose published vclock may be stale', function(t)
    t:plan(3)
    reset()
    local fake = new_fake()
    local a = new_node(fake, 'a', 'aaaa', 1)
    local b = new_node(fake, 'b', 'bbbb', 2)
    local c = new_node(fake, 'c', 'cccc', 3)
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
    reset()
    local fake = new_fake()
    local a = new_node(fake, 'a', 'aaaa', 1)
    local b = new_node(fake, 'b', 'bbbb', 2)
    local c = new_node(fake, 'c', 'cccc', 3)
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
    reset()
    local fake = new_fake()
    local a = new_node(fake, 'a', 'aaaa', 1)
    local b = new_node(fake, 'b', 'bbbb', 2)
    local c = new_node(fake, 'c', 'cccc', 3)
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
    reset()
    local fake = new_fake()
    local a = new_node(fake, 'a', 'aaaa', 1)
    local b = new_node(fake, 'b', 'bbbb', 2)
    local c = new_node(fake, 'c', 'cccc', 3)
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
    reset()
    local fake = new_fake()
    local a = new_node(fake, 'a', 'aaaa', 1)
    local b = new_node(fake, 'b', 'bbbb', 2)
    run_for({a, b}, 1)
    a.box.vc = {[1] = 30}
    b.box.vc = {[1] = 1}
    local r = a.fo:switchover('bbbb', 0.3)
    t:is(r.status, 'TIMEOUT', 'TIMEOUT')
    t:is(a.fo.role, 'leader', 'a still leads')
    t:ok(a.fo.writable(), 'and writes again')
end)

test:test('promotion waits for a follower to replicate from the new leader before clearing the queue', function(t)
    t:plan(3)
    reset()
    local fake = new_fake()
    local a = new_node(fake, 'a', 'aaaa', 1)
    local b = new_node(fake, 'b', 'bbbb', 2)
    local c = new_node(fake, 'c', 'cccc', 3)
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
    reset()
    local fake = new_fake()
    local a = new_node(fake, 'a', 'aaaa', 1, 1)
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
    reset()
    local fake = new_fake()
    local a = new_node(fake, 'a', 'aaaa', 1)
    local b = new_node(fake, 'b', 'bbbb', 2)
    local c = new_node(fake, 'c', 'cccc', 3)
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
    reset()
    local fake = new_fake()
    local a = new_node(fake, 'a', 'aaaa', 1)
    local b = new_node(fake, 'b', 'bbbb', 2)
    local c = new_node(fake, 'c', 'cccc', 3)
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
    reset()
    local fake = new_fake()
    local a = new_node(fake, 'a', 'aaaa', 1)
    local b = new_node(fake, 'b', 'bbbb', 2)
    local c = new_node(fake, 'c', 'cccc', 3)
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
    t:ok(r.term == b.fo.term and r.term > old_term + 1, 'the term moved with it (hand-over, then rewrite)')
    run_for({a, b, c}, 1)
    t:is(a.fo.role, 'follower', 'the old leader follows, not DIVERGED')
end)

test:test('join hold: writes stop, drain, and resume once the joiner is registered', function(t)
    t:plan(9)
    reset()
    local fake = new_fake()
    local a = new_node(fake, 'a', 'aaaa', 1)
    local b = new_node(fake, 'b', 'bbbb', 2)
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
    reset()
    local fake = new_fake()
    local a = new_node(fake, 'a', 'aaaa', 1)
    local b = new_node(fake, 'b', 'bbbb', 2)
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
    reset()
    local fake = new_fake()
    local a = new_node(fake, 'a', 'aaaa', 1)
    local b = new_node(fake, 'b', 'bbbb', 2)
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
    reset()
    local fake = new_fake()
    local a = new_node(fake, 'a', 'aaaa', 1)
    local b = new_node(fake, 'b', 'bbbb', 2)
    local c = new_node(fake, 'c', 'cccc', 3)
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
    reset()
    local fake = new_fake()
    local a = new_node(fake, 'a', 'aaaa', 1, 1)
    run_for({a}, 1)
    return a, fake
end

test:test('a join hold whose drain does not finish steps down instead of staying fenced', function(t)
    t:plan(4)
    local a = lone_leader()
    t:is(a.fo.role, 'leader', 'a lone leader')
    a.fo.join_drain_timeout_s = 0.1
    a.box.drain = function()
        fiber.sleep(0.5)  -- a write stuck in the limbo (it ends here so the test leaves no fiber behind)
        return true
    end
    local started = fiber.clock()
    local r = a.fo:hold_for_join('ffff', 2)
    t:is(r.status, 'ERROR', 'the hold fails: ' .. tostring(r.message))
    t:ok(fiber.clock() - started < 0.4, 'after the bound, not when the drain ends')
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

os.exit(test:check() and 0 or 1)
