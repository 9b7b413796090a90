#!/usr/bin/env tarantool
-- Task queues (smartcache.coordination.queues).
local tap = require('tap')
local fiber = require('fiber')
local clock = require('clock')
local helper = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'helper.lua')
helper.start()
local util = require('smartcache.util')
local queues = require('smartcache.coordination.queues')
local F = require('smartcache.schema').F.queue_tasks

local TTR = 60000

local test = tap.test('queues')
test:plan(15)

local function take_async(name, wait_ms, ttr_ms, meta)
    local ch = fiber.channel(1)
    fiber.create(function()
        local started = clock.monotonic()
        local r = sc.queue_take(meta, name, wait_ms, ttr_ms)
        ch:put({r, clock.monotonic() - started})
    end)
    return ch
end

local function wait_takers(name, n)
    local deadline = clock.monotonic() + 5
    while queues.waiters:count(name) < n and clock.monotonic() < deadline do
        fiber.sleep(0.001)
    end
    return queues.waiters:count(name) == n
end

-- Until the task is in `state` (moved by the timeout fiber), at most 5 s.
local function wait_state(id, state)
    local deadline = clock.monotonic() + 5
    while clock.monotonic() < deadline do
        local t = box.space.queue_tasks:get(id)
        if (t and t[F.state]) == state then
            return true
        end
        fiber.sleep(0.005)
    end
    return false
end

test:test('put, take, ack: the task goes away', function(t)
    t:plan(6)
    local p = sc.queue_put(nil, 'q1', {doc = 7})
    t:is(p.status, 'OK', 'put')
    local r = sc.queue_take(nil, 'q1', 0, TTR)
    t:is_deeply({r.status, r.task_id, r.payload.doc, r.attempt}, {'OK', p.task_id, 7, 1}, 'taken, attempt 1')
    t:is(sc.queue_take(nil, 'q1', 0, TTR).status, 'TIMEOUT', 'nothing else ready')
    t:is(sc.queue_stats(nil, 'q1').taken, 1, 'one taken')
    t:is(sc.queue_ack(nil, 'q1', r.task_id, r.attempt).status, 'OK', 'acked')
    t:is(box.space.queue_tasks:get(r.task_id), nil, 'gone')
end)

test:test('FIFO within a priority; a lower priority number first', function(t)
    t:plan(1)
    for i = 1, 3 do
        sc.queue_put(nil, 'q-order', 'low' .. i, 5)
        sc.queue_put(nil, 'q-order', 'high' .. i, 1)
    end
    local got = {}
    for _ = 1, 6 do
        table.insert(got, sc.queue_take(nil, 'q-order', 0, TTR).payload)
    end
    t:is_deeply(got, {'high1', 'high2', 'high3', 'low1', 'low2', 'low3'}, 'order')
end)

test:test('a waiting take is woken by the put (push)', function(t)
    t:plan(3)
    local ch = take_async('q-wait', 10000, TTR)
    t:ok(wait_takers('q-wait', 1), 'waiting')
    local put_at = clock.monotonic()
    sc.queue_put(nil, 'q-wait', 'job')
    local got = ch:get(5)
    t:is(got[1].payload, 'job', 'got the task')
    t:ok(clock.monotonic() - put_at < 0.2, 'at once, not at the writable check or the end of the wait')
end)

test:test('takers are served in arrival order', function(t)
    t:plan(1)
    local chs = {}
    for i = 1, 3 do
        chs[i] = take_async('q-takers', 10000, TTR)
        wait_takers('q-takers', i)
    end
    for i = 1, 3 do
        sc.queue_put(nil, 'q-takers', 'job' .. i)
    end
    local got = {}
    for i = 1, 3 do
        table.insert(got, chs[i]:get(5)[1].payload)
    end
    t:is_deeply(got, {'job1', 'job2', 'job3'}, 'the first taker got the first task')
end)

