#!/usr/bin/env tarantool
-- The etcd gateway client (smartcache.etcd) against three fake members of one
-- fake etcd, behind a fake http client, with an injected clock: how a call
-- moves between members within its budget, and what a keepalive's success
-- proves to the fencing rule. No sockets, no box.cfg, no waiting.
-- Runnable alone: `tarantool tests/lua/etcd_test.lua`.
local tap = require('tap')
local json = require('json')
local fio = require('fio')

local here = fio.dirname(fio.abspath(debug.getinfo(1, 'S').source:sub(2)))
package.path = fio.pathjoin(here, '..', '..', 'lua') .. '/?.lua;' .. package.path  -- tests/lua -> lua/

local etcd = require('smartcache.etcd')

-- The fake clock: only the fake members move it ----------------------------------

local T = {now = 1000}
local function now()
    return T.now
end

-- One fake etcd (its data and leases) behind three members -------------------------

local Cluster = {}
Cluster.__index = Cluster

local A, B, C = 'http://a:2379', 'http://b:2379', 'http://c:2379'

local function new_cluster()
    local self = setmetatable({kv = {}, leases = {}, revision = 1, next_lease = 7000001, members = {},
                               requests = {}}, Cluster)
    for _, url in ipairs({A, B, C}) do
        -- behave: 'ok', 'down' (refuses connections), 'frozen' (never answers), or a function
        -- (path, body, opts) -> status, doc (etcd's own error answers); delay: seconds an answer takes
        self.members[url] = {behave = 'ok', delay = 0, asked = 0, timeouts = {}}
    end
    return self
end

local function unb64(s)
    return s and require('digest').base64_decode(s) or nil
end

function Cluster:header()
    return {revision = tostring(self.revision), cluster_id = '1', member_id = '1'}
end

function Cluster:expire()
    for id, l in pairs(self.leases) do
        if l.expires_at <= T.now then
            self.leases[id] = nil
        end
    end
end

-- What the etcd leader does with a request that reached it (at T.now).
function Cluster:handle(path, body)
    self:expire()
    if path == '/v3/lease/grant' then
        local id = tostring(self.next_lease)
        self.next_lease = self.next_lease + 1
        self.leases[id] = {ttl = body.TTL, expires_at = T.now + body.TTL}
        return 200, {header = self:header(), ID = id, TTL = tostring(body.TTL)}
    elseif path == '/v3/lease/keepalive' then
        local l = self.leases[body.ID]
        if l == nil then
            return 200, {result = {header = self:header(), ID = body.ID}}
        end
        l.expires_at = T.now + l.ttl  -- renewed from the moment the leader sees it
        return 200, {result = {header = self:header(), ID = body.ID, TTL = tostring(l.ttl)}}
    elseif path == '/v3/kv/range' then
        local v = self.kv[unb64(body.key)]
        return 200, {header = self:header(), kvs = v and {{key = body.key, value = v.value,
            mod_revision = tostring(v.mod), create_revision = tostring(v.mod)}} or nil}
    elseif path == '/v3/kv/put' then
        self.revision = self.revision + 1
        self.kv[unb64(body.key)] = {value = body.value, mod = self.revision}
        return 200, {header = self:header()}
    elseif path == '/v3/kv/txn' then
        local c = body.compare[1]
        local k = unb64(c.key)
        if self.kv[k] ~= nil then
            return 200, {header = self:header(), responses = {}}
        end
        local put = body.success[1].request_put
        self.revision = self.revision + 1
        self.kv[k] = {value = put.value, mod = self.revision}
        return 200, {header = self:header(), succeeded = true, responses = {}}
    end
    return 404, {error = 'Not Found', code = 5, message = 'Not Found'}
end

-- The http.client interface: request(self, method, url, body, opts) -> {status, reason, body}.
function Cluster:request(method, url, body, opts)
    assert(method == 'POST')
    local base, path = url:match('^(https?://[^/]+)(/.*)$')
    local m = assert(self.members[base], 'unknown member ' .. base)
    m.asked = m.asked + 1
    table.insert(m.timeouts, opts.timeout)
    table.insert(self.requests, base)
    if m.behave == 'down' then
        T.now = T.now + 0.001
        return {status = 595, reason = "Couldn't connect to server"}
    end
    if m.behave == 'frozen' or m.delay >= opts.timeout then
        T.now = T.now + opts.timeout  -- http.client gives up at the attempt's timeout; any later answer is lost
        return {status = 408, reason = 'Timeout was reached'}
    end
    T.now = T.now + m.delay
    local status, doc
    if type(m.behave) == 'function' then
        status, doc = m.behave(path, json.decode(body), opts)
    end
    if status == nil then
        status, doc = self:handle(path, json.decode(body))
    end
    return {status = status, body = type(doc) == 'string' and doc or json.encode(doc)}
end

local function client(fake, timeout)
    return etcd.new({endpoints = {A, B, C}, http = fake, clock = now, timeout = timeout or 1})
end

local function near(a, b)
    return math.abs(a - b) < 1e-9
end

-- etcd 3.4's gateway answers while its cluster is in transition (measured: see smartcache/etcd.lua).
local function unavailable(message)
    return function()
        return 503, {error = 'etcdserver: ' .. message, message = 'etcdserver: ' .. message, code = 14}
    end
end

-- Tests ------------------------------------------------------------------------------

local test = tap.test('etcd')
test:plan(9)

test:test('a member down: the next one answers at once, and is asked first from then on', function(t)
    t:plan(7)
    local fake = new_cluster()
    local c = client(fake)
    fake.members[A].behave = 'down'
    local t0 = T.now
    t:is(c:put('/k', 'v'), 2, 'the put went through b')
    t:ok(T.now - t0 < 0.01, 'a refused connection costs a millisecond, not the budget')
    t:is(c.switches, 1, 'counted as a switch')
    t:is(table.concat(c:order(), ' '), table.concat({B, C, A}, ' '), 'b first now, then c, a last')
    fake.requests = {}
    local kv = c:get('/k')
    t:is(kv.value, 'v', 'the next call reads through b')
    t:is(table.concat(fake.requests, ' '), B, 'and asks b alone: a, still down, is not tried first')
    t:is(c.errors, 0, 'no call failed')
end)

test:test('"leader changed", "no leader", "request timed out": another member serves the call', function(t)
    t:plan(6)
    local fake = new_cluster()
    local c = client(fake)
    fake.members[A].behave = unavailable('leader changed')
    t:is(c:put('/k', 'v1'), 2, 'a put answered "leader changed" by a goes to b')
    fake.members[B].behave = unavailable('request timed out, possibly due to previous leader failure')
    local kv = c:get('/k')
    t:is(kv and kv.value, 'v1', 'a read answered "request timed out" by b goes to c')
    t:is(c.current, 3, 'c answered: c first next time')
    -- A keepalive is a gRPC stream: its error is inside the body.
    local lease = c:grant(5)
    fake.members[C].behave = function()
        return 503, {error = {grpc_code = 14, http_code = 503, message = 'etcdserver: no leader',
                              http_status = 'Service Unavailable'}}
    end
    fake.members[A].behave = 'ok'
    t:is(c:keepalive(lease.id), 5, 'a keepalive answered "no leader" (stream error) by c goes to a')
    -- A member without quorum answers a write with "context deadline exceeded" (gRPC Unknown, HTTP 500).
    fake.members[A].behave = function()
        return 500, {error = 'context deadline exceeded', message = 'context deadline exceeded', code = 2}
    end
    fake.members[B].behave = 'ok'
    t:is(c:put('/k', 'v2'), fake.revision, '"context deadline exceeded" from a: b takes the put')
    -- etcd's own word ends the call: a lease it does not know is no reason to ask another.
    fake.members[B].behave = function()
        return 404, {error = 'etcdserver: requested lease not found', code = 5,
                     message = 'etcdserver: requested lease not found'}
    end
    fake.members[C].asked = 0
    local _, err = c:call('/v3/kv/put', {key = 'a2V5', value = 'dg=='})
    t:ok(err.kind == 'failed' and err.status == 404 and fake.members[C].asked == 0,
        'an error answer (404) is returned as failed, and c is not asked')
end)

test:test('slow members: the budget bounds the whole call, then nil, unavailable', function(t)
    t:plan(8)
    local fake = new_cluster()
    local c = client(fake, 1)
    for _, url in ipairs({A, B, C}) do
        fake.members[url].delay = 5  -- every member answers after our timeout
    end
    local t0 = T.now
    local r, err = c:get('/k')
    t:is(r, nil, 'no result')
    t:is(err.kind, 'unavailable', 'unavailable')
    t:ok(near(T.now - t0, 1), 'the call took its budget (1 s), not one timeout per member (3 s)')
    t:ok(near(fake.members[A].timeouts[1], 0.75), 'a got the budget less a quarter kept for one more member')
    t:ok(near(fake.members[B].timeouts[1], 0.25), 'b got the quarter left')
    t:is(fake.members[C].asked, 0, 'c was not asked: nothing was left')
    t:like(err.message, 'budget of 1 s spent', 'the error says why')
    t:is(c.current, 2, 'the next call starts with b, the member after the one this call started with')
end)

test:test('a frozen member: the call still reaches a live one within its budget', function(t)
    t:plan(3)
    local fake = new_cluster()
    local c = client(fake, 1)
    fake.members[A].behave = 'frozen'
    fake.members[B].delay = 0.01
    local t0 = T.now
    t:is(c:put('/k', 'v'), 2, 'answered by b')
    t:ok(near(T.now - t0, 0.76), 'after a\'s 0.75 s and b\'s 0.01 s: within the 1 s budget')
    t:is(c:order()[1], B, 'b first from now on')
end)

test:test('a keepalive answered late in the budget: t_sent + TTL - margin still bounds the lease', function(t)
    t:plan(6)
    local TTL, MARGIN = 5, 1
    local fake = new_cluster()
    local c = client(fake, 1)
    local lease = c:grant(TTL)
    fake.members[A].behave = 'frozen'  -- the member we asked last stops answering
    fake.members[B].delay = 0.2        -- the next one answers, late: 0.95 s into the 1 s budget
    -- What smartcache.failover.lease does: t_sent before the call, the deadline from t_sent.
    local t_sent = T.now
    local ttl = c:keepalive(lease.id)
    local answered = T.now
    t:is(ttl, TTL, 'renewed through b')
    t:ok(near(answered - t_sent, 0.95), 'answered 0.95 s after t_sent')
    local deadline = t_sent + math.min(ttl, TTL) - MARGIN
    local expires = fake.leases[lease.id].expires_at  -- etcd renewed it when b's request reached it
    t:ok(expires >= t_sent + TTL, string.format('etcd keeps the lease until %.2f >= t_sent + TTL = %.2f',
        expires - t_sent, TTL))
    t:ok(expires - deadline >= MARGIN, string.format('the leader stops writing %.2f s before etcd can expire it',
        expires - deadline))
    t:ok(deadline < answered + TTL - MARGIN, 'the deadline counts from the send, never from the late answer')
    -- Later than the budget: no answer at all, nothing proven, the deadline stays where it was.
    fake.members[B].delay = 5
    fake.members[C].delay = 5
    fake.members[A].behave = 'ok'
    fake.members[A].delay = 5
    local again, err = c:keepalive(lease.id)
    t:ok(again == nil and err.kind == 'unavailable', 'an answer after the budget proves nothing: nil, unavailable')
end)

test:test('the endpoint order after switches', function(t)
    t:plan(4)
    local fake = new_cluster()
    local c = client(fake)
    t:is(table.concat(c:order(), ' '), table.concat({A, B, C}, ' '), 'as configured at first')
    fake.members[A].behave = 'down'
    fake.members[B].behave = 'down'
    c:get('/k')
    t:is(table.concat(c:order(), ' '), table.concat({C, A, B}, ' '), 'c answered: c, then a, b')
    fake.members[C].behave = 'down'
    local _, err = c:get('/k')
    t:is(err.kind, 'unavailable', 'every member down: unavailable')
    t:is(table.concat(c:order(), ' '), table.concat({A, B, C}, ' '),
        'no member answered: the next call starts with the one after c')
end)

test:test('a transaction is sent again only when the first attempt provably did nothing', function(t)
    t:plan(5)
    local fake = new_cluster()
    local c = client(fake, 1)
    fake.members[A].behave = 'frozen'  -- a timeout: the create may have been applied
    local ok, err = c:create('/leader', 'me', nil)
    t:is(ok, nil, 'a create that timed out is not retried elsewhere')
    t:is(err.kind, 'unavailable', 'unavailable: outcome unknown')
    t:is(fake.members[B].asked + fake.members[C].asked, 0, 'b and c were not asked')
    fake.members[B].behave = unavailable('no leader')  -- c.current is b now; "no leader": nothing was done
    local created = c:create('/leader2', 'me', nil)
    t:is(created, true, 'after "no leader" from b the create goes to c')
    fake.members[C].behave = 'down'
    fake.members[A].behave = 'ok'
    t:is(c:create('/leader3', 'me', nil), true, 'after a refused connection (nothing sent) it goes on too')
end)

test:test('no word from etcd: a proxy page, a dropped connection, an error thrown by http', function(t)
    t:plan(3)
    local fake = new_cluster()
    local c = client(fake)
    fake.members[A].behave = function() return 502, '<html>Bad Gateway</html>' end
    t:is(c:put('/k', 'v'), 2, 'a 502 page moves on to b')
    fake.members[B].behave = function() return 444, '' end
    t:is(c:put('/k', 'v'), 3, 'no response (444) moves on to c')
    local broken = setmetatable({}, {__index = fake})
    broken.request = function(self, method, url, body, opts)
        if url:find(C, 1, true) then
            error('connection reset by peer')
        end
        return fake.request(self, method, url, body, opts)
    end
    fake.members[B].behave = 'ok'
    local c2 = etcd.new({endpoints = {C, B}, http = broken, clock = now})
    t:is(c2:put('/k', 'v'), 4, 'an error thrown by http.client moves on too')
end)

test:test('one endpoint: one attempt with the whole budget, as before', function(t)
    t:plan(3)
    local fake = new_cluster()
    local c = etcd.new({endpoints = {A .. '/'}, http = fake, clock = now, timeout = 1})
    fake.members[A].delay = 0.9
    t:is(c:put('/k', 'v'), 2, 'a slow answer within the budget is fine')
    t:ok(near(fake.members[A].timeouts[1], 1), 'the attempt had the whole second')
    fake.members[A].behave = 'down'
    local _, err = c:get('/k')
    t:ok(err.kind == 'unavailable' and c.current == 1, 'down: unavailable, and still the only one')
end)

os.exit(test:check() and 0 or 1)
