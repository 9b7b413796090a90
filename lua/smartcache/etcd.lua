-- A small etcd v3 client over its JSON gateway (etcd 3.4: /v3/...), on
-- Tarantool's built-in http.client. Only what failover needs: leases, a
-- compare-and-swap transaction, get and prefix range, put, delete.
--
-- The gateway speaks proto3 JSON: keys and values are base64, int64 fields are
-- strings, and zero values are left out (a lease that is gone answers a
-- keepalive with no TTL; a failed transaction has no "succeeded"). Lease ids
-- stay strings here (they do not fit a Lua number); revisions become numbers
-- (they stay below 2^53 for centuries).
--
-- Every call returns its result, or nil and an error table {kind, message}:
-- kind 'unavailable' (no member answered in time: the caller cannot tell
-- whether a write happened) or 'failed' (etcd answered with an error).
-- Both the HTTP client and the clock are injectable, so tests drive this
-- against a fake etcd with no sockets (tests/lua/etcd_test.lua).
--
-- Several members (SC_ETCD lists them all). A call goes first to the member
-- that answered last, and moves on to the next one, each at most once, when
-- the member it asked cannot serve it now:
--   * a transport error: could not connect (http.client 595: nothing was
--     sent), our own timeout (408), the connection dropped before an answer
--     (444, 499, a 5xx without a JSON body);
--   * an answer that the member's cluster is in transition: HTTP 503 with
--     gRPC code 14 (Unavailable), which is how the 3.4 gateway reports
--     "etcdserver: no leader", "leader changed", "request timed out" (also
--     "..., possibly due to previous leader failure"), "server stopped",
--     "unhealthy cluster"; a keepalive (a gRPC stream) says the same inside
--     {"error": {"grpc_code": 14, "http_code": 503, "message": ...}}; and
--     "context deadline exceeded" (code 2 or 4, HTTP 500 or 504), which a
--     member without quorum answers to a write, and "raft proposal dropped"
--     (code 2: a follower that knows no leader refused it). Measured against 3.4.23 with a
--     member killed: a linearizable read on a follower answered "leader
--     changed" after 1.5 s; a put and a txn "request timed out, possibly due
--     to previous leader failure" after 7 s (etcd's own request timeout); a
--     keepalive on the last member alive "no leader" after 7 s. Most of them
--     come after our budget, as 408s.
-- Any other answer (200, a 4xx, database space exceeded...) is etcd's word
-- and ends the call at once. A transaction (compare-and-swap) is not safe to
-- send twice when the first one may have been applied: it moves on only after
-- answers that prove nothing was done (could not connect, no leader, leader
-- changed, not capable) and otherwise ends with 'unavailable' (outcome
-- unknown); the idempotent calls (range, put of the same value, keepalive,
-- grant, revoke) move on after any of them. When no member answered, the
-- next call starts with the member after the one this call started with, so
-- a frozen member costs one call, not every call.
--
-- The budget: the timeout (the client's, or the call's) bounds the whole
-- call, not each attempt. Every attempt but the last keeps a quarter of the
-- budget for one more member, so a frozen or cut-off member (its attempt
-- ends at our timeout) still leaves time to ask a live one within the same
-- call; an attempt never starts with less than MIN_ATTEMPT_S left.
--
-- Leases and the fencing rule (smartcache.failover.lease): a leader writes
-- only while now < t_sent + TTL - margin, t_sent taken *before* keepalive()
-- is called. Every answer this client returns belongs to a request this call
-- sent (http.client is synchronous; an attempt that timed out is abandoned,
-- and its connection with it, so a late answer to it can never be read by a
-- later call), and every attempt is sent at or after the call began. So a
-- keepalive that succeeds after a move to another member renewed the lease at
-- the etcd leader no earlier than the caller's t_sent: a retried keepalive's
-- success proves the lease from the *first* send, and t_sent + TTL - margin
-- stays a bound however many members the call went through and however late
-- in the budget the answer came. A keepalive whose answer did not come in
-- the budget proves nothing: nil, 'unavailable'.
local json = require('json')
local digest = require('digest')
local clock = require('clock')
local http_client = require('http.client')

