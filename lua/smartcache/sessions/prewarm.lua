-- Prewarm records: client data fetched from the core backend before login.
--
-- State diagram (see docs/storage.md, prewarm):
--
--   (absent) --acquire--> updating(owner, lease) --complete--> idle(data)
--                              |   \--fail-------------------> idle(old data)
--                              \--lease expires: counts as free; next acquire takes over
--   idle --acquire (data older than max_age)--> updating
--
-- wait() blocks on a fiber.cond signalled by an on_replace trigger, so it wakes
-- as soon as the record turns idle, whether the change was made here or
-- arrived by replication.
local fiber = require('fiber')
local util = require('smartcache.util')
local config = require('smartcache.config')
local events = require('smartcache.events')
local sharding = require('smartcache.sharding')
local memory = require('smartcache.memory')
local F = require('smartcache.schema').F.prewarm

local M = {}

local IDLE, UPDATING = 'idle', 'updating'

-- (client_id .. '\0' .. data_type) -> {cond = fiber.cond, waiters = n}
local waiting = {}

local function wait_key(client_id, data_type)
    return client_id .. '\0' .. tostring(data_type)
end

local function held(t, now)
    return t[F.state] == UPDATING and t[F.lease_until] > now
end

local function record_fields(t, now)
    return {data = t[F.data], updated_at_ms = t[F.updated_at], state = held(t, now) and UPDATING or IDLE,
            age_ms = t[F.updated_at] > 0 and now - t[F.updated_at] or nil,
            session_id = t[F.session_id], version = t[F.version]}
end

local function check_key(client_id, data_type)
    return util.check(client_id, 'string', 'client_id') or util.check(data_type, 'number', 'data_type')
end

-- FRESH {data}: idle with data no older than max_age_ms (nothing to do).
-- ACQUIRED: the caller now holds the lease for lease_ms and must complete or fail.
-- BUSY {lease_left_ms}: another owner holds an unexpired lease.
function M.acquire(client_id, data_type, owner, lease_ms, max_age_ms, session_id, version)
    local err = check_key(client_id, data_type) or util.check(owner, 'string', 'owner')
        or util.check_positive(lease_ms, 'lease_ms', config.max_wait_ms)
        or util.check(max_age_ms, 'number', 'max_age_ms')
        or util.check(session_id, 'string', 'session_id', true) or util.check(version, 'string', 'version', true)
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    return util.atomic(function()
        local t = box.space.prewarm:get({client_id, data_type})
        if t ~= nil then
            if held(t, now) and t[F.owner] ~= owner then
                return util.result('BUSY', {lease_left_ms = t[F.lease_until] - now})
            end
            if t[F.state] == IDLE and t[F.updated_at] > 0 and now - t[F.updated_at] <= max_age_ms then
                return util.result('FRESH', record_fields(t, now))
            end
        end
        local updated_at = t and t[F.updated_at] or 0
        local data = t and t[F.data] or nil
        box.space.prewarm:replace({client_id, data_type, util.opt(session_id, ''), util.opt(version, ''),
                                   updated_at, UPDATING, owner, now + lease_ms,
                                   now + config.prewarm_retention_ms, data})
        return util.result('ACQUIRED', {lease_ms = lease_ms})
    end)
end

local function release(client_id, data_type, owner, ops, done)
    local err = check_key(client_id, data_type) or util.check(owner, 'string', 'owner')
    if err ~= nil then
        return util.bad_request(err)
    end
    return util.atomic(function()
        local t = box.space.prewarm:get({client_id, data_type})
        if t == nil or t[F.state] ~= UPDATING or t[F.owner] ~= owner then
            return util.result('NOT_OWNER')
        end
        table.insert(ops, {'=', F.state, IDLE})
        table.insert(ops, {'=', F.owner, ''})
        table.insert(ops, {'=', F.lease_until, 0})
        box.space.prewarm:update({client_id, data_type}, ops)
        if done ~= nil then
            done()
        end
        return util.result('OK')
    end)
end

-- Store fetched data and turn idle; NOT_OWNER if the lease was taken over.
function M.complete(client_id, data_type, owner, data)
    local now = util.now_ms()
    return release(client_id, data_type, owner, {
        {'=', F.data, data}, {'=', F.updated_at, now}, {'=', F.expires_at, now + config.prewarm_retention_ms},
    }, function()
        memory.check_lossy('prewarm_complete')
        events.write('products.stored', client_id, {data_type = data_type})
    end)
end

-- Give the lease back without data, so the next asker can try.
function M.fail(client_id, data_type, owner)
    return release(client_id, data_type, owner, {})
end

-- Block until the record is not held by a live lease, or timeout_ms passes.
-- OK {data, updated_at_ms, state, age_ms}; NOT_FOUND: no record; TIMEOUT.
function M.wait(client_id, data_type, timeout_ms)
    local err = check_key(client_id, data_type)
        or util.check_positive(timeout_ms, 'timeout_ms', config.max_wait_ms)
    if err ~= nil then
        return util.bad_request(err)
    end
    local deadline = fiber.clock() + timeout_ms / 1000
    local key = wait_key(client_id, data_type)
    local waited = false
    while true do
        local moving = waited and sharding.refusal('key', client_id)  -- its bucket began to move
        if moving then
            return moving
        end
        waited = true
        local now = util.now_ms()
        local t = box.space.prewarm:get({client_id, data_type})
        if t == nil then
            return util.result('NOT_FOUND')
        end
        if not held(t, now) then
            return util.result('OK', record_fields(t, now))
        end
        -- Wake at the timeout, on a change, or when the lease runs out.
        local left = math.min(deadline - fiber.clock(), (t[F.lease_until] - now) / 1000)
        if deadline - fiber.clock() <= 0 then
            return util.result('TIMEOUT')
        end
        local w = waiting[key]
        if w == nil then
            w = {cond = fiber.cond(), waiters = 0, client_id = client_id}
            waiting[key] = w
        end
        w.waiters = w.waiters + 1
        w.cond:wait(math.max(left, 0.001))
        w.waiters = w.waiters - 1
        if w.waiters == 0 and waiting[key] == w then
            waiting[key] = nil
        end
    end
end

-- Wake every waiter of the clients for which match(client_id) is true (their bucket began to move).
function M.wake_clients(match)
    for _, w in pairs(waiting) do
        if match(w.client_id) then
            w.cond:broadcast()
        end
    end
end
sharding.on_moving(M.wake_clients)

-- on_replace trigger: wake waiters of a record that changed (local or replicated).
function M.on_replace(old, new)
    local t = new or old
    if t == nil then
        return
    end
    local w = waiting[wait_key(t[F.client_id], t[F.data_type])]
    if w ~= nil then
        w.cond:broadcast()
    end
end

-- Install M.on_replace on the prewarm space, once: a second call replaces the first one's.
local installed = nil
function M.install_trigger()
    box.space.prewarm:on_replace(M.on_replace, installed)
    installed = M.on_replace
end

return M
