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
local log = require('log')
local fiber = require('fiber')
local sessions = require('smartcache.sessions')
local coordination = require('smartcache.coordination')
local events = require('smartcache.events')
local stats = require('smartcache.stats')
local digest = require('smartcache.digest')
local idempotency = require('smartcache.idempotency')
local failover = require('smartcache.failover')
local util = require('smartcache.util')
local config = require('smartcache.config')
local quorum = require('smartcache.quorum')
local memory = require('smartcache.memory')
local disk = require('smartcache.disk')
local compat = require('smartcache.compat')
local sharding = require('smartcache.sharding')

local M = {}

M.ROLE = 'smartcache_api'
-- Operators (smartcache-cli cluster): the cluster's actions, which the service never needs.
M.OPERATOR_ROLE = 'smartcache_operator'
-- Procedures only operators may call; and those both roles may call.
M.OPERATOR_ONLY = {['sc.switchover'] = true, ['sc.rejoin'] = true, ['sc.join_hold'] = true,
                   ['sc.topology_init'] = true, ['sc.topology_add'] = true, ['sc.topology_remove'] = true,
                   ['sc.buckets_init'] = true, ['sc.digest'] = true}
M.OPERATOR_TOO = {['sc.role'] = true, ['sc.stats'] = true, ['sc.ping'] = true}
for _, name in ipairs({'buckets_held', 'bucket_state', 'bucket_rows', 'bucket_send_start', 'bucket_send_abort',
                       'bucket_send_done', 'bucket_gc', 'bucket_recv_start', 'bucket_recv', 'bucket_recv_done',
                       'bucket_recv_abort'}) do
    M.OPERATOR_TOO['sc.' .. name] = true  -- the operator's moves, and the settler of every service instance
end

local function ping()
    return util.result('OK', {time_ms = util.now_ms(), read_only = box.info.ro})
end

-- Procedures that change data. Their answers may be stored under an idempotency key.
local writes = {
    session_create = sessions.create,
    session_touch = sessions.touch,
    session_update = sessions.update,
    session_delete = sessions.delete,
    session_rotate = sessions.rotate,
    cache_put = sessions.cache_put,
    cache_delete = sessions.cache_delete,
    device_bind = sessions.device_bind,
    prewarm_acquire = sessions.prewarm_acquire,
    prewarm_complete = sessions.prewarm_complete,
    prewarm_fail = sessions.prewarm_fail,
    counter_add = coordination.counter_add,
    counter_cas = coordination.counter_cas,
    register_cas = coordination.register_cas,
    sequence_reserve = coordination.sequence_reserve,
    semaphore_release = coordination.semaphore_release,
    semaphore_renew = coordination.semaphore_renew,
    latch_create = coordination.latch_create,
    latch_count_down = coordination.latch_count_down,
    queue_put = coordination.queue_put,
    queue_ack = coordination.queue_ack,
    queue_release = coordination.queue_release,
    event_publish = events.publish,
}

-- Everything else: reads, waits, and reads that write only opportunistically
-- (session_get slides the deadline when it can, and answers the data when it cannot).
local reads = {
    ping = ping,
    session_get = sessions.get,
    session_locate = sessions.locate,  -- where a version 4 id lives (sharding); unrouted: asked of every shard
    session_list = sessions.list,
    cache_get = sessions.cache_get,
    device_lookup = sessions.device_lookup,
    prewarm_wait = sessions.prewarm_wait,
    stats = stats.stats,
    counter_get = coordination.counter_get,
    register_get = coordination.register_get,
    sequence_get = coordination.sequence_get,
    semaphore_get = coordination.semaphore_get,
    latch_get = coordination.latch_get,
    queue_stats = coordination.queue_stats,
    events_stats = events.stats,
    digest = digest.digest,  -- operators: this instance's data, space by space (compare a follower with the leader)
    -- Failover (smartcache.failover): what the service polls, and the operator's actions.
    role = failover.role,
    switchover = failover.switchover,
    rejoin = failover.rejoin,
    join_hold = failover.join_hold,  -- asked by an instance about to join (the replication user may call it)
    -- Membership as data in etcd (smartcache.failover.membership): the leader changes it.
    topology_init = failover.topology_init,
    topology_add = failover.topology_add,
    topology_remove = failover.topology_remove,
    -- Sharding: a shard takes its buckets (the operator, at cluster init --shards).
    buckets_init = sharding.buckets_init,
    -- Moves of buckets between shards (smartcache.sharding.moves): each a checked transition of one bucket,
    -- driven by the operator's command and by every service instance's settler.
    buckets_held = sharding.buckets_held,
    bucket_state = sharding.bucket_state,
    bucket_rows = sharding.bucket_rows,
    bucket_send_start = sharding.bucket_send_start,
    bucket_send_abort = sharding.bucket_send_abort,
    bucket_send_done = sharding.bucket_send_done,
    bucket_gc = sharding.bucket_gc,
    bucket_recv_start = sharding.bucket_recv_start,
    bucket_recv = sharding.bucket_recv,
    bucket_recv_done = sharding.bucket_recv_done,
    bucket_recv_abort = sharding.bucket_recv_abort,
}

