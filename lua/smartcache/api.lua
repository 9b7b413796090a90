-- The one registration point: every stored procedure the service may call.
--
-- Procedures live in the global table `sc` (net.box calls them as
-- 'sc.<name>'); register() creates each function and grants execute on it,
-- and nothing else, to the role smartcache_api. Idempotent.
--
-- Calling convention: every sc.<name> takes `meta` first, then the
-- procedure's own arguments. meta is nil, a number (deadline_ms alone: the
-- common case, cheapest to send and read), or a map:
--   deadline_ms      absolute deadline, ms since the epoch on this instance's
--                    clock; past it the procedure does nothing and answers
--                    DEADLINE_EXCEEDED (so "not executed" is true when the
--                    service says so; gRPC-style deadline propagation)
--   idempotency_key  writes only: apply once per key (smartcache.idempotency)
-- Write procedures answer NOT_LEADER, doing nothing, when this instance may
-- not write (read-only, or a leader whose lease is not proven).
--
-- The procedures come from api/, by how they are wrapped here:
--   api/reads.lua     the service's reads (keyed ones wait for a pending write of their key)
--   api/writes.lua    the service's writes (idempotency key, NOT_LEADER, WRITES_HELD), and
--                     the procedures that wait before they answer
--   api/operator.lua  the operators' procedures: failover, membership, buckets and their
--                     moves, the digest
-- This file wraps each kind, checks every routed call's bucket (ROUTE), grants, and
-- registers.
local log = require('log')
local fiber = require('fiber')
local util = require('smartcache.util')
local config = require('smartcache.config')
local quorum = require('smartcache.quorum')
local memory = require('smartcache.memory')
local disk = require('smartcache.disk')
local compat = require('smartcache.compat')
local idempotency = require('smartcache.idempotency')
local sharding = require('smartcache.sharding')
-- The procedures, by how they are wrapped.
local reads = require('smartcache.api.reads')
local writes = require('smartcache.api.writes')
local operator = require('smartcache.api.operator')

local M = {}

M.ROLE = 'smartcache_api'
-- Operators (smartcache-cli cluster): the cluster's actions, which the service never needs.
M.OPERATOR_ROLE = 'smartcache_operator'
-- Procedures only operators may call; and those both roles may call.
-- The audit log and the raw ids of the rekey's pages are operators' only: the service never writes
-- an audit entry, and holds no raw id but its clients' requests'.
M.OPERATOR_ONLY = {['sc.switchover'] = true, ['sc.rejoin'] = true, ['sc.join_hold'] = true,
                   ['sc.topology_init'] = true, ['sc.topology_add'] = true, ['sc.topology_remove'] = true,
                   ['sc.buckets_init'] = true, ['sc.digest'] = true, ['sc.audit_write'] = true,
                   ['sc.audit_read'] = true, ['sc.sessions_page'] = true}
-- session_rekey and session_key_check: the service's (the lazy rekey, its start) and the CLI's sessions-rekey.
M.OPERATOR_TOO = {['sc.role'] = true, ['sc.stats'] = true, ['sc.ping'] = true, ['sc.session_rekey'] = true,
                  ['sc.session_key_check'] = true}
for _, name in ipairs({'buckets_held', 'bucket_state', 'bucket_rows', 'bucket_send_start', 'bucket_send_abort',
                       'bucket_send_done', 'bucket_gc', 'bucket_recv_start', 'bucket_recv', 'bucket_recv_done',
                       'bucket_recv_abort'}) do
    M.OPERATOR_TOO['sc.' .. name] = true  -- the operator's moves, and the settler of every service instance
end

