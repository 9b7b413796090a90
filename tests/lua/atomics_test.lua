#!/usr/bin/env tarantool
-- Counters, registers and sequences (smartcache.coordination.atomics).
local tap = require('tap')
local fiber = require('fiber')
local msgpack = require('msgpack')
local helper = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'helper.lua')
helper.start()
local util = require('smartcache.util')
local expiry = require('smartcache.expiry')
local FC = require('smartcache.schema').F.counters

local test = tap.test('atomics')
test:plan(15)

test:test('counter: add creates at 0, returns the new value and revision', function(t)
    t:plan(5)
    t:is(sc.counter_get(nil, 'c-add').status, 'NOT_FOUND', 'absent before')
    local r = sc.counter_add(nil, 'c-add', 1)
    t:is_deeply({r.status, r.value, r.rev}, {'OK', 1, 1}, 'first add: 1, rev 1')
    r = sc.counter_add(nil, 'c-add', -5)
    t:is_deeply({r.status, r.value, r.rev}, {'OK', -4, 2}, 'negative delta')
    t:is(sc.counter_add(nil, 'c-add', nil).value, -3, 'delta defaults to 1')
    r = sc.counter_get(nil, 'c-add')
    t:is_deeply({r.status, r.value, r.rev, r.expires_in_ms}, {'OK', -3, 3, nil}, 'get: no TTL, no expires_in_ms')
end)

test:test('counter: bounds refuse a change that would leave them, changing nothing', function(t)
    t:plan(5)
    for _ = 1, 3 do
        sc.counter_add(nil, 'c-bound', 1, nil, 3)
    end
    local r = sc.counter_add(nil, 'c-bound', 1, nil, 3)
    t:is_deeply({r.status, r.value, r.rev}, {'CONFLICT', 3, 3}, 'the 4th attempt is refused with the current value')
    t:is(sc.counter_get(nil, 'c-bound').value, 3, 'unchanged')
    r = sc.counter_add(nil, 'c-bound', -4, 0)
    t:is_deeply({r.status, r.value}, {'CONFLICT', 3}, 'lower bound')
    t:is(sc.counter_add(nil, 'c-bound', -3, 0).value, 0, 'down to the lower bound is fine')
    t:is(sc.counter_add(nil, 'c-bound', 1, 5, 4).status, 'BAD_REQUEST', 'min > max')
end)

test:test('counter: a TTL makes a fixed window; an expired counter starts again at 0', function(t)
    t:plan(5)
    local r = sc.counter_add(nil, 'c-window', 1, nil, nil, 60000)
    t:ok(r.expires_in_ms > 59000 and r.expires_in_ms <= 60000, 'expires_in_ms from the TTL')
    r = sc.counter_add(nil, 'c-window', 1, nil, nil, 1)
    t:ok(r.expires_in_ms > 59000, 'a later add keeps the window (its ttl does not move it)')
    box.space.counters:update('c-window', {{'=', FC.expires_at, util.now_ms() - 1}})
    t:is(sc.counter_get(nil, 'c-window').status, 'NOT_FOUND', 'past its deadline: absent at once, swept or not')
    r = sc.counter_add(nil, 'c-window', 1, nil, nil, 60000)
    t:is_deeply({r.value, r.rev}, {1, 1}, 'a new window starts at 0')
    box.space.counters:update('c-window', {{'=', FC.expires_at, util.now_ms() - 1}})
    expiry.sweep_once('counters')
    t:is(box.space.counters:get('c-window'), nil, 'the expiry fiber removes it')
end)

test:test('counter: compare-and-set; absent counts as 0', function(t)
    t:plan(4)
    local r = sc.counter_cas(nil, 'c-cas', 0, 10)
    t:is_deeply({r.status, r.value, r.rev}, {'OK', 10, 1}, 'from absent (0) to 10')
    r = sc.counter_cas(nil, 'c-cas', 0, 11)
    t:is_deeply({r.status, r.value, r.rev}, {'CONFLICT', 10, 1}, 'wrong expectation: the current value')
    r = sc.counter_cas(nil, 'c-cas', 10, 11)
    t:is_deeply({r.status, r.value, r.rev}, {'OK', 11, 2}, 'right expectation')
    t:is(sc.counter_cas(nil, 'c-cas', 'x', 1).status, 'BAD_REQUEST', 'expected must be an integer')
end)

