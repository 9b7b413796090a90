#!/usr/bin/env tarantool
-- The operator HTTP's session routes (smartcache.http) answer for the buckets this
-- shard serves only: a session of a bucket that is not active here (a copy moving in,
-- a bucket moving out or sent, its garbage, a given-up copy, rows of a bucket not held)
-- is 421 on /sessions/<handle> and listed apart, as a copy with its bucket's state, on
-- /clients/<id>/sessions. A cluster that is not sharded answers as it always did.
-- Runnable alone: `tarantool tests/lua/http_test.lua`.
local tap = require('tap')
local json = require('json')
local helper = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'helper.lua')
helper.start()
local http = require('smartcache.http')
local buckets = require('smartcache.sharding.buckets')
local client = require('http.client').new()
local F = require('smartcache.schema').F.sessions

local server = http.start('127.0.0.1', 0)
local base = string.format('http://127.0.0.1:%d', server:name().port)

local function get(path)
    local r = client:get(base .. path, {timeout = 5})
    local ok, doc = pcall(json.decode, r.body or '')
    return r.status, ok and doc or r.body
end

local test = tap.test('http')
test:plan(6)

local COUNT = 16
local HERE = 'client-here'   -- its bucket stays active on this shard
local MOVED = 'client-moved' -- its bucket goes through the states of a move
local B_HERE, B_MOVED = buckets.of(HERE, COUNT), buckets.of(MOVED, COUNT)
assert(B_HERE ~= B_MOVED, 'the two clients need buckets of their own')

local function set_state(bucket, state, peer)
    if state == nil then
        box.space.sc_buckets:delete(bucket)
    else
        box.space.sc_buckets:replace({bucket, state, 2, peer, os.time() * 1000})
    end
end

-- Writes the shard itself would not make (its fence refuses a row of a bucket not active
-- here, and gives a row written without its bucket the bucket): the stamping trigger is off
-- meanwhile. The expiry fiber leaves such rows alone (buckets.serves_row).
local function unfenced(fn)
    local stamp = buckets.installed.sessions
    box.space.sessions:before_replace(nil, stamp)
    local ok, err = pcall(fn)
    box.space.sessions:before_replace(stamp)
    assert(ok, err)
end

local function keys(doc)
    local out = {}
    for k in pairs(doc) do
        table.insert(out, k)
    end
    table.sort(out)
    return out
end