local M = {}

local Client = {}
Client.__index = Client

-- Share of the budget every attempt but the last leaves for one more member.
M.RESERVE_SHARE = 0.25
-- Below this much left of the budget no attempt starts (s).
M.MIN_ATTEMPT_S = 0.005

-- http.client statuses that are no answer from etcd: timeout, no response, client closed, could not connect.
local TRANSPORT = {[408] = true, [444] = true, [499] = true, [595] = true}
local NOT_SENT = 595
-- gRPC codes of an etcd that cannot serve now: Unknown and DeadlineExceeded carry
-- "context deadline exceeded"; Unavailable the transitions (no leader, leader changed, timed out...).
local UNAVAILABLE = 14
local DEADLINE_CODES = {[2] = true, [4] = true}
-- Answers that prove the request was not applied: a transaction may be sent again after them.
local NOT_APPLIED = {'no leader', 'leader changed', 'not capable', 'not supported for learner', 'proposal dropped'}

local function b64(s)
    return digest.base64_encode(s, {nopad = false, nowrap = true})
end

local function unb64(s)
    if s == nil then
        return ''
    end
    return digest.base64_decode(s)
end

-- The key just after every key that starts with prefix (etcd's range_end for a prefix).
local function prefix_end(prefix)
    for i = #prefix, 1, -1 do
        local b = prefix:byte(i)
        if b < 0xff then
            return prefix:sub(1, i - 1) .. string.char(b + 1)
        end
    end
    return '\0'
end
M.prefix_end = prefix_end

-- opts: endpoints = {'http://host:port', ...} (required), timeout (s, the budget of one call; 1),
-- http = an object with :request(method, url, body, opts) like http.client (default: a new one),
-- clock = monotonic seconds (default clock.monotonic).
function M.new(opts)
    assert(type(opts) == 'table' and type(opts.endpoints) == 'table' and #opts.endpoints > 0,
        'etcd.new: endpoints required')
    local self = setmetatable({}, Client)
    self.endpoints = {}
    for _, e in ipairs(opts.endpoints) do
        table.insert(self.endpoints, (e:gsub('/+$', '')))
    end
    self.timeout = opts.timeout or 1
    self.http = opts.http or http_client.new()
    self.clock = opts.clock or clock.monotonic
    self.current = 1      -- the member the next call asks first: the one that answered last
    self.errors = 0       -- calls no member answered
    self.switches = 0     -- calls answered by another member than the one asked first
    return self
end

-- The endpoints in the order the next call tries them.
function Client:order()
    local out, n = {}, #self.endpoints
    for i = 0, n - 1 do
        table.insert(out, self.endpoints[(self.current - 1 + i) % n + 1])
    end
    return out
end

-- One attempt's outcome: 'ok' (doc), 'failed' (etcd's answer: err), or 'retry' (err, applied: false when
-- the request provably did nothing, nil when it may have).
local function classify(r, endpoint)
    local where = endpoint .. ': '
    if r.status == nil or TRANSPORT[r.status] then
        local applied = nil  -- a timeout or a dropped connection: it may have reached etcd
        if r.status == NOT_SENT then
            applied = false
        end
        return 'retry', where .. tostring(r.status) .. ' ' .. tostring(r.reason), applied
    end
    local decoded_ok, doc = pcall(json.decode, r.body or 'null')
    if not decoded_ok or type(doc) ~= 'table' then
        if r.status >= 500 then  -- a proxy's page, a dropped connection: no word from etcd
            return 'retry', where .. tostring(r.status) .. ' ' .. tostring(r.reason), nil
        end
        return 'failed', {kind = 'failed', status = r.status, message = 'unparsable reply: ' .. tostring(r.body)}
    end
    -- A stream (keepalive) reports its error inside the body: {"error": {grpc_code, http_code, message}}.
    local e = type(doc.error) == 'table' and doc.error or doc
    local code = tonumber(e.grpc_code or e.code)
    local message = tostring(e.message or doc.error or '')
    if r.status == 200 and doc.error == nil then
        return 'ok', doc
    end
    local deadline = DEADLINE_CODES[code] and message:find('deadline exceeded', 1, true)
    if code == UNAVAILABLE or r.status == 503 or deadline or message:find('proposal dropped', 1, true) then
        local applied = nil
        for _, m in ipairs(NOT_APPLIED) do
            if message:find(m, 1, true) then
                applied = false
            end
        end
        return 'retry', where .. tostring(r.status) .. ' ' .. message, applied
    end
    return 'failed', {kind = 'failed', status = r.status, code = code, message = message}