test:test('a taken task whose time-to-run passes goes back to ready; the old taker cannot ack it', function(t)
    t:plan(6)
    local p = sc.queue_put(nil, 'q-ttr', 'slow job')
    local first = sc.queue_take(nil, 'q-ttr', 0, 100)
    t:is(first.task_id, p.task_id, 'taken for 100 ms')
    t:ok(wait_state(p.task_id, 'ready'), 'back to ready after the time-to-run (timeout fiber)')
    local second = sc.queue_take(nil, 'q-ttr', 1000, TTR)
    t:is_deeply({second.task_id, second.attempt}, {p.task_id, 2}, 'taken again: attempt 2')
    local stale = sc.queue_ack(nil, 'q-ttr', p.task_id, first.attempt)
    t:is_deeply({stale.status, stale.attempt}, {'CONFLICT', 2}, 'the first taker is refused')
    t:is(sc.queue_ack(nil, 'q-ttr', p.task_id, second.attempt).status, 'OK', 'the second acks')
    t:ok(queues.counters.ttr_returned >= 1, 'counted')
end)

test:test('a task back in ready after its time-to-run may still be acked by the taker that did the work', function(t)
    t:plan(2)
    local p = sc.queue_put(nil, 'q-late-ack', 'job')
    local r = sc.queue_take(nil, 'q-late-ack', 0, 50)
    t:ok(wait_state(p.task_id, 'ready'), 'returned')
    t:is(sc.queue_ack(nil, 'q-late-ack', p.task_id, r.attempt).status, 'OK', 'acked: nobody took it since')
end)

test:test('a waiting take is woken when a time-to-run passes', function(t)
    t:plan(2)
    sc.queue_put(nil, 'q-ttr-wake', 'job')
    sc.queue_take(nil, 'q-ttr-wake', 0, 200)
    local got = take_async('q-ttr-wake', 5000, TTR):get(6)
    t:is(got[1].attempt, 2, 'the returned task')
    t:ok(got[2] >= 0.15 and got[2] < 1.5, 'at the end of the first time-to-run')
end)

test:test('release: ready at once, or delayed', function(t)
    t:plan(5)
    local p = sc.queue_put(nil, 'q-rel', 'job')
    local r = sc.queue_take(nil, 'q-rel', 0, TTR)
    t:is(sc.queue_release(nil, 'q-rel', p.task_id, r.attempt).status, 'OK', 'released')
    r = sc.queue_take(nil, 'q-rel', 0, TTR)
    t:is(r.attempt, 2, 'ready again')
    t:is(sc.queue_release(nil, 'q-rel', p.task_id, r.attempt, 150).status, 'OK', 'released with a delay')
    t:is(sc.queue_take(nil, 'q-rel', 0, TTR).status, 'TIMEOUT', 'not ready during the delay')
    t:is(take_async('q-rel', 5000, TTR):get(6)[1].attempt, 3, 'ready after it')
end)

test:test('put with a delay: ready when it ends', function(t)
    t:plan(3)
    local p = sc.queue_put(nil, 'q-delay', 'later', nil, 150)
    t:is(sc.queue_stats(nil, 'q-delay').delayed, 1, 'delayed')
    local got = take_async('q-delay', 5000, TTR):get(6)
    t:is(got[1].task_id, p.task_id, 'taken after the delay')
    t:ok(got[2] >= 0.1, 'not before')
end)

test:test('a ready task past its TTL is deleted and never taken', function(t)
    t:plan(3)
    local p = sc.queue_put(nil, 'q-ttl', 'stale', nil, nil, 60000)
    box.space.queue_tasks:update(p.task_id, {{'=', F.expires_at, util.now_ms() - 1},
                                             {'=', F.next_event, util.now_ms() - 1}})
    t:is(sc.queue_take(nil, 'q-ttl', 0, TTR).status, 'TIMEOUT', 'not taken')
    queues.process_once(util.now_ms())
    t:is(box.space.queue_tasks:get(p.task_id), nil, 'deleted by the timeout fiber')
    t:ok(queues.counters.expired >= 1, 'counted')
end)

