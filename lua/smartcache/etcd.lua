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
-- kind 'unavailable' (no endpoint answered in time: the caller cannot tell
-- whether a write happened) or 'failed' (etcd answered with an error).
-- Both the HTTP client and the clock are injectable, so tests drive this
-- against a fake etcd with no sockets.
local json = require('json')
local digest = require('digest')

local M = {}

local Client = {}
Client.__index = Client

local TRANSPORT_ERRORS = {[408] = true, [595] = true}  -- http.client: timeout, could not connect

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

-- opts: endpoints = {'http://host:port', ...} (required), timeout (s, per request; 1),
-- http = an object with :request(method, url, body, opts) like http.client (default: a new one).
function M.new(opts)
    assert(type(opts) == 'table' and type(opts.endpoints) == 'table' and #opts.endpoints > 0,
        'etcd.new: endpoints required')
    local self = setmetatable({}, Client)
    self.endpoints = {}
    for _, e in ipairs(opts.endpoints) do
        table.insert(self.endpoints, (e:gsub('/+$', '')))
    end
    self.timeout = opts.timeout or 1
    self.http = opts.http or require('http.client').new()
    self.current = 1      -- endpoint that answered last
    self.errors = 0       -- requests no endpoint answered
    return self
end

-- POST a JSON body to one gateway path; tries each endpoint once, starting
-- with the one that answered last. timeout overrides the client's per request.
function Client:call(path, body, timeout)
    local payload = json.encode(body)
    local last
    local n = #self.endpoints
    for i = 0, n - 1 do
        local idx = (self.current - 1 + i) % n + 1
        local ok, r = pcall(self.http.request, self.http, 'POST', self.endpoints[idx] .. path, payload,
            {timeout = timeout or self.timeout, headers = {['Content-Type'] = 'application/json'}})
        if not ok then
            last = tostring(r)
        elseif r.status == nil or TRANSPORT_ERRORS[r.status] or r.status >= 500 and r.body == nil then
            last = string.format('%s: %s %s', self.endpoints[idx], tostring(r.status), tostring(r.reason))
        else
            self.current = idx
            local decoded_ok, doc = pcall(json.decode, r.body or 'null')
            if not decoded_ok or type(doc) ~= 'table' then
                return nil, {kind = 'failed', status = r.status, message = 'unparsable reply: ' .. tostring(r.body)}
            end
            if r.status ~= 200 or doc.error ~= nil then
                return nil, {kind = 'failed', status = r.status, code = doc.code,
                             message = tostring(doc.message or doc.error)}
            end
            return doc
        end
    end
    self.errors = self.errors + 1
    return nil, {kind = 'unavailable', message = last}
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
        timeout)
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