end

-- POST a JSON body to one gateway path, moving between members as the module
-- header says. timeout overrides the client's budget for this call; idempotent =
-- false (transactions) stops at the first attempt that may have been applied.
function Client:call(path, body, timeout, idempotent)
    local payload = json.encode(body)
    local budget = timeout or self.timeout
    local deadline = self.clock() + budget
    local reserve = budget * M.RESERVE_SHARE
    local n = #self.endpoints
    local tried = {}
    for i = 0, n - 1 do
        local left = deadline - self.clock()
        if left < M.MIN_ATTEMPT_S then
            table.insert(tried, string.format('budget of %g s spent', budget))
            break
        end
        local idx = (self.current - 1 + i) % n + 1
        local attempt = left
        if i < n - 1 and left > 2 * reserve then
            attempt = left - reserve
        end
        local ok, r = pcall(self.http.request, self.http, 'POST', self.endpoints[idx] .. path, payload,
            {timeout = attempt, headers = {['Content-Type'] = 'application/json'}})
        local outcome, result, applied
        if ok then
            outcome, result, applied = classify(r, self.endpoints[idx])
        else
            outcome, result = 'retry', self.endpoints[idx] .. ': ' .. tostring(r)
        end
        if outcome ~= 'retry' then
            if i > 0 then
                self.switches = self.switches + 1
            end
            self.current = idx
            if outcome == 'failed' then
                return nil, result
            end
            return result
        end
        table.insert(tried, result)
        if idempotent == false and applied ~= false then
            table.insert(tried, 'a transaction that may have been applied is not sent again')
            break
        end
    end
    self.errors = self.errors + 1
    self.current = self.current % n + 1
    return nil, {kind = 'unavailable', message = table.concat(tried, '; ')}
end

local function revision(doc)
    return tonumber(doc.header and doc.header.revision) or 0
end

local function kv(raw)
    if raw == nil then
        return nil
    end
    return {key = unb64(raw.key), value = unb64(raw.value), lease = raw.lease,
            create_revision = tonumber(raw.create_revision) or 0,
            mod_revision = tonumber(raw.mod_revision) or 0}
end

-- A new lease: {id = '<string>', ttl = seconds granted}.
function Client:grant(ttl, timeout)
    local doc, err = self:call('/v3/lease/grant', {TTL = ttl}, timeout)
    if doc == nil then
        return nil, err
    end
    return {id = doc.ID, ttl = tonumber(doc.TTL) or 0}
end

-- Refresh a lease; returns the TTL it now has (0: the lease is gone).
function Client:keepalive(id, timeout)
    local doc, err = self:call('/v3/lease/keepalive', {ID = id}, timeout)
    if doc == nil then
        return nil, err
    end
    local r = doc.result or doc
    return tonumber(r.TTL) or 0
end

-- Drop a lease and every key attached to it. A lease that is already gone is fine.
function Client:revoke(id, timeout)
    local doc, err = self:call('/v3/lease/revoke', {ID = id}, timeout)
    if doc == nil and err.kind == 'failed' and err.status == 404 then
        return true
    end
    if doc == nil then
        return nil, err
    end
    return true
end

-- One key: (kv, or false when absent; header revision).
function Client:get(key, timeout)
    local doc, err = self:call('/v3/kv/range', {key = b64(key)}, timeout)
    if doc == nil then
        return nil, err
    end
    return kv(doc.kvs and doc.kvs[1]) or false, revision(doc)
end