-- Procedures that may wait (on a fiber.cond, outside any transaction) before
-- they answer. They get the call's deadline (ms, or nil) and idempotency key
-- (or nil) first, grant nothing after the deadline, check util.writable()
-- themselves before writing and write in short transactions of their own.
-- Not in `writes`: a yield inside the idempotency wrapper's transaction would
-- abort it; each says what a repeat does (the holder of an acquire, the key
-- of a take).
local waits = {
    semaphore_acquire = coordination.semaphore_acquire,
    latch_await = coordination.latch_await,
    queue_take = coordination.queue_take,
    -- Writes in several transactions (batches), each checking util.writable(); the key is stored with the last.
    session_delete_client = sessions.delete_client,
    events_read = events.read,  -- a read that waits for the next commit; NOT_LEADER off the writable instance
}

-- Only with SC_DEBUG_PROCEDURES=1 (tests): a deliberately slow procedure.
if config.debug_procedures then
    reads.debug_sleep = function(ms)
        fiber.sleep((tonumber(ms) or 0) / 1000)
        return util.result('OK', {slept_ms = ms})
    end
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
local function published(_, key)
    if key == nil or key == '' then
        return nil  -- an event with no key: any shard's log
    end
    return 'key', key
end
M.ROUTE = {
    session_create = create_call, session_get = first_session, session_touch = first_session,
    session_update = first_session, session_delete = first_session, session_rotate = first_session,
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
              bucket_recv = true, bucket_recv_done = true, bucket_recv_abort = true, digest = true}

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

-- Single-key reads of guarded spaces: the space whose key is the first argument.
-- They wait for a pending write of that key (smartcache.quorum: no dirty reads,
-- compat.NO_MVCC_DIRTY_READS).
local KEYED_READS = {session_get = 'sessions', device_lookup = 'device', counter_get = 'counters',
                     register_get = 'registers', sequence_get = 'sequences', semaphore_get = 'semaphore_holders',
                     latch_get = 'latches'}

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
            if past(meta) then
                return DEADLINE_EXCEEDED
            end
            local wrong = misrouted(name, ...)
            if wrong ~= nil then
                return wrong
            end
            return counted(pcall(fn, ...))
        end
    end
    return function(meta, key, ...)
        if past(meta) then
            return DEADLINE_EXCEEDED
        end
        local wrong = misrouted(name, key, ...)
        if wrong ~= nil then
            return wrong
        end
        if quorum.enabled and key ~= nil and not quorum.wait_key(space_name, key, wait_deadline_s(meta)) then
            return WRITE_PENDING
        end
        return counted(pcall(fn, key, ...))
    end
end

-- Writes whose answer reads the key's current state (a compare-and-set's CONFLICT, a NOT_FOUND, the
-- value a counter reaches), by the space whose key is the first argument. Like the keyed reads they
-- wait until their key has no pending write (compat.NO_MVCC_DIRTY_READS): a CONFLICT answered against
-- a write that then rolled back names a revision that never existed (the fault suite's linearizability
-- check found one in partition-leader-followers). A write on top of a pending one needs no wait to be
-- right (it would roll back with it), only the answers that refuse need it; waiting for all keeps it
-- simple, and costs a write only the pending one's quorum wait.
local KEYED_WRITES = {session_update = 'sessions', session_touch = 'sessions', session_delete = 'sessions',
                      session_rotate = 'sessions', session_create = 'sessions', counter_add = 'counters',
                      counter_cas = 'counters', register_cas = 'registers', sequence_reserve = 'sequences',
                      latch_create = 'latches', latch_count_down = 'latches', device_bind = 'device',
                      semaphore_release = 'semaphore_holders', semaphore_renew = 'semaphore_holders'}

local function write_procedure(name, fn)
    local space_name = compat.NO_MVCC_DIRTY_READS and KEYED_WRITES[name] or nil
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
        if past(meta) then
            return DEADLINE_EXCEEDED
        end
        local wrong = misrouted(name, ...)
        if wrong ~= nil then
            return wrong
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
for name, fn in pairs(reads) do
    _G.sc[name] = read_procedure(name, fn, KEYED_READS[name])
end
for name, fn in pairs(writes) do
    _G.sc[name] = write_procedure(name, fn)
end
for name, fn in pairs(waits) do
    _G.sc[name] = wait_procedure(name, fn)
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