test:test('counter: values stay within +-(2^53 - 1)', function(t)
    t:plan(3)
    local max = 2 ^ 53 - 1
    t:is(sc.counter_cas(nil, 'c-big', 0, max).value, max, 'the largest value')
    t:is(sc.counter_add(nil, 'c-big', 1).status, 'CONFLICT', 'beyond it: refused')
    t:is(sc.counter_add(nil, 'c-big', 2 ^ 53).status, 'BAD_REQUEST', 'a delta beyond it: bad request')
end)

test:test('integers of 10^14 and more, as msgpack delivers them (64-bit cdata), are taken up to 2^53 - 1', function(t)
    t:plan(6)
    local function wire(v)  -- what a procedure gets from the service: the value through msgpack
        return msgpack.decode(msgpack.encode(v))
    end
    local max = 2 ^ 53 - 1
    t:is(type(wire(1e14)), 'cdata', '10^14 arrives as cdata')
    local r = sc.counter_cas(nil, 'c-wire', wire(0), wire(1e15))
    t:is_deeply({r.status, r.value}, {'OK', 1e15}, 'COUNTER_CAS value 10^15')
    t:is(sc.counter_add(nil, 'c-wire', wire(max - 1e15)).value, max, 'COUNTER_ADD delta up to the largest value')
    t:is(sc.counter_add(nil, 'c-wire', wire(-2 ^ 53)).status, 'BAD_REQUEST', 'a delta past -(2^53 - 1): refused')
    r = sc.sequence_reserve(nil, 's-wire', wire(2), wire(1e14))
    t:is_deeply({r.status, r.first, r.last}, {'OK', 1e14, 1e14 + 1}, 'SEQUENCE_RESERVE start 10^14')
    t:is(sc.counter_cas(nil, 'c-wire', wire(max), wire(2 ^ 53)).status, 'BAD_REQUEST', 'a value of 2^53: refused')
end)

test:test('counter: concurrent adds from many fibers lose nothing', function(t)
    t:plan(2)
    local done = fiber.channel(20)
    local seen = {}
    for _ = 1, 20 do
        fiber.create(function()
            for _ = 1, 50 do
                seen[sc.counter_add(nil, 'c-many', 1).value] = true
            end
            done:put(true)
        end)
    end
    for _ = 1, 20 do
        done:get()
    end
    t:is(sc.counter_get(nil, 'c-many').value, 1000, '1000 adds, 1000')
    local n = 0
    for _ in pairs(seen) do
        n = n + 1
    end
    t:is(n, 1000, 'each add saw its own value')
end)

test:test('counter: a repeat under an idempotency key is applied once', function(t)
    t:plan(3)
    local meta = {idempotency_key = 'k-counter-1'}
    t:is(sc.counter_add(meta, 'c-key', 5).value, 5, 'applied')
    local again = sc.counter_add(meta, 'c-key', 5)
    t:is_deeply({again.value, again.replayed}, {5, true}, 'the stored answer')
    t:is(sc.counter_get(nil, 'c-key').value, 5, 'once')
end)

test:test('register: compare-and-set by revision (0 = absent) and by value', function(t)
    t:plan(8)
    t:is(sc.register_get(nil, 'r1').status, 'NOT_FOUND', 'absent')
    local r = sc.register_cas(nil, 'r1', {owner = 'a', n = 1}, 0)
    t:is_deeply({r.status, r.rev}, {'OK', 1}, 'created when absent (expected_rev 0)')
    r = sc.register_cas(nil, 'r1', 'x', 0)
    t:is_deeply({r.status, r.rev, r.value and r.value.owner}, {'CONFLICT', 1, 'a'}, 'exists: CONFLICT with current')
    r = sc.register_cas(nil, 'r1', {owner = 'b'}, nil, {n = 1, owner = 'a'})
    t:is_deeply({r.status, r.rev}, {'OK', 2}, 'by value: maps compare by their keys')
    r = sc.register_cas(nil, 'r1', {owner = 'c'}, nil, {owner = 'a'})
    t:is(r.status, 'CONFLICT', 'by value: a different value')
    r = sc.register_cas(nil, 'r1', {owner = 'c'}, 2, {owner = 'b'})
    t:is_deeply({r.status, r.rev}, {'OK', 3}, 'both conditions')
    r = sc.register_cas(nil, 'r1', 42)
    t:is_deeply({r.status, r.rev}, {'OK', 4}, 'no condition: a plain write')
    r = sc.register_get(nil, 'r1')
    t:is_deeply({r.value, r.rev}, {42, 4}, 'read back')
end)

