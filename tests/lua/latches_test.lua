#!/usr/bin/env tarantool
-- Count-down latches (smartcache.coordination.latches), including a wake-up by a replicated change.
local tap = require('tap')
local fiber = require('fiber')
local fio = require('fio')
local clock = require('clock')
local popen = require('popen')
local socket = require('socket')
local helper = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'helper.lua')
-- lua/, for the replica's package.path (before helper.start(): box.cfg changes the working directory)
local LUA_ROOT = fio.pathjoin(fio.dirname(fio.abspath(debug.getinfo(1, 'S').source:sub(2))), '..', '..', 'lua')
helper.start()
local util = require('smartcache.util')
local expiry = require('smartcache.expiry')
local latches = require('smartcache.coordination.latches')

local test = tap.test('latches')
test:plan(7)

local function await_async(name, wait_ms)
    local ch = fiber.channel(1)
    fiber.create(function()
        local started = clock.monotonic()
        local r = sc.latch_await(nil, name, wait_ms)
        ch:put({r, clock.monotonic() - started})
    end)
    return ch
end

local function wait_waiters(name, n)
    local deadline = clock.monotonic() + 5
    while latches.waiters:count(name) < n and clock.monotonic() < deadline do
        fiber.sleep(0.001)
    end
    return latches.waiters:count(name) == n
end

test:test('create, count down to zero, never below', function(t)
    t:plan(6)
    local r = sc.latch_create(nil, 'l1', 2, 60000)
    t:is_deeply({r.status, r.count}, {'OK', 2}, 'created')
    r = sc.latch_create(nil, 'l1', 5, 60000)
    t:is_deeply({r.status, r.count}, {'ALREADY_EXISTS', 2}, 'a live latch is not created again')
    t:is(sc.latch_count_down(nil, 'l1').count, 1, '2 -> 1')
    t:is(sc.latch_count_down(nil, 'l1', 5).count, 0, 'never below 0')
    t:is(sc.latch_count_down(nil, 'l1').count, 0, 'stays 0')
    r = sc.latch_get(nil, 'l1')
    t:is_deeply({r.count, r.initial}, {0, 2}, 'get')
end)

test:test('every awaiter wakes when the count reaches zero, not before', function(t)
    t:plan(4)
    sc.latch_create(nil, 'l-wake', 2, 60000)
    local chs = {}
    for i = 1, 3 do
        chs[i] = await_async('l-wake', 10000)
    end
    t:ok(wait_waiters('l-wake', 3), 'three awaiters')
    sc.latch_count_down(nil, 'l-wake')
    fiber.sleep(0.05)
    t:is(latches.waiters:count('l-wake'), 3, 'still waiting at 1')
    local opened = clock.monotonic()
    sc.latch_count_down(nil, 'l-wake')
    local statuses = {}
    for i = 1, 3 do
        table.insert(statuses, chs[i]:get(5)[1].status)
    end
    t:is_deeply(statuses, {'OK', 'OK', 'OK'}, 'all OK')
    -- Far below the 10 s wait: they are pushed, not polling.
    t:ok(clock.monotonic() - opened < 0.2, 'at once')
end)

test:test('await: an open latch answers at once; TIMEOUT with the count; NOT_FOUND', function(t)
    t:plan(5)
    sc.latch_create(nil, 'l-open', 1, 60000)
    sc.latch_count_down(nil, 'l-open')
    t:is(sc.latch_await(nil, 'l-open', 0).status, 'OK', 'open')
    sc.latch_create(nil, 'l-shut', 3, 60000)
    local got = await_async('l-shut', 150):get(5)
    t:is_deeply({got[1].status, got[1].count}, {'TIMEOUT', 3}, 'TIMEOUT with the count')
    t:ok(got[2] >= 0.14, 'after wait_ms')
    t:is(sc.latch_await(nil, 'l-none', 100).status, 'NOT_FOUND', 'no such latch')
    t:is(sc.latch_count_down(nil, 'l-none').status, 'NOT_FOUND', 'count down of none')
end)

