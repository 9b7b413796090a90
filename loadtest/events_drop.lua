#!/usr/bin/env tarantool
-- python -m loadtest events, number 4: dropping a day partition of N events
-- (default 1,000,000) on a standalone instance. Prints one JSON line:
--   drop_ms             the drop itself (events/partitions.lua's drop: floor row + space drop, one transaction)
--   maintain_ms         the whole maintenance round that found it past retention
--   loop_stall_max_ms   longest time a fiber waiting for the next loop turn waited, from just before the
--                       round to 2 s after it (memtx frees the tuples in the background meanwhile)
--   write_max_ms        slowest of the session_create calls a writer fiber made meanwhile (one per ms)
--   write_during_ms     the writer's slowest call overlapping the drop
-- Usage: tarantool loadtest/events_drop.lua [events] (from the repository's root).
local fio = require('fio')
local fiber = require('fiber')
local clock = require('clock')
local json = require('json')

local here = fio.dirname(fio.abspath(debug.getinfo(1, 'S').source:sub(2)))
local lua_root = fio.pathjoin(fio.dirname(here), 'lua')
package.path = lua_root .. '/?.lua;' .. lua_root .. '/?/init.lua;' .. package.path

local n = tonumber(arg[1]) or 1000000
local dir = fio.tempdir()
box.cfg({listen = '127.0.0.1:0', memtx_dir = dir, wal_dir = dir, work_dir = dir, log_level = 2, wal_mode = 'write',
         memtx_memory = 1024 * 1024 * 1024})
require('smartcache.schema').upgrade()
require('smartcache.api').register(nil)
require('smartcache.runtime').start()
local partitions = require('smartcache.events.partitions')
local events = require('smartcache.events')
local util = require('smartcache.util')
local DAY_MS = partitions.DAY_MS

-- N events into a day three days ago, in transactions of 1,000 like a busy leader's.
local real_clock = partitions.clock
local old = real_clock() - 3 * DAY_MS
partitions.clock = function() return old end
local filled_at = clock.monotonic()
local payload = {client_id = 'client-0000001'}
for i = 1, n, 1000 do
    box.atomic(function()
        for j = i, math.min(i + 999, n) do
            events.write('session.created', string.format('%08d-0000-4000-8000-000000000000', j), payload)
        end
    end)
end
local fill_s = clock.monotonic() - filled_at
partitions.clock = real_clock
box.atomic(function() events.write('session.created', 'today', payload) end)  -- the head moves to today
local old_name = partitions.PREFIX .. partitions.day_of(old)
local arena_before = box.slab.info().arena_used

-- Watchers over a window of WINDOW_S: the event loop's longest stall, and a writer's slowest request.
-- The same window without a drop first: on a shared machine the loop stalls for a few ms anyway.
local WINDOW_S = 2.5
local function window(action)
    local running = true
    local stall_max, write_max, during = 0, 0, 0
    local t0, t1
    local done = fiber.channel(2)
    fiber.create(function()
        local last = clock.monotonic()
        while running do
            fiber.sleep(0)
            local now = clock.monotonic()
            stall_max = math.max(stall_max, now - last)
            last = now
        end
        done:put(true)
    end)
    fiber.create(function()
        while running do
            local w0 = clock.monotonic()
            -- a stored id, as the service gives one (revision 11; no id would make a raw-keyed row)
            _G.sc.session_create(nil, util.uuid(), 'client-drop', nil, 600, nil)
            local w1 = clock.monotonic()
            write_max = math.max(write_max, w1 - w0)
            if t0 ~= nil and w1 >= t0 and (t1 == nil or w0 <= t1) then
                during = math.max(during, w1 - w0)
            end
            fiber.sleep(0.001)
        end
        done:put(true)
    end)
    fiber.sleep(0.3)
    t0 = clock.monotonic()
    action()
    t1 = clock.monotonic()
    fiber.sleep(WINDOW_S - 0.3)
    running = false
    done:get(1)
    done:get(1)
    return {loop_stall_max_ms = stall_max * 1000, write_max_ms = write_max * 1000, write_during_ms = during * 1000,
            action_ms = (t1 - t0) * 1000}
end

local control = window(function() end)
local drop = window(partitions.maintain)
print(json.encode({
    events = n, fill_s = fill_s, dropped = box.space[old_name] == nil,
    drop_ms = partitions.last_drop and partitions.last_drop.ms, maintain_ms = drop.action_ms,
    with_drop = drop, without_drop = control,
    arena_before_mib = arena_before / 2 ^ 20, arena_after_mib = box.slab.info().arena_used / 2 ^ 20,
}))
fio.rmtree(dir)
os.exit(0)
