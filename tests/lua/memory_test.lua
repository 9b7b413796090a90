#!/usr/bin/env tarantool
-- smartcache.memory: the cache and prewarm spaces hold at most SC_CACHE_MEMORY_SHARE
-- of memtx_memory; a write past it is refused with ER_MEMORY_ISSUE and leaves
-- nothing; other writes go on; /health says so and recovers once entries go.
-- Runnable alone: `tarantool tests/lua/memory_test.lua`.
local tap = require('tap')
local fio = require('fio')

local here = fio.dirname(fio.abspath(debug.getinfo(1, 'S').source:sub(2)))
package.path = fio.pathjoin(here, '..', '..', 'lua') .. '/?.lua;' .. package.path  -- tests/lua -> lua/
local helper = dofile(fio.pathjoin(here, 'helper.lua'))
local memory = require('smartcache.memory')
local runtime = require('smartcache.runtime')

helper.start()

local test = tap.test('memory')
test:plan(5)

local VALUE = string.rep('x', 256 * 1024)

test:test('cache puts are refused past the budget, with nothing written', function(t)
    t:plan(7)
    memory.lossy_share = 0.05  -- 3.2 MiB of 64: a dozen 256 KiB values
    local n, err = 0, nil
    for i = 1, 100 do
        local ok, e = pcall(_G.sc.cache_put, nil, '', 'big-' .. i, nil, 60, VALUE)
        if not ok then
            err = e
            break
        end
        n = n + 1
    end
    t:ok(n > 5 and n < 20, string.format('%d values stored before the refusal', n))
    t:ok(err ~= nil and err.code == box.error.MEMORY_ISSUE, 'refused with ER_MEMORY_ISSUE')
    t:like(tostring(err), 'SC_CACHE_MEMORY_SHARE', 'naming the budget')
    t:is(box.space.cache:get({'', 'big-' .. (n + 1)}), nil, 'the refused value is not there')
    t:ok(memory.lossy_bytes() <= memory.lossy_budget(), 'within the budget')
    local sid = helper.session('client-mem')
    t:ok(sid ~= nil, 'sessions are still written')
    t:is(memory.counters.refused, 1, 'counted')
end)

test:test('/health says memtx full, and the metric shows the budget used', function(t)
    t:plan(3)
    local doc = runtime.health()
    t:is(doc.healthy, false, 'unhealthy')
    t:like(table.concat(doc.problems, '; '), 'memtx full', 'memtx full')
    t:ok(doc.memtx.lossy_used_ratio > 0.9, 'cache budget used ' .. doc.memtx.lossy_used_ratio)
end)

test:test('once entries go, puts fit again and health recovers', function(t)
    t:plan(3)
    for _, tu in box.space.cache:pairs() do
        box.space.cache:delete({tu[1], tu[2]})
    end
    local r = _G.sc.cache_put(nil, '', 'after', nil, 60, VALUE)
    t:is(r.status, 'OK', 'a put fits again')
    memory.last_at = memory.last_at - memory.ERROR_WINDOW_S - 1  -- the window passed
    local doc = runtime.health()
    t:is(doc.healthy, true, 'healthy: ' .. table.concat(doc.problems, '; '))
    t:ok(doc.memtx.quota_used_ratio > 0, 'quota_used_ratio reported')
end)

test:test('prewarm data counts against the same budget', function(t)
    t:plan(2)
    memory.lossy_share = 0.001
    local a = _G.sc.prewarm_acquire(nil, 'client-p', 1, 'owner', 1000, 0)
    t:is(a.status, 'ACQUIRED', 'acquired')
    local ok, err = pcall(_G.sc.prewarm_complete, nil, 'client-p', 1, 'owner', VALUE)
    t:ok(not ok and err.code == box.error.MEMORY_ISSUE, 'complete refused: ' .. tostring(err))
end)

test:test('tuples only Lua still holds are freed within a second or so', function(t)
    t:plan(2)
    memory.lossy_share = 0.4
    local fiber = require('fiber')
    local kept = {}
    for i = 1, 40 do
        box.space.cache:replace({'', 'pin-' .. i, 0, 0, 1, 1, VALUE})
    end
    for i = 1, 40 do
        table.insert(kept, box.space.cache:delete({'', 'pin-' .. i}))  -- the deleted tuples, held by Lua
    end
    kept = nil  -- luacheck: ignore (unreferenced now, but not collected until Lua's GC runs)
    local before = box.slab.info().items_used
    local deadline = fiber.clock() + 3
    while box.slab.info().items_used > before - 8 * 1024 * 1024 and fiber.clock() < deadline do
        fiber.sleep(0.1)
    end
    local freed = before - box.slab.info().items_used
    t:ok(freed > 8 * 1024 * 1024, string.format('%.1f MiB freed', freed / 1048576))
    t:ok(memory.reclaims > 0, 'by the reclaim fiber')
end)

helper.finish(test)
