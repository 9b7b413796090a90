#!/usr/bin/env tarantool
local tap = require('tap')
local fiber = require('fiber')
local helper = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'helper.lua')
helper.start()
local F = require('smartcache.schema').F.prewarm

local test = tap.test('prewarm')
test:plan(8)

local LEASE, MAX_AGE = 5000, 60000

test:test('first acquire wins, complete stores data, then FRESH', function(t)
    t:plan(5)
    t:is(sc.prewarm_acquire(nil, 'c1', 1, 'svc-a', LEASE, MAX_AGE).status, 'ACQUIRED', 'acquired')
    t:is(box.space.prewarm:get({'c1', 1})[F.state], 'updating', 'state updating')
    t:is(sc.prewarm_complete(nil, 'c1', 1, 'svc-a', {'acc-1'}).status, 'OK', 'completed')
    local r = sc.prewarm_acquire(nil, 'c1', 1, 'svc-b', LEASE, MAX_AGE)
    t:is(r.status, 'FRESH', 'fresh now')
    t:is(r.data[1], 'acc-1', 'with the data')
end)

test:test('two owners racing: exactly one ACQUIRED', function(t)
    t:plan(2)
    local results = {}
    local done = fiber.channel(10)
    for i = 1, 10 do
        fiber.create(function()
            results[i] = sc.prewarm_acquire(nil, 'c2', 1, 'owner-' .. i, LEASE, MAX_AGE).status
            done:put(true)
        end)
    end
    for _ = 1, 10 do
        done:get()
    end
    local acquired, busy = 0, 0
    for _, s in pairs(results) do
        if s == 'ACQUIRED' then acquired = acquired + 1 elseif s == 'BUSY' then busy = busy + 1 end
    end
    t:is(acquired, 1, 'one ACQUIRED')
    t:is(busy, 9, 'nine BUSY')
end)

test:test('only the owner completes or fails', function(t)
    t:plan(3)
    sc.prewarm_acquire(nil, 'c-own', 1, 'owner', LEASE, MAX_AGE)
    t:is(sc.prewarm_complete(nil, 'c-own', 1, 'intruder', 'x').status, 'NOT_OWNER', 'intruder refused')
    t:is(sc.prewarm_fail(nil, 'c-own', 1, 'owner').status, 'OK', 'owner fails it')
    t:is(sc.prewarm_acquire(nil, 'c-own', 1, 'owner-x', LEASE, MAX_AGE).status, 'ACQUIRED', 'free again after fail')
end)

test:test('wait returns as soon as complete runs in another fiber', function(t)
    t:plan(4)
    sc.prewarm_acquire(nil, 'c3', 1, 'svc-a', LEASE, MAX_AGE)
    local started = fiber.clock()
    fiber.create(function()
        fiber.sleep(0.2)
        sc.prewarm_complete(nil, 'c3', 1, 'svc-a', 'cards')
    end)
    local r = sc.prewarm_wait(nil, 'c3', 1, 3000)
    local waited = fiber.clock() - started
    t:is(r.status, 'OK', 'OK')
    t:is(r.data, 'cards', 'with the data')
    t:ok(waited >= 0.19, 'not before complete')
    t:ok(waited < 1.0, 'right after complete, not at the timeout')
end)

test:test('wait times out while the lease is held', function(t)
    t:plan(2)
    sc.prewarm_acquire(nil, 'c4', 1, 'svc-a', LEASE, MAX_AGE)
    local started = fiber.clock()
    t:is(sc.prewarm_wait(nil, 'c4', 1, 300).status, 'TIMEOUT', 'TIMEOUT')
    t:ok(fiber.clock() - started >= 0.29, 'after the timeout')
end)

test:test('wait on an absent or idle record answers at once', function(t)
    t:plan(2)
    sc.prewarm_acquire(nil, 'c-idle', 1, 'svc-a', LEASE, MAX_AGE)
    sc.prewarm_complete(nil, 'c-idle', 1, 'svc-a', 'data')
    t:is(sc.prewarm_wait(nil, 'nobody', 1, 1000).status, 'NOT_FOUND', 'absent')
    t:is(sc.prewarm_wait(nil, 'c-idle', 1, 1000).status, 'OK', 'idle')
end)

test:test('an expired lease is taken over', function(t)
    t:plan(4)
    sc.prewarm_acquire(nil, 'c5', 1, 'crashed', 200, MAX_AGE)
    t:is(sc.prewarm_acquire(nil, 'c5', 1, 'svc-b', LEASE, MAX_AGE).status, 'BUSY', 'busy while the lease runs')
    fiber.sleep(0.25)
    t:is(sc.prewarm_acquire(nil, 'c5', 1, 'svc-b', LEASE, MAX_AGE).status, 'ACQUIRED', 'taken over after it')
    t:is(sc.prewarm_complete(nil, 'c5', 1, 'crashed', 'late').status, 'NOT_OWNER', 'crashed owner cannot complete')
    t:is(sc.prewarm_complete(nil, 'c5', 1, 'svc-b', 'ok').status, 'OK', 'new owner completes')
end)

test:test('stale data is re-acquired; bad arguments are BAD_REQUEST', function(t)
    t:plan(3)
    sc.prewarm_acquire(nil, 'c-stale', 1, 'svc-a', LEASE, MAX_AGE)
    sc.prewarm_complete(nil, 'c-stale', 1, 'svc-a', 'data')
    box.space.prewarm:update({'c-stale', 1}, {{'-', F.updated_at, 1000}})  -- a second old
    t:is(sc.prewarm_acquire(nil, 'c-stale', 1, 'svc-a', LEASE, 0).status, 'ACQUIRED', 'max_age 0 forces a refresh')
    t:is(sc.prewarm_acquire(nil, nil, 1, 'svc-a', LEASE, 0).status, 'BAD_REQUEST', 'client id required')
    t:is(sc.prewarm_wait(nil, 'c1', 1, 0).status, 'BAD_REQUEST', 'timeout must be positive')
end)

helper.finish(test)
