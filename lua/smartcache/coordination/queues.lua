-- Task queues, after tarantool/queue's fifottl driver (no code copied).
--
-- A task is one tuple, written whole in one transaction, so a queue never
-- shows a task before it exists (Ignite's non-transactional queue moves its
-- tail first and stores the element after, so a reader can find the slot
-- empty). States:
--
--            put                     take (ttr)               ack
--   (none) ──────> ready ──────────────────────────> taken ─────────> (deleted)
--     │ put(delay)  ^  ^ delay ends        release     │ │
--     v             │  └──────── delayed <─(delay)─────┘ │
--   delayed ────────┘                                    │ time-to-run passes
--                   ^────────────────────────────────────┘ (back to ready)
--   past its TTL, whatever its state (taken included): deleted.
--
-- The TTL (ttl_ms) counts from when the task is first ready (put + its
-- delay); a release's delay does not move it, and a take's time-to-run ends
-- at it at the latest, so a taken task past its TTL is deleted then (its
-- taker's ack or release answers NOT_FOUND), not handed to another taker.
--
-- take() gives the first ready task by (priority, id): FIFO within a
-- priority, 0 first. With none ready it waits up to wait_ms on a fiber.cond,
-- takers served in arrival order, woken by the trigger that sees a task turn
-- ready (put, release, a delay or a time-to-run that ended). One fiber moves
-- tasks whose time came (delay ended, time-to-run passed, TTL passed) by the
-- `watch` index (state, next_event), sleeping until the earliest next_event;
-- it does nothing on an instance that may not write.
--
-- A take's answer carries `attempt` (how many times the task was taken); an
-- ack or release that names it is refused (CONFLICT) once the task was taken
-- again by someone else, after this taker's time-to-run had passed.
local fiber = require('fiber')
local clock = require('clock')
local log = require('log')
local util = require('smartcache.util')
local config = require('smartcache.config')
local coord = require('smartcache.coordination.common')
local idempotency = require('smartcache.idempotency')
local waitlist = require('smartcache.coordination.waitlist')
local sharding = require('smartcache.sharding')
local F = require('smartcache.schema').F.queue_tasks

local M = {}

local READY, TAKEN, DELAYED = 'ready', 'taken', 'delayed'
M.MAX_PRIORITY = 255
M.DEFAULT_TTR_MS = 30000
-- Takers per queue, in arrival order.
M.waiters = waitlist.new()
M.counters = {ttr_returned = 0, expired = 0, delay_ended = 0, errors = 0}
-- Wakes the timeout fiber early (a task with an earlier event than it sleeps to).
M.wake = fiber.cond()
M.wake_at = nil

local function space()
    return box.space.queue_tasks
end

local function task_fields(t, attempt, ttr_ms)
    return {task_id = t[F.id], payload = t[F.payload], priority = t[F.priority], attempt = attempt,
            ttr_ms = ttr_ms}
end

-- OK {task_id}.
function M.put(name, payload, priority, delay_ms, ttl_ms)
    priority, delay_ms, ttl_ms = util.opt(priority, 0), util.opt(delay_ms, 0), coord.arg(ttl_ms)
    local err = coord.check_name(name) or coord.check_int(priority, 'priority', 0, M.MAX_PRIORITY)
        or coord.check_int(delay_ms, 'delay_ms', 0, config.max_ttl_ms)
        or coord.check_int(ttl_ms, 'ttl_ms', 1, config.max_ttl_ms, true)
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    local expires_at = ttl_ms and now + delay_ms + ttl_ms or coord.NEVER
    local state, next_event = READY, expires_at
    if delay_ms > 0 then
        state, next_event = DELAYED, now + delay_ms
    end
    return util.atomic(function()
        local id = box.sequence.sc_task_id:next()
        space():insert({id, name, state, priority, next_event, expires_at, now, 0, 0, '', payload})
        return util.result('OK', {task_id = id})
    end)
end

-- The task taken under this idempotency key, while it is still taken (a repeated take).
local function taken_under(key, name)
    for _, t in space().index.by_taken_key:pairs({key}) do
        if t[F.state] == TAKEN then
            if t[F.queue] ~= name then
                return util.bad_request('idempotency_key was used for a different request')
            end
            local r = task_fields(t, t[F.attempt], t[F.ttr_ms])
            r.replayed = true
            return util.result('OK', r)
        end
    end
    return nil
end

-- One transaction: take the first live ready task, or nil.
local function try_take(name, ttr_ms, key)
    local now = util.now_ms()
    return util.atomic(function()
        for _, t in space().index.ready:pairs({name, READY}) do
            if t[F.expires_at] > now then
                local attempt = t[F.attempt] + 1
                space():update(t[F.id], {
                    {'=', F.state, TAKEN}, {'=', F.next_event, math.min(now + ttr_ms, t[F.expires_at])},
                    {'=', F.attempt, attempt}, {'=', F.ttr_ms, ttr_ms}, {'=', F.taken_key, key or ''},
                })
                return util.result('OK', task_fields(t, attempt, ttr_ms))
            end
        end
        return nil
    end)
end

local function wait_task(w, name, ttr_ms, key, stop)
    local waiters = M.waiters
    while true do
        local left = stop - clock.monotonic()
        if left <= 0 then
            return util.result('TIMEOUT', {message = 'no task ready within wait_ms'})
        end
        waiters:wait(w, math.min(left, config.WRITABLE_CHECK_S))
        if not util.writable() then
            return coord.NOT_LEADER
        end
        local moving = sharding.refusal('key', name)  -- its bucket began to move
        if moving then
            return moving
        end
        if waiters:is_head(w) then
            local got = try_take(name, ttr_ms, key)
            if got ~= nil then
                return got
            end
        end
    end
end

-- OK {task_id, payload, priority, attempt, ttr_ms} · TIMEOUT · NOT_LEADER.
-- With an idempotency key, a repeat returns the task taken under it while
-- that task is still taken (replayed = true).
function M.take(deadline_ms, key, name, wait_ms, ttr_ms)
    wait_ms, ttr_ms = util.opt(wait_ms, 0), util.opt(ttr_ms, M.DEFAULT_TTR_MS)
    local err = coord.check_name(name) or coord.check_int(wait_ms, 'wait_ms', 0, config.max_wait_ms)
        or coord.check_int(ttr_ms, 'ttr_ms', 1, config.max_ttl_ms)
        or (key ~= nil and idempotency.check_key(key)) or nil
    if err ~= nil then
        return util.bad_request(err)
    end
    if not util.writable() then
        return coord.NOT_LEADER
    end
    if key ~= nil then
        local again = taken_under(key, name)
        if again ~= nil then
            return again
        end
    end
    local waiters = M.waiters
    if waiters:count(name) == 0 then
        local got = try_take(name, ttr_ms, key)
        if got ~= nil then
            return got
        end
    end
    local stop = coord.wait_end(wait_ms, deadline_ms)
    if clock.monotonic() >= stop then
        return util.result('TIMEOUT', {message = 'no task ready'})
    end
    return waiters:in_line(name, wait_task, name, ttr_ms, key, stop)
end

-- The task, when it belongs to queue `name`; else a NOT_FOUND or CONFLICT answer.
local function held(name, task_id, attempt, states)
    local t = space():get(task_id)
    if t == nil or t[F.queue] ~= name then
        return nil, util.result('NOT_FOUND')
    end
    if not states[t[F.state]] or (attempt ~= nil and t[F.attempt] ~= attempt) then
        return nil, util.result('CONFLICT', {attempt = t[F.attempt], state = t[F.state]})
    end
    return t
end

local function check_task(name, task_id, attempt)
    return coord.check_name(name) or coord.check_int(task_id, 'task_id', 0, coord.MAX_SAFE)
        or coord.check_int(attempt, 'attempt', 1, coord.MAX_SAFE, true)
end

-- Done: delete the task. With `attempt`: only if nobody took it since that
-- take (a task back in ready after its time-to-run may still be acked by the
-- taker that did the work). Without: only while it is taken.
-- OK · NOT_FOUND · CONFLICT {attempt, state}.
function M.ack(name, task_id, attempt)
    task_id, attempt = coord.arg(task_id), coord.arg(attempt)
    local err = check_task(name, task_id, attempt)
    if err ~= nil then
        return util.bad_request(err)
    end
    return util.atomic(function()
        local _, refused = held(name, task_id, attempt,
            attempt == nil and {[TAKEN] = true} or {[TAKEN] = true, [READY] = true})
        if refused ~= nil then
            return refused
        end
        space():delete(task_id)
        return util.result('OK')
    end)
end

-- Give a taken task back: ready now, or after delay_ms. OK · NOT_FOUND · CONFLICT {attempt, state}.
function M.release(name, task_id, attempt, delay_ms)
    task_id, attempt, delay_ms = coord.arg(task_id), coord.arg(attempt), util.opt(delay_ms, 0)
    local err = check_task(name, task_id, attempt) or coord.check_int(delay_ms, 'delay_ms', 0, config.max_ttl_ms)
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    return util.atomic(function()
        local t, refused = held(name, task_id, attempt, {[TAKEN] = true})
        if refused ~= nil then
            return refused
        end
        local state, next_event = READY, t[F.expires_at]
        if delay_ms > 0 then
            state, next_event = DELAYED, now + delay_ms
        end
        space():update(task_id, {{'=', F.state, state}, {'=', F.next_event, next_event}, {'=', F.taken_key, ''}})
        return util.result('OK')
    end)
end

-- OK {ready, taken, delayed, waiters} (for operators).
function M.stats(name)
    local err = coord.check_name(name)
    if err ~= nil then
        return util.bad_request(err)
    end
    local idx = space().index.ready
    return util.result('OK', {ready = idx:count({name, READY}), taken = idx:count({name, TAKEN}),
                              delayed = idx:count({name, DELAYED}), waiters = M.waiters:count(name)})
end

-- The timeout fiber ---------------------------------------------------------------

-- A task whose next_event came: past its TTL (any state; a ready task's next_event is its
-- TTL) -> deleted; else delayed -> ready, taken -> ready (its time-to-run passed).
local function due(t, now)
    local id, state = t[F.id], t[F.state]
    if state == READY or t[F.expires_at] <= now then
        space():delete(id)
        M.counters.expired = M.counters.expired + 1
    elseif state == DELAYED then
        space():update(id, {{'=', F.state, READY}, {'=', F.next_event, t[F.expires_at]}})
        M.counters.delay_ended = M.counters.delay_ended + 1
    else
        space():update(id, {{'=', F.state, READY}, {'=', F.next_event, t[F.expires_at]}, {'=', F.taken_key, ''}})
        M.counters.ttr_returned = M.counters.ttr_returned + 1
    end
end

-- Due tasks of moving buckets passed over per state at most, and when to look at them again.
local SKIP_MAX, SKIP_PAUSE_MS = 10000, 500

-- Move up to one batch per state; returns (tasks moved, the earliest next_event still ahead or nil).
function M.process_once(now)
    local moved, next_at = 0, nil
    for _, state in ipairs({DELAYED, TAKEN, READY}) do
        local batch, skipped = {}, 0
        for _, t in space().index.watch:pairs({state}) do
            if t[F.next_event] > now then
                next_at = math.min(next_at or t[F.next_event], t[F.next_event])
                break
            end
            if sharding.serves_row('queue_tasks', t) then
                table.insert(batch, t)
            else
                skipped = skipped + 1  -- a moving bucket's task: the new shard's to move on
                if skipped >= SKIP_MAX then
                    break
                end
            end
            if #batch >= config.sweep_batch then
                next_at = now
                break
            end
        end
        if skipped > 0 and #batch == 0 then
            next_at = math.min(next_at or now + SKIP_PAUSE_MS, now + SKIP_PAUSE_MS)
        end
        if #batch > 0 then
            box.atomic(function()
                for _, t in ipairs(batch) do
                    due(t, now)
                end
            end)
            moved = moved + #batch
        end
    end
    return moved, next_at
end


local function loop()
    fiber.name('queue_timeouts')
    while true do
        local sleep_s = config.sweep_max_sleep_s
        if box.space.queue_tasks ~= nil and util.writable() then
            local ok, moved, next_at = pcall(M.process_once, util.now_ms())
            if not ok then
                M.counters.errors = M.counters.errors + 1
                log.error('queue timeouts: %s', tostring(moved))
                sleep_s = config.ERROR_PAUSE_S
            elseif next_at ~= nil then
                sleep_s = math.min(sleep_s, math.max(next_at - util.now_ms(), 0) / 1000)
            end
        end
        if sleep_s > 0 then
            M.wake_at = util.now_ms() + sleep_s * 1000
            M.wake:wait(sleep_s)
            M.wake_at = nil
        else
            fiber.yield()
        end
    end
end

function M.start()
    if M.fiber == nil or M.fiber:status() == 'dead' then
        M.fiber = fiber.create(loop)
    end
end

-- A task turned ready: the first taker may have it. A task with an event
-- before the fiber's wake-up: wake the fiber.
local function on_replace(old, new)
    if new == nil then
        return
    end
    if new[F.state] == READY and (old == nil or old[F.state] ~= READY) then
        M.waiters:wake_head(new[F.queue])
    end
    if M.wake_at ~= nil and new[F.next_event] < M.wake_at then
        M.wake:signal()
    end
end

function M.install()
    space():on_replace(on_replace, M.installed)
    M.installed = on_replace
end

return M
