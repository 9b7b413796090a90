#!/usr/bin/env tarantool
-- smartcache.config is the one place that reads the environment, and its
-- deadline budget keeps the form a Python test parses.
-- Runnable alone: `tarantool tests/lua/config_test.lua`.
local tap = require('tap')
local fio = require('fio')

local here = fio.dirname(fio.abspath(debug.getinfo(1, 'S').source:sub(2)))
local root = fio.pathjoin(here, '..', '..', 'lua')  -- tests/lua -> lua/
package.path = root .. '/?.lua;' .. root .. '/?/init.lua;' .. package.path

local config = require('smartcache.config')

local function read(path)
    local f = assert(io.open(path, 'r'))
    local text = f:read('*a')
    f:close()
    return text
end

-- Every Lua file of the application (init.lua and smartcache/, folders included).
local function sources()
    local out = {fio.pathjoin(root, 'init.lua')}
    local dirs = {fio.pathjoin(root, 'smartcache')}
    while #dirs > 0 do
        local dir = table.remove(dirs)
        for _, p in ipairs(fio.glob(fio.pathjoin(dir, '*'))) do
            if fio.path.is_dir(p) then
                table.insert(dirs, p)
            elseif p:match('%.lua$') then
                table.insert(out, p)
            end
        end
    end
    table.sort(out)
    return out
end

local test = tap.test('config')
test:plan(3)

test:test('only config.lua reads the environment (util.lua defines the readers)', function(t)
    local readers = {}
    for _, path in ipairs(sources()) do
        local name = fio.basename(path)
        if name ~= 'config.lua' and name ~= 'util.lua' then
            local text = read(path)
            -- (the needles are split so that a grep of lua/ for them finds config.lua and util.lua only)
            if text:find('os.' .. 'getenv', 1, true) or text:find('util.' .. 'env_', 1, true) then
                table.insert(readers, path:sub(#root + 2))
            end
        end
    end
    t:plan(2)
    t:ok(#sources() > 30, 'the sources are found (' .. #sources() .. ')')
    t:is_deeply(readers, {}, 'nobody else')
end)

test:test('the deadline budget: one `M.NAME = number` a line, under its heading', function(t)
    local text = read(fio.pathjoin(root, 'smartcache', 'config.lua'))
    local heading = '-- The deadline budget, storage side (service/smartcache/server/deadlines.py holds the service side; '
        .. 'tests/unit/test_deadlines.py checks the order)'
    local at = text:find(heading, 1, true)
    t:plan(4)
    t:ok(at ~= nil, 'the heading is there, on one line')
    local found = {}
    for name, value in text:sub(at or 1):gmatch('\nM%.([A-Z][A-Z_]*) = ([%d%.]+)\n') do
        found[name] = tonumber(value)
    end
    t:is(found.ANSWER_MARGIN_S, 0.05, 'ANSWER_MARGIN_S')
    t:is(found.WAIT_MARGIN_MS, 5, 'WAIT_MARGIN_MS')
    local same = true
    for name, value in pairs(found) do
        same = same and config[name] == value
    end
    t:ok(same, 'each parsed value is the module\'s')
end)

test:test('the modules read their settings from it', function(t)
    t:plan(4)
    t:is(require('smartcache.events.log').enabled, config.events_enabled, 'events.enabled')
    t:is(require('smartcache.memory').lossy_share, config.cache_memory_share, 'memory.lossy_share')
    t:is(require('smartcache.events.partitions').retention_days, config.events_retention_days, 'retention_days')
    t:is(require('smartcache.disk').min_free_setting, config.wal_min_free_mb, 'disk.min_free_setting')
end)

os.exit(test:check() and 0 or 1)