test:test('a taken task past its TTL is deleted, not given back; its ack is NOT_FOUND', function(t)
    t:plan(5)
    local p = sc.queue_put(nil, 'q-ttl-taken', 'late', nil, nil, 150)
    local r = sc.queue_take(nil, 'q-ttl-taken', 0, TTR)
    t:is(r.task_id, p.task_id, 'taken with a time-to-run past the TTL')
    local returned, expired = queues.counters.ttr_returned, queues.counters.expired
    local deadline = clock.monotonic() + 5
    while box.space.queue_tasks:get(p.task_id) ~= nil and clock.monotonic() < deadline do
        fiber.sleep(0.005)
    end
    t:is(box.space.queue_tasks:get(p.task_id), nil, 'deleted at its TTL by the timeout fiber')
    t:is(queues.counters.expired, expired + 1, 'counted as expired')
    t:is(queues.counters.ttr_returned, returned, 'not as a time-to-run that passed')
    t:is(sc.queue_ack(nil, 'q-ttl-taken', r.task_id, r.attempt).status, 'NOT_FOUND', 'the taker learns it is gone')
end)

test:test('a take repeated under its idempotency key returns the same task', function(t)
    t:plan(4)
    sc.queue_put(nil, 'q-key', 'a')
    sc.queue_put(nil, 'q-key', 'b')
    local first = sc.queue_take({idempotency_key = 'k-take-1'}, 'q-key', 0, TTR)
    local again = sc.queue_take({idempotency_key = 'k-take-1'}, 'q-key', 0, TTR)
    t:is_deeply({again.task_id, again.payload, again.replayed}, {first.task_id, 'a', true}, 'same task')
    t:is(sc.queue_stats(nil, 'q-key').ready, 1, 'the other one still ready')
    t:is(sc.queue_take({idempotency_key = 'k-take-1'}, 'q-other', 0, TTR).status, 'BAD_REQUEST',
        'the key for another queue')
    sc.queue_ack(nil, 'q-key', first.task_id)
    t:is(sc.queue_take({idempotency_key = 'k-take-1'}, 'q-key', 0, TTR).payload, 'b',
        'once acked, the key takes anew')
end)

test:test('ack and release of a task of another queue or none: NOT_FOUND; release of a ready one: CONFLICT',
    function(t)
        t:plan(3)
        local p = sc.queue_put(nil, 'q-misc', 'x')
        t:is(sc.queue_ack(nil, 'q-elsewhere', p.task_id).status, 'NOT_FOUND', 'another queue')
        t:is(sc.queue_release(nil, 'q-misc', p.task_id).status, 'CONFLICT', 'not taken')
        t:is(sc.queue_ack(nil, 'q-misc', 999999999).status, 'NOT_FOUND', 'none')
    end)

test:test('task ids and attempts of 10^14 and more (64-bit cdata out of msgpack) are taken', function(t)
    t:plan(3)
    local msgpack = require('msgpack')
    local big = msgpack.decode(msgpack.encode(100000000000000ULL))
    t:is(sc.queue_ack(nil, 'q-big', big).status, 'NOT_FOUND', 'ack: no such task, not BAD_REQUEST')
    t:is(sc.queue_release(nil, 'q-big', big, big).status, 'NOT_FOUND', 'release with an attempt')
    t:is(sc.queue_ack(nil, 'q-big', 2 ^ 53).status, 'BAD_REQUEST', 'past 2^53 - 1: BAD_REQUEST')
end)

test:test('take answers NOT_LEADER on an instance that may not write', function(t)
    t:plan(1)
    local writable = util.set_writable(function() return false end)
    local r = sc.queue_take(nil, 'q-ro', 0, TTR)
    util.set_writable(writable)
    t:is(r.status, 'NOT_LEADER', 'NOT_LEADER')
end)

helper.finish(test)
