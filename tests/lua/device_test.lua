#!/usr/bin/env tarantool
local tap = require('tap')
local helper = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'helper.lua')
helper.start()

local test = tap.test('device')
test:plan(3)

test:test('unknown device is NOT_FOUND', function(t)
    t:plan(1)
    t:is(sc.device_lookup(nil, 'dev-1').status, 'NOT_FOUND', 'unknown')
end)

test:test('bind is an upsert', function(t)
    t:plan(4)
    t:is(sc.device_bind(nil, 'dev-1', 'client-1').status, 'OK', 'bound')
    t:is(sc.device_lookup(nil, 'dev-1').client_id, 'client-1', 'looked up')
    t:is(sc.device_bind(nil, 'dev-1', 'client-2').status, 'OK', 'rebound')
    t:is(sc.device_lookup(nil, 'dev-1').client_id, 'client-2', 'new owner')
end)

test:test('bad arguments are BAD_REQUEST', function(t)
    t:plan(2)
    t:is(sc.device_bind(nil, nil, 'c').status, 'BAD_REQUEST', 'device id required')
    t:is(sc.device_lookup(nil, 12).status, 'BAD_REQUEST', 'device id must be a string')
end)

helper.finish(test)