test:test('register: a TTL is set by each write', function(t)
    t:plan(3)
    local r = sc.register_cas(nil, 'r-ttl', 'v', nil, nil, 60000)
    t:ok(r.expires_in_ms > 59000, 'expires_in_ms')
    box.space.registers:update('r-ttl', {{'=', 4, util.now_ms() - 1}})
    t:is(sc.register_get(nil, 'r-ttl').status, 'NOT_FOUND', 'expired: absent')
    t:is(sc.register_cas(nil, 'r-ttl', 'w', 0).rev, 1, 'an expired register counts as absent (rev 0)')
end)

test:test('sequence: ranges follow each other, start applies to a new sequence only', function(t)
    t:plan(5)
    local a = sc.sequence_reserve(nil, 's1', 1000)
    t:is_deeply({a.status, a.first, a.last}, {'OK', 1, 1000}, 'first range from 1')
    local b = sc.sequence_reserve(nil, 's1', 10, 500)
    t:is_deeply({b.first, b.last}, {1001, 1010}, 'next range; start ignored')
    t:is(sc.sequence_get(nil, 's1').next, 1011, 'next id')
    t:is(sc.sequence_reserve(nil, 's-start', 1, 100).first, 100, 'a new sequence from start')
    t:is(sc.sequence_reserve(nil, 's1', 0).status, 'BAD_REQUEST', 'count >= 1')
end)

test:test('sequence: concurrent reservations never overlap', function(t)
    t:plan(1)
    local ids, dup = {}, 0
    local done = fiber.channel(10)
    for _ = 1, 10 do
        fiber.create(function()
            for _ = 1, 20 do
                local r = sc.sequence_reserve(nil, 's-race', 7)
                for id = r.first, r.last do
                    if ids[id] then dup = dup + 1 end
                    ids[id] = true
                end
            end
            done:put(true)
        end)
    end
    for _ = 1, 10 do
        done:get()
    end
    t:is(dup, 0, 'no id twice in 1400')
end)

test:test('sequence: a range past 2^53 - 1 is refused', function(t)
    t:plan(6)
    local r = sc.sequence_reserve(nil, 's-end', 10, 2 ^ 53 - 5)
    t:is(r.status, 'CONFLICT', 'refused')
    t:is(sc.sequence_get(nil, 's-end').status, 'NOT_FOUND', 'nothing written')
    r = sc.sequence_reserve(nil, 's-last', 1, 2 ^ 53 - 2)
    t:is_deeply({r.first, r.last}, {2 ^ 53 - 2, 2 ^ 53 - 2}, 'one id below the last')
    -- first + count - 1 = 2^53 - 1 + 2 - 1 rounds to 2^53 - 1 in a double: the check must not add first
    r = sc.sequence_reserve(nil, 's-last', 2)
    t:is_deeply({r.status, r.next}, {'CONFLICT', 2 ^ 53 - 1}, 'two ids from the last: refused, not [last, last]')
    r = sc.sequence_reserve(nil, 's-last', 1)
    t:is_deeply({r.status, r.first, r.last}, {'OK', 2 ^ 53 - 1, 2 ^ 53 - 1}, 'the last id itself')
    t:is(sc.sequence_reserve(nil, 's-last', 1).status, 'CONFLICT', 'then none')
end)

test:test('sequence: a repeat under an idempotency key returns the same range', function(t)
    t:plan(2)
    local meta = {idempotency_key = 'k-seq-1'}
    local a = sc.sequence_reserve(meta, 's-key', 100)
    local b = sc.sequence_reserve(meta, 's-key', 100)
    t:is_deeply({b.first, b.last, b.replayed}, {a.first, a.last, true}, 'same range')
    t:is(sc.sequence_reserve(nil, 's-key', 1).first, a.last + 1, 'one range taken')
end)

test:test('writes answer NOT_LEADER when this instance may not write', function(t)
    t:plan(4)
    local writable = util.set_writable(function() return false end)
    t:is(sc.counter_add(nil, 'c-ro', 1).status, 'NOT_LEADER', 'counter_add')
    t:is(sc.register_cas(nil, 'r-ro', 1).status, 'NOT_LEADER', 'register_cas')
    t:is(sc.sequence_reserve(nil, 's-ro', 1).status, 'NOT_LEADER', 'sequence_reserve')
    t:is(sc.counter_get(nil, 'c-ro').status, 'NOT_FOUND', 'reads still answer')
    util.set_writable(writable)
end)

helper.finish(test)