-- Sharding (docs/design/sharding.md): what decides each procedure's bucket, from
-- its own arguments (storage never takes the caller's word for a bucket). A key of
-- a client's data is the client id; a session's, the session id (the bucket it
-- carries); a device binding's, the device id; a coordination object's, its name;
-- the global cache namespace's, the cache key. Every procedure is in ROUTE or in
-- UNROUTED (tests/lua/buckets_test.lua fails for one that is in neither).
local function first_key(value)
    return 'key', value
end
local function first_session(value)
    return 'session', value
end
local function cache_call(session_id, key)
    if session_id == nil or session_id == '' then
        return 'key', key
    end
    return 'session', session_id
end
local function create_call(_, client_id)
    return 'key', client_id
end
-- SESSION_DELETE by the request's session id, or by handle with its client id: the client's bucket
-- (a session's bucket is its client's).
local function delete_call(id, _, _, client_id)
    if id == nil then
        return 'key', client_id
    end
    return 'session', id
end
local function published(_, key)
    if key == nil or key == '' then
        return nil  -- an event with no key: any shard's log
    end
    return 'key', key
end
M.ROUTE = {
    session_create = create_call, session_get = first_session, session_touch = first_session,
    session_update = first_session, session_delete = delete_call, session_rotate = first_session,
    session_rekey = first_session,
    session_list = first_key, session_delete_client = first_key,
    cache_put = cache_call, cache_get = cache_call, cache_delete = cache_call,
    device_bind = first_key, device_lookup = first_key,
    prewarm_acquire = first_key, prewarm_complete = first_key, prewarm_fail = first_key, prewarm_wait = first_key,
    counter_get = first_key, counter_add = first_key, counter_cas = first_key,
    register_get = first_key, register_cas = first_key, sequence_reserve = first_key, sequence_get = first_key,
    semaphore_acquire = first_key, semaphore_release = first_key, semaphore_renew = first_key,
    semaphore_get = first_key, latch_create = first_key, latch_count_down = first_key, latch_await = first_key,
    latch_get = first_key, queue_put = first_key, queue_take = first_key, queue_ack = first_key,
    queue_release = first_key, queue_stats = first_key, event_publish = published,
}
-- Not about one key: the shard as a whole, or its failover and membership.
M.UNROUTED = {ping = true, stats = true, session_locate = true, events_stats = true, events_read = true,
              role = true, switchover = true, rejoin = true, join_hold = true, topology_init = true,
              topology_add = true, topology_remove = true, debug_sleep = true, buckets_init = true,
              buckets_held = true, bucket_state = true, bucket_rows = true, bucket_send_start = true,
              bucket_send_abort = true, bucket_send_done = true, bucket_gc = true, bucket_recv_start = true,
              bucket_recv = true, bucket_recv_done = true, bucket_recv_abort = true, digest = true,
              session_key_check = true, sessions_page = true, audit_write = true, audit_read = true}

-- WRONG_BUCKET (nothing done) unless this shard serves the call's bucket.
local function misrouted(name, ...)
    local route = M.ROUTE[name]
    if route == nil then
        return nil
    end
    local kind, value = route(...)
    if kind == nil then
        return nil
    end
    return sharding.refusal(kind, value)
end

local DEADLINE_EXCEEDED = {status = 'DEADLINE_EXCEEDED'}
local NOT_LEADER = {status = 'NOT_LEADER'}
-- A single-key read that waited until its deadline for a write of that key to get its quorum.
local WRITE_PENDING = {status = 'WRITE_PENDING'}

-- A write refused while a synchronous rollback may be under way (quorum.rollback_near,
-- compat.SYNC_ROLLBACK_ADMITS_NEWER): nothing done; the service sends it again to the same
-- leader after retry_after_ms, when the oldest write in flight has ended one way or the other.
local function writes_held()
    local left = quorum.rollback_left()
    if left == nil then
        return nil
    end
    quorum.rollback_holds = quorum.rollback_holds + 1
    return {status = 'WRITES_HELD', retry_after_ms = math.ceil(left * 1000) + config.WRITES_HELD_SLACK_MS}
end

local function past(meta)
    if meta == nil then  -- nil or box.NULL
        return false
    end
    local deadline = meta
    if type(meta) == 'table' then
        deadline = meta.deadline_ms
        if deadline == nil then
            return false
        end
    end
    return fiber.time() * 1000 > deadline
end

-- What a read or a waiting procedure answers instead of running, if anything: DEADLINE_EXCEEDED
-- past its deadline, else WRONG_BUCKET when this shard does not serve its bucket (nil: run it).
-- A write asks the same things in an order of its own (write_procedure).
local function turned_away(name, meta, ...)
    if past(meta) then
        return DEADLINE_EXCEEDED
    end
    return misrouted(name, ...)
end

-- Count WAL write failures (disk full, read-only disk) and memory failures, and re-raise them.
local function counted(ok, res, ...)
    if ok then
        return res, ...
    end
    if type(res) == 'cdata' and res.code == box.error.WAL_IO then
        disk.count_wal_error()
    end
    memory.failed(res)
    error(res)
end

-- A wait inside a read ends config.ANSWER_MARGIN_S before the call's deadline,
-- so that its answer reaches the service while the message still lives.
local function wait_deadline_s(meta)
    local d = type(meta) == 'table' and meta.deadline_ms or meta
    if type(d) ~= 'number' then
        return nil
    end
    return d / 1000 - config.ANSWER_MARGIN_S
end

local function read_procedure(name, fn, space_name)
    -- Only a read of one key of a guarded space waits, and only without MVCC.
    if space_name == nil or not compat.NO_MVCC_DIRTY_READS then
        return function(meta, ...)
            local away = turned_away(name, meta, ...)
            if away ~= nil then
                return away
            end
            return counted(pcall(fn, ...))
        end
    end
    return function(meta, key, ...)
        local away = turned_away(name, meta, key, ...)
        if away ~= nil then
            return away
        end
        if quorum.enabled and key ~= nil and not quorum.wait_key(space_name, key, wait_deadline_s(meta)) then
            return WRITE_PENDING
        end
        return counted(pcall(fn, key, ...))
    end
end

local function write_procedure(name, fn)
    local space_name = compat.NO_MVCC_DIRTY_READS and writes.KEYED[name] or nil
    return function(meta, ...)
        if past(meta) then
            return DEADLINE_EXCEEDED
        end
        local first = ...
        if space_name ~= nil and quorum.enabled and first ~= nil
                and not quorum.wait_key(space_name, first, wait_deadline_s(meta)) then
            return WRITE_PENDING
        end
        if not util.writable() then
            return NOT_LEADER
        end
        local wrong = misrouted(name, ...)
        if wrong ~= nil then
            return wrong
        end
        local held = writes_held()
        if held ~= nil then
            return held
        end
        local key = type(meta) == 'table' and meta.idempotency_key or nil
        if key == nil then
            return counted(pcall(fn, ...))
        end
        return counted(pcall(idempotency.run, name, key, fn, ...))
    end
end

local function wait_procedure(name, fn)
    return function(meta, ...)
        local away = turned_away(name, meta, ...)
        if away ~= nil then
            return away
        end
        local deadline, key = meta, nil
        if type(meta) == 'table' then
            deadline, key = meta.deadline_ms, meta.idempotency_key
        end
        -- box.NULL (msgpack nil) == nil, but is truthy: pass a real nil.
        if deadline == nil then deadline = nil end
        if key == nil then key = nil end
        return counted(pcall(fn, deadline, key, ...))
    end
end

_G.sc = {}
for name, fn in pairs(reads.procedures) do
    _G.sc[name] = read_procedure(name, fn, reads.KEYED[name])
end
for name, fn in pairs(writes.procedures) do
    _G.sc[name] = write_procedure(name, fn)
end
for name, fn in pairs(writes.waits) do
    _G.sc[name] = wait_procedure(name, fn)
end
-- The operators' procedures check their own preconditions: wrapped as a read of no key is
-- (the deadline, the counted failures; none is routed).
for name, fn in pairs(operator.procedures) do
    _G.sc[name] = read_procedure(name, fn, nil)
end

M.names = {}
for name in pairs(_G.sc) do
    table.insert(M.names, 'sc.' .. name)
end
table.sort(M.names)

-- Create functions and the role; grant the role to the service user. Writable instance only.
function M.register(service_user, service_password)
    box.schema.role.create(M.ROLE, {if_not_exists = true})
    box.schema.role.create(M.OPERATOR_ROLE, {if_not_exists = true})
    for _, name in ipairs(M.names) do
        -- setuid: a procedure runs with its owner's (admin's) rights, so the
        -- service user needs execute on it and no rights on any space.
        local existing = box.space._func.index.name:get(name)
        if existing ~= nil and existing[4] ~= 1 then
            box.schema.func.drop(name)
        end
        box.schema.func.create(name, {setuid = true, if_not_exists = true})
        if M.OPERATOR_ONLY[name] then
            box.schema.role.revoke(M.ROLE, 'execute', 'function', name, {if_exists = true})
        else
            box.schema.role.grant(M.ROLE, 'execute', 'function', name, {if_not_exists = true})
        end
        if M.OPERATOR_ONLY[name] or M.OPERATOR_TOO[name] then
            box.schema.role.grant(M.OPERATOR_ROLE, 'execute', 'function', name, {if_not_exists = true})
        end
    end
    -- Procedures created before that no longer exist go (least privilege).
    local stale = {}
    for _, t in box.space._func.index.name:pairs({'sc.'}, {iterator = 'GE'}) do
        if t[3]:sub(1, 3) ~= 'sc.' then
            break
        end
        if _G.sc[t[3]:sub(4)] == nil then
            table.insert(stale, t[3])
        end
    end
    for _, name in ipairs(stale) do
        box.schema.func.drop(name)
    end
    if service_user ~= nil then
        box.schema.user.create(service_user, {password = service_password, if_not_exists = true})
        box.schema.user.passwd(service_user, service_password)
        box.schema.user.grant(service_user, M.ROLE, nil, nil, {if_not_exists = true})
    end
    log.info('smartcache api: %d procedures registered', #M.names)
end

return M