test:test('an expired latch is gone: its awaiters get NOT_FOUND; a new one may be created', function(t)
    t:plan(3)
    sc.latch_create(nil, 'l-exp', 1, 60000)
    local ch = await_async('l-exp', 10000)
    wait_waiters('l-exp', 1)
    box.space.latches:update('l-exp', {{'=', 5, util.now_ms() - 1}})
    expiry.sweep_once('latches')
    t:is(ch:get(5)[1].status, 'NOT_FOUND', 'awaiter told')
    t:is(sc.latch_create(nil, 'l-exp', 2, 60000).status, 'OK', 'created again')
    t:is(sc.latch_create(nil, 'l-exp2', 2, 0).status, 'BAD_REQUEST', 'ttl_ms >= 1')
end)

test:test('a count-down repeated under an idempotency key is applied once', function(t)
    t:plan(2)
    sc.latch_create(nil, 'l-key', 3, 60000)
    local meta = {idempotency_key = 'k-latch-1'}
    t:is(sc.latch_count_down(meta, 'l-key').count, 2, 'applied')
    sc.latch_count_down(meta, 'l-key')
    t:is(sc.latch_get(nil, 'l-key').count, 2, 'once')
end)

test:test('the wait ends before the call deadline', function(t)
    t:plan(1)
    sc.latch_create(nil, 'l-deadline', 1, 60000)
    local started = clock.monotonic()
    sc.latch_await(util.now_ms() + 100, 'l-deadline', 10000)
    t:ok(clock.monotonic() - started < 0.1, 'gave up before the deadline')
end)

-- A read-only replica of this instance in a child process awaits a latch; the
-- count-down made here reaches it by replication and its trigger wakes it.
local REPLICA = [[
package.path = %q .. '/?.lua;' .. package.path
box.cfg({work_dir = %q, replication = {%q}, read_only = true, log_level = 2})
while box.space.latches == nil or box.space.latches:get('l-repl') == nil do
    require('fiber').sleep(0.01)
end
require('smartcache.api')
require('smartcache.runtime').start()
local latches = require('smartcache.coordination.latches')
local fiber = require('fiber')
local ch = fiber.channel(1)
fiber.create(function()
    local started = fiber.clock()
    local r = _G.sc.latch_await(nil, 'l-repl', 20000)
    ch:put(string.format('%%s %%d %%.0f', r.status, r.count or -1, (fiber.clock() - started) * 1000))
end)
while latches.waiters:count('l-repl') == 0 do
    fiber.sleep(0.001)
end
io.stdout:write('waiting\n')
io.stdout:flush()
io.stdout:write(ch:get() .. '\n')
io.stdout:flush()
box.cfg({replication = {}})  -- leave the master quietly
os.exit(0)
]]

test:test('an awaiter on a replica wakes when the count-down arrives by replication', function(t)
    t:plan(3)
    local s = socket('AF_INET', 'SOCK_STREAM', 'tcp')
    s:bind('127.0.0.1', 0)
    local port = s:name().port
    s:close()
    box.cfg({listen = '127.0.0.1:' .. port})
    box.schema.user.grant('guest', 'replication', nil, nil, {if_not_exists = true})
    sc.latch_create(nil, 'l-repl', 1, 60000)
    local dir = fio.pathjoin(helper.dir, 'replica')
    fio.mkdir(dir)
    local script = fio.pathjoin(helper.dir, 'replica.lua')
    local f = fio.open(script, {'O_CREAT', 'O_WRONLY'}, tonumber('644', 8))
    f:write(string.format(REPLICA, LUA_ROOT, dir, '127.0.0.1:' .. port))
    f:close()
    local ph = popen.new({arg[-1], script}, {stdout = popen.opts.PIPE, stderr = popen.opts.INHERIT})
    local out = ''
    -- Read until `pattern` shows, the child's output ends, or 30 s pass.
    local deadline = clock.monotonic() + 30
    local function read_until(pattern)
        while not out:find(pattern) and clock.monotonic() < deadline do
            local chunk = ph:read({timeout = 1})
            if chunk == '' then  -- end of output: the child exited
                return
            end
            out = out .. (chunk or '')
        end
    end
    read_until('waiting\n')
    t:ok(out:find('waiting\n') ~= nil, 'the replica awaits the latch')
    sc.latch_count_down(nil, 'l-repl')
    read_until('waiting\n.+\n')
    local status, count, ms = out:match('waiting\n(%u+) (%-?%d+) (%d+)\n')
    t:is_deeply({status, count}, {'OK', '0'}, 'woken: the latch is open there too')
    t:ok(ms ~= nil and tonumber(ms) < 20000, 'by the change, not at the end of its 20 s wait')
    ph:wait({timeout = 10})
    ph:close()
end)

helper.finish(test)