-- Several keys read at one revision (a transaction of reads only: as idempotent as a range,
-- so it moves between members like one): (list of kv or false per key, header revision).
function Client:get_many(keys, timeout)
    local ops = {}
    for _, k in ipairs(keys) do
        table.insert(ops, {request_range = {key = b64(k)}})
    end
    local doc, err = self:call('/v3/kv/txn', {compare = {}, success = ops, failure = {}}, timeout)
    if doc == nil then
        return nil, err
    end
    local out = {}
    for i = 1, #keys do
        local r = (doc.responses or {})[i]
        local raw = r and r.response_range and r.response_range.kvs and r.response_range.kvs[1]
        out[i] = kv(raw) or false
    end
    return out, revision(doc)
end

-- Every key under a prefix: (list of kv, header revision).
function Client:range_prefix(prefix, timeout)
    local doc, err = self:call('/v3/kv/range', {key = b64(prefix), range_end = b64(prefix_end(prefix))}, timeout)
    if doc == nil then
        return nil, err
    end
    local out = {}
    for _, raw in ipairs(doc.kvs or {}) do
        table.insert(out, kv(raw))
    end
    return out, revision(doc)
end

local function put_op(key, value, lease)
    return {request_put = {key = b64(key), value = b64(value), lease = lease}}
end

-- Unconditional put (lease optional); returns the new revision.
function Client:put(key, value, lease, timeout)
    local doc, err = self:call('/v3/kv/put', {key = b64(key), value = b64(value), lease = lease}, timeout)
    if doc == nil then
        return nil, err
    end
    return revision(doc)
end

-- A transaction. compare: list of {key=, target='CREATE'|'MOD'|'VALUE'|'LEASE', result='EQUAL'|...,
-- value=}; success/failure: lists of ops made by M.op_put / M.op_delete / M.op_get.
-- Returns (succeeded, revision, responses).
function Client:txn(compare, success, failure, timeout)
    local cmp = {}
    for _, c in ipairs(compare) do
        local e = {key = b64(c.key), target = c.target, result = c.result or 'EQUAL'}
        if c.target == 'CREATE' then
            e.create_revision = tostring(c.value)
        elseif c.target == 'MOD' then
            e.mod_revision = tostring(c.value)
        elseif c.target == 'VERSION' then
            e.version = tostring(c.value)
        elseif c.target == 'LEASE' then
            e.lease = tostring(c.value)
        else
            e.value = b64(c.value)
        end
        table.insert(cmp, e)
    end
    local doc, err = self:call('/v3/kv/txn', {compare = cmp, success = success or {}, failure = failure or {}},
        timeout, false)
    if doc == nil then
        return nil, err
    end
    local responses = {}
    for _, r in ipairs(doc.responses or {}) do
        if r.response_range ~= nil then
            local kvs = {}
            for _, raw in ipairs(r.response_range.kvs or {}) do
                table.insert(kvs, kv(raw))
            end
            table.insert(responses, {kvs = kvs})
        else
            table.insert(responses, r)
        end
    end
    return doc.succeeded == true, revision(doc), responses
end

M.op_put = put_op

function M.op_delete(key)
    return {request_delete_range = {key = b64(key)}}
end

function M.op_get(key)
    return {request_range = {key = b64(key)}}
end

-- Create key only if it does not exist; returns (created, revision, existing kv or nil).
function Client:create(key, value, lease, timeout)
    local ok, rev, responses = self:txn({{key = key, target = 'CREATE', value = 0}},
        {put_op(key, value, lease)}, {M.op_get(key)}, timeout)
    if ok == nil then
        return nil, rev
    end
    local existing = not ok and responses[1] and responses[1].kvs[1] or nil
    return ok, rev, existing
end

-- Delete key only if its mod_revision is still mod_revision; returns deleted (bool).
function Client:delete_if(key, mod_revision, timeout)
    local ok, rev = self:txn({{key = key, target = 'MOD', value = mod_revision}}, {M.op_delete(key)}, {}, timeout)
    if ok == nil then
        return nil, rev
    end
    return ok
end

M.Client = Client
return M
