#!/usr/bin/env tarantool
-- Revision 12: a read answers its position in the event log (seq), the session's handle and when a
-- read would refresh it, so that a client's near cache can drop its copy at the first later event.
local tap = require('tap')
local helper = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'helper.lua')
helper.start()

local test = tap.test('nearcache')
test:plan(4)

local SID = '0a1c2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b'

local function head()
    return sc.events_read(nil, nil).head_seq
end

test:test('a session read answers the head of the log, its handle and its refresh time', function(t)
    t:plan(6)
    t:is(sc.session_create(nil, SID, 'client-n', '5.2', 600, {step = 1}).status, 'OK', 'created')
    local r = sc.session_get(nil, SID)
    t:is(r.seq, head(), 'seq is the head after the create')
    local ev = sc.events_read(nil, r.seq - 1, {'session.'}, 10, 0).events
    t:is(r.handle, ev[#ev].key, 'handle is the key of the session\'s events')
    t:ok(r.refresh_in_ms > 0 and r.refresh_in_ms <= 60000, 'refresh in at most a tenth of the ttl')
    t:is(sc.session_update(nil, SID, {step = 2}).status, 'OK', 'updated')
    local after = sc.events_read(nil, r.seq, {'session.'}, 10, 0).events
    t:ok(#after == 1 and after[1].seq > r.seq and after[1].key == r.handle, 'the update comes after the position')
end)

test:test('a touch answers its refresh time', function(t)
    t:plan(1)
    local r = sc.session_touch(nil, SID)
    t:ok(r.refresh_in_ms ~= nil and r.refresh_in_ms >= 0, 'refresh_in_ms')
end)

test:test('a device lookup answers its position', function(t)
    t:plan(2)
    t:is(sc.device_bind(nil, 'dev-n', 'client-n').status, 'OK', 'bound')
    t:is(sc.device_lookup(nil, 'dev-n').seq, head(), 'seq is the head')
end)

test:test('with events off a read answers no position', function(t)
    t:plan(2)
    local log = require('smartcache.events.log')
    log.enabled = false
    local r = sc.session_get(nil, SID)
    log.enabled = true
    t:is(r.status, 'OK', 'read')
    t:is(r.seq, nil, 'no seq')
end)

helper.finish(test)