test:test('not sharded: the session and the client\'s list, as before (no copies)', function(t)
    t:plan(7)
    local sid = helper.session('client-plain', {k = 'v'})
    local status, doc = get('/sessions/' .. helper.handle(sid))
    t:is(status, 200, '/sessions/<handle> answers 200')
    t:is_deeply({doc.client_id, doc.data, doc.handle}, {'client-plain', {k = 'v'}, helper.handle(sid)},
        'with the session, named by its handle')
    t:is(doc.bucket_state, nil, 'and no bucket state')
    status, doc = get('/clients/client-plain/sessions')
    t:is(status, 200, '/clients/<id>/sessions answers 200')
    t:is_deeply(keys(doc), {'client_id', 'sessions'}, 'with client_id and sessions only')
    t:is(#doc.sessions == 1 and doc.sessions[1].handle, helper.handle(sid), 'listing the session by its handle')
    t:is(doc.sessions[1].session_id, nil, 'never by its id')
end)

test:test('a session id is no handle: /sessions/<id> is refused, and no page shows one', function(t)
    t:plan(6)
    local sid = helper.session('client-ids', {k = 'v'})
    local status, doc = get('/sessions/' .. sid)
    t:is_deeply({status, doc.error}, {400, 'BAD_REQUEST'}, 'a session id is refused (400)')
    t:like(doc.message, 'handle must be 27 characters', 'saying what a handle is')
    status = get('/sessions/' .. helper.handle(sid):sub(1, 26) .. '1')
    t:is(status, 400, 'a character outside base32 is refused')
    status = get('/sessions/' .. helper.handle(require('smartcache.util').uuid()))
    t:is(status, 404, 'the handle of no session: 404')
    -- A raw-keyed row of before revision 11 has no handle: its id's base32 would be the credential.
    local raw = require('smartcache.util').uuid()
    box.space.sessions:replace(box.space.sessions:get(sid):update({{'=', F.id, raw}, {'=', F.stored, box.NULL}}))
    t:is(get('/sessions/' .. helper.handle(raw)), 404, 'a raw-keyed row is not found by its id\'s base32')
    local _, list = get('/clients/client-ids/sessions')
    local names = {}
    for _, v in ipairs(list.sessions) do
        table.insert(names, v.handle:sub(1, 1))
    end
    table.sort(names)
    t:is_deeply(names, {'h', 'r'}, 'the raw-keyed row is listed under a digest name ("r..."), not a handle')
end)

-- Sharded: every bucket active here, then the sessions of both clients.
box.space.sc_meta:replace({'bucket_count', COUNT})
for b = 0, COUNT - 1 do
    box.space.sc_buckets:insert({b, 'active', 1, box.NULL, os.time() * 1000})
end
buckets.install()
local here_sid = helper.session(HERE, {who = 'here'})
local moved_sid = helper.session(MOVED, {who = 'moved'})

test:test('sharded, the bucket active here: served as before, no copies', function(t)
    t:plan(5)
    local status, doc = get('/sessions/' .. helper.handle(moved_sid))
    t:is(status, 200, '/sessions/<handle> answers 200')
    t:is_deeply(doc.data, {who = 'moved'}, 'with the session')
    status, doc = get('/clients/' .. MOVED .. '/sessions')
    t:is(status, 200, '/clients/<id>/sessions answers 200')
    t:is(#doc.sessions == 1 and doc.sessions[1].handle, helper.handle(moved_sid), 'the session is served')
    t:is_deeply(doc.copies, {}, 'copies is empty')
end)

test:test('a bucket not active here: 421 with its state, listed as a copy', function(t)
    local cases = {
        {'receiving', 's2', 'a copy moving in'},
        {'sending', 's2', 'moving out (paused)'},
        {'sent', 's2', 'sent, not yet garbage'},
        {'garbage', 's2', 'purged after a move'},
        {'aborting', 's2', 'a given-up copy being deleted'},
        {nil, nil, 'not held at all'},
    }
    t:plan(#cases * 9)
    for _, c in ipairs(cases) do
        local state, peer, what = c[1], c[2], c[3]
        set_state(B_MOVED, state, peer)
        local label = string.format('%s (%s): ', what, tostring(state))
        local status, doc = get('/sessions/' .. helper.handle(moved_sid))
        t:is(status, 421, label .. '/sessions/<handle> answers 421')
        t:is(doc.error, 'NOT_SERVED_HERE', label .. 'error NOT_SERVED_HERE')
        t:is(doc.message, string.format('not served here: bucket %d is %s on this shard', B_MOVED,
            state or 'not held'), label .. 'the message names the bucket and its state')
        t:is_deeply({doc.bucket, doc.bucket_state, doc.peer}, {B_MOVED, state or json.NULL, peer or json.NULL},
            label .. 'bucket, bucket_state, peer')
        t:is(doc.data, nil, label .. 'no row data')
        status, doc = get('/clients/' .. MOVED .. '/sessions')
        t:is(status, 200, label .. '/clients/<id>/sessions answers 200')
        t:is_deeply(doc.sessions, {}, label .. 'no session served')
        local copy = doc.copies[1] or {}
        t:is_deeply({#doc.copies, copy.handle, copy.bucket, copy.bucket_state, copy.peer},
            {1, helper.handle(moved_sid), B_MOVED, state or json.NULL, peer or json.NULL}, label .. 'the row is listed as a copy')
        t:is(get('/sessions/' .. helper.handle(here_sid)), 200, label .. 'another client\'s active bucket is served')
    end
    set_state(B_MOVED, 'active')
end)

test:test('a row written before sharding (no bucket field) is judged by its client\'s bucket', function(t)
    t:plan(3)
    local sid = helper.session(MOVED, {who = 'old'})
    unfenced(function() box.space.sessions:update(sid, {{'=', F.bucket, box.NULL}}) end)
    t:is(box.space.sessions:get(sid)[F.bucket], nil, 'the row has no bucket')
    set_state(B_MOVED, 'sent', 's2')
    local status, doc = get('/sessions/' .. helper.handle(sid))
    t:is_deeply({status, doc.bucket, doc.bucket_state}, {421, B_MOVED, 'sent'}, '/sessions/<handle>: 421, sent')
    status, doc = get('/clients/' .. MOVED .. '/sessions')
    t:is_deeply({status, #doc.sessions, #doc.copies}, {200, 0, 2}, 'both rows listed as copies')
end)

test:test('an expired copy is in neither list', function(t)
    t:plan(2)
    unfenced(function() helper.age('sessions', F.expires_at, 3600 * 1000) end)
    local status, doc = get('/clients/' .. MOVED .. '/sessions')
    t:is_deeply({status, #doc.sessions, #doc.copies}, {200, 0, 0}, 'nothing listed')
    t:is(get('/sessions/' .. helper.handle(moved_sid)), 404, '/sessions/<handle>: 404')
end)

server:close()
helper.finish(test)
