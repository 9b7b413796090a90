#!/usr/bin/env tarantool
-- The Tarantool version workarounds (smartcache.compat): the version is read
-- right, and each flag is on exactly for the versions that need it.
-- Runnable alone: `tarantool tests/lua/compat_test.lua`.
local tap = require('tap')
local fio = require('fio')

local here = fio.dirname(fio.abspath(debug.getinfo(1, 'S').source:sub(2)))
local lua_root = fio.pathjoin(here, '..', '..', 'lua')  -- tests/lua -> lua/
package.path = lua_root .. '/?.lua;' .. lua_root .. '/?/init.lua;' .. package.path

local compat = require('smartcache.compat')
local TARANTOOL = rawget(_G, '_TARANTOOL')  -- Tarantool's own global

local test = tap.test('compat')
test:plan(6)

test:test('versions parse as Tarantool writes them', function(t)
    t:plan(5)
    t:is_deeply(compat.parse('2.6.0-0-g47aa4e01e'), {2, 6, 0}, "Debian's 2.6.0")
    t:is_deeply(compat.parse('2.11.1'), {2, 11, 1}, 'two-digit minor')
    t:is_deeply(compat.parse('3.2.0-entrypoint-12-gabcdef'), {3, 2, 0}, 'a development build')
    t:is(compat.parse('garbage'), nil, 'what does not parse is nil')
    t:is(compat.parse(nil), nil, 'nil too')
end)

test:test('a fix counts from its release in its series, and in every later series', function(t)
    t:plan(7)
    local fixed = {{2, 6, 2}, {2, 7, 1}}
    t:is(compat.has_fix({2, 6, 0}, fixed), false, '2.6.0: not yet')
    t:is(compat.has_fix({2, 6, 2}, fixed), true, '2.6.2: the fix')
    t:is(compat.has_fix({2, 7, 0}, fixed), false, '2.7.0: a series whose fix came in 2.7.1')
    t:is(compat.has_fix({2, 7, 1}, fixed), true, '2.7.1')
    t:is(compat.has_fix({2, 10, 0}, fixed), true, 'every later series')
    t:is(compat.has_fix({2, 5, 9}, fixed), false, 'an earlier series')
    t:is(compat.has_fix({9, 9, 9}, nil), false, 'no known fix: never')
end)

test:test('this Tarantool: the flags follow its version', function(t)
    t:plan(3)
    t:is(compat.VERSION, TARANTOOL, 'the running version')
    local flags = compat.flags_for(TARANTOOL)
    local same = true
    for _, w in ipairs(compat.WORKAROUNDS) do
        same = same and compat[w.name] == flags[w.name]
    end
    t:ok(same, 'every flag of the module is the one for this version')
    local listed, on = 0, 0
    for _, name in ipairs(compat.active()) do
        listed = listed + (flags[name] and 1 or 0)
    end
    for _, w in ipairs(compat.WORKAROUNDS) do
        on = on + (flags[w.name] and 1 or 0)
    end
    t:ok(listed == on and #compat.active() == on, 'active() lists the flags that are on, and only those')
end)

test:test("Debian's 2.6.0 needs every workaround", function(t)
    t:plan(#compat.WORKAROUNDS)
    local flags = compat.flags_for('2.6.0-0-g47aa4e01e')
    for _, w in ipairs(compat.WORKAROUNDS) do
        t:is(flags[w.name], true, w.name)
    end
end)

test:test('a newer Tarantool drops only the workarounds whose fix it has', function(t)
    t:plan(8)
    local f262 = compat.flags_for('2.6.2-0-gabc')
    t:is(f262.CLEAR_SYNCHRO_QUEUE_WAITS, false, '2.6.2: clear_synchro_queue changed (tarantool#5435)')
    t:is(f262.SYNC_SNAPSHOT_UNRECOVERABLE, false, '2.6.2: snapshots with synchronous rows recover (#5298)')
    t:is(f262.NO_SPACE_ALTER, false, '2.6.2: space:alter exists')
    t:is(f262.NO_BOX_INFO_SYNCHRO, true, '2.6.2: still no box.info.synchro')
    local f211 = compat.flags_for('2.11.1')
    t:is(f211.NO_BOX_INFO_SYNCHRO, false, '2.11: box.info.synchro')
    t:is(f211.JOIN_FAILS_ON_SYNCHRO_ROWS, true, 'no release known to fix a join under synchronous load')
    t:is(f211.ASYNC_BEHIND_SYNC_ROLLS_BACK, true, 'no fix verified: stays on')
    t:is(compat.flags_for('not a version').NO_SPACE_ALTER, true, 'an unknown version needs them all')
end)

test:test('every workaround says why, where, and what test fails without it', function(t)
    t:plan(2)
    local names, complete = {}, true
    for _, w in ipairs(compat.WORKAROUNDS) do
        complete = complete and type(w.why) == 'string' and type(w.where) == 'string' and type(w.test) == 'string'
        names[w.name] = (names[w.name] or 0) + 1
    end
    t:ok(complete, 'why, where and test for each')
    local unique = true
    for _, n in pairs(names) do
        unique = unique and n == 1
    end
    t:ok(unique, 'each name once')
end)

os.exit(test:check() and 0 or 1)
