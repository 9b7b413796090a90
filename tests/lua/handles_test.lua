#!/usr/bin/env tarantool
-- Handles (smartcache.sessions.handles): "h" + base32 of a stored id, rendered and parsed as the
-- service does (proto/vectors/sessions.json, PROTOCOL.md section 4); anything else refused, saying why.
-- Runnable alone: `tarantool tests/lua/handles_test.lua`.
local tap = require('tap')
local fio = require('fio')
local json = require('json')

local here = fio.dirname(fio.abspath(debug.getinfo(1, 'S').source:sub(2)))
package.path = fio.pathjoin(here, '..', '..', 'lua') .. '/?.lua;' .. package.path  -- tests/lua -> lua/
local handles = require('smartcache.sessions.handles')

local function vectors()
    local f = assert(io.open(fio.pathjoin(here, '..', '..', 'proto', 'vectors', 'sessions.json')))
    local doc = json.decode(f:read('*a'))
    f:close()
    return doc
end
local V = vectors()

local test = tap.test('handles')
test:plan(6)

test:test('every vector\'s stored id renders as its handle, and the handle parses back to it', function(t)
    t:plan(2 * #V.sessions + 1)
    t:ok(#V.sessions >= 6, 'versions 4 and 8 (bucket 0 and 65535 too) under two keys')
    for _, s in ipairs(V.sessions) do
        t:is(handles.handle(s.stored), s.handle, s.name .. ': rendered')
        t:is(handles.parse(s.handle), s.stored, s.name .. ': parsed back')
    end
end)

test:test('what the vectors say a parser refuses is refused, with the reason', function(t)
    t:plan(2 * #V.not_handles)
    for _, bad in ipairs(V.not_handles) do
        local id, why = handles.parse(bad.value)
        t:is(id, nil, bad.why .. ': refused')
        t:ok(type(why) == 'string' and #why > 0, bad.why .. ': ' .. tostring(why))
    end
end)

test:test('the precise reasons', function(t)
    t:plan(5)
    local _, why = handles.parse(42)
    t:is(why, 'handle must be a string', 'not a string')
    _, why = handles.parse('6f1c2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b')
    t:like(why, 'must be 27 characters', 'a session id: the length and the form')
    _, why = handles.parse('hr7ybpzkmxveujf7v5bz7pdorj1')
    t:like(why, 'character 27 is not base32', 'which character')
    _, why = handles.parse('hr7ybpzkmxveujf7v5bz7pdorj5')
    t:like(why, 'not canonical', 'a spare bit set')
    _, why = handles.parse('Hr7ybpzkmxveujf7v5bz7pdorj4')
    t:like(why, 'must be 27 characters: "h"', 'the prefix is a lowercase h')
end)

test:test('every 16 bytes round-trip; only canonical UUID text has a handle', function(t)
    t:plan(4)
    local util = require('smartcache.util')
    local bad = 0
    for _ = 1, 2000 do
        local id = util.uuid()
        local h = handles.handle(id)
        if #h ~= handles.LENGTH or handles.parse(h) ~= id or not h:match('^h[a-z2-7]+$') then
            bad = bad + 1
        end
    end
    t:is(bad, 0, '2000 random ids: 27 characters of the alphabet, parsed back to the id')
    t:is(handles.handle('not a uuid'), nil, 'no handle for what is not UUID text')
    t:ok(handles.is_uuid('8ff017e5-4cbd-4944-97f5-e873f78dd14f'), 'lowercase UUID text is a stored id')
    t:ok(not handles.is_uuid('8FF017E5-4CBD-4944-97F5-E873F78DD14F'), 'upper case is not (one handle per id)')
end)

test:test('a raw-keyed row of before is named by a digest of its id, which no parser takes', function(t)
    t:plan(4)
    local raw = V.sessions[1].raw_uuid
    local name = handles.name(raw, nil)
    t:is(#name, handles.LENGTH, '27 characters')
    t:is(name:sub(1, 1), 'r', 'beginning with r')
    t:isnt(name:sub(2), handles.handle(raw):sub(2), 'not the id in base32 (that is the credential)')
    t:is(handles.parse(name), nil, 'not a handle')
end)

test:test('the routing bits a stored id keeps of its raw id are what storage routes by', function(t)
    -- sc.session_rekey refuses a pair whose version, variant or bucket differ: the vectors' pairs pass.
    local sharding = require('smartcache.sharding')
    t:plan(#V.sessions)
    for _, s in ipairs(V.sessions) do
        t:ok(s.raw_uuid:sub(15, 15) == s.stored:sub(15, 15) and sharding.of_session(s.raw_uuid) ==
             sharding.of_session(s.stored) and (s.bucket == nil or s.bucket == json.NULL or
             sharding.of_session(s.stored) == s.bucket), s.name)
    end
end)

os.exit(test:check() and 0 or 1)
