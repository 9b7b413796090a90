#!/usr/bin/env tarantool
local tap = require('tap')
local fiber = require('fiber')
local helper = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'helper.lua')
helper.start()
local F = require('smartcache.schema').F.cache
local expiry = require('smartcache.expiry')

local test = tap.test('cache')
test:plan(6)

local SID = 'dddddddd-0000-4000-8000-000000000001'
sc.session_create(nil, SID, 'client-1', nil, 60, nil)

test:test('put then get, global and per session', function(t)
    t:plan(6)
    t:is(sc.cache_put(nil, '', 'rates', 7, 60, {usd = 1}).status, 'OK', 'global put')
    local r = sc.cache_get(nil, '', 'rates')
    t:is(r.status, 'OK', 'global get')
    t:is(r.data.usd, 1, 'data')
    t:is(r.data_type, 7, 'data type')
    t:is(sc.cache_put(nil, SID, 'rates', 1, 60, 'mine').status, 'OK', 'session put, same key')
    t:is(sc.cache_get(nil, SID, 'rates').data, 'mine', 'namespaces are separate')
end)

test:test('put into a session that is not live is NOT_FOUND', function(t)
    t:plan(2)
    t:is(sc.cache_put(nil, 'eeeeeeee-0000-4000-8000-000000000001', 'k', 1, 60, 'v').status, 'NOT_FOUND', 'refused')
    t:is(box.space.cache:count(), 2, 'nothing stored')
end)

test:test('an expired entry is absent before the sweeper runs', function(t)
    t:plan(3)
    expiry.set_paused(true)
    sc.cache_put(nil, '', 'short', 0, 60, 'v')
    box.space.cache:update({'', 'short'}, {{'=', F.expires_at, 1}})
    t:ok(box.space.cache:get({'', 'short'}) ~= nil, 'still stored')
    t:is(sc.cache_get(nil, '', 'short').status, 'NOT_FOUND', 'get says NOT_FOUND')
    t:is(sc.cache_delete(nil, '', 'short').status, 'NOT_FOUND', 'delete says NOT_FOUND')
    expiry.set_paused(false)
end)

test:test('delete, and a deleted session takes its entries along', function(t)
    t:plan(4)
    sc.cache_put(nil, '', 'to-delete', 0, 60, 1)
    t:is(sc.cache_delete(nil, '', 'to-delete').status, 'OK', 'deleted')
    t:is(sc.cache_get(nil, '', 'to-delete').status, 'NOT_FOUND', 'gone')
    local sid = helper.session()
    sc.cache_put(nil, sid, 'one', 1, 60, 'x')
    sc.cache_put(nil, sid, 'other', 1, 60, 'x')
    local r = sc.session_delete(nil, sid)
    t:is(r.cache_deleted, 2, 'both session entries deleted')
    t:is(box.space.cache.index.primary:count({sid}), 0, 'none left')
end)

test:test('bad arguments are BAD_REQUEST', function(t)
    t:plan(3)
    t:is(sc.cache_put(nil, '', 5, 0, 60, 'v').status, 'BAD_REQUEST', 'key must be a string')
    t:is(sc.cache_put(nil, '', 'k', 'x', 60, 'v').status, 'BAD_REQUEST', 'data type must be a number')
    t:is(sc.cache_put(nil, '', 'k', 0, 0, 'v').status, 'BAD_REQUEST', 'ttl must be positive')
end)

test:test('the sweeper removes expired entries', function(t)
    t:plan(1)
    sc.cache_put(nil, '', 'gone', 0, 60, 'v')
    box.space.cache:update({'', 'gone'}, {{'=', F.expires_at, 1}})
    local deadline = fiber.clock() + 5
    while box.space.cache:get({'', 'gone'}) ~= nil and fiber.clock() < deadline do
        fiber.sleep(0.05)
    end
    t:is(box.space.cache:get({'', 'gone'}), nil, 'swept')
end)

helper.finish(test)
