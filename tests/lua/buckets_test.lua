#!/usr/bin/env tarantool
-- Buckets (smartcache.sharding.buckets) against proto/vectors/buckets.json, which the
-- service's side is tested against too (tests/unit/test_buckets.py).
-- Runnable alone: `tarantool tests/lua/buckets_test.lua`.
local tap = require('tap')
local fio = require('fio')
local json = require('json')
local uuid = require('uuid')

local here = fio.dirname(fio.abspath(debug.getinfo(1, 'S').source:sub(2)))
package.path = fio.pathjoin(here, '..', '..', 'lua') .. '/?.lua;' .. package.path  -- tests/lua -> lua/

local buckets = require('smartcache.sharding.buckets')

local fh = fio.open(fio.pathjoin(fio.dirname(fio.dirname(here)), 'proto', 'vectors', 'buckets.json'))
local vectors = json.decode(fh:read())
fh:close()

local test = tap.test('buckets')
test:plan(4)

test:is(buckets.crc32c(vectors.check.input), vectors.check.crc32c, 'crc32c has its check value')

test:test('a key\'s bucket is its crc32c mod the count, as the service computes it', function(t)
    t:plan(#vectors.keys * 5)
    for _, v in ipairs(vectors.keys) do
        t:is(buckets.crc32c(v.key), v.crc32c, 'crc32c of ' .. v.key:sub(1, 20))
        for count, bucket in pairs(v.buckets) do
            t:is(buckets.of(v.key, tonumber(count)), bucket, v.key:sub(1, 20) .. ' among ' .. count)
        end
    end
end)

test:test('a session id says its bucket, or nil when made before sharding', function(t)
    t:plan(#vectors.session_ids)
    for _, v in ipairs(vectors.session_ids) do
        local want = v.bucket
        if want == json.NULL then
            want = nil
        end
        t:is(buckets.of_session(v.id), want, v.id)
    end
end)

test:test('an id made with a bucket carries it, is version 8 and keeps the random rest', function(t)
    t:plan(4)
    local ok_all, carried = true, true
    for i = 0, 999 do
        local v4 = uuid.str()
        local bucket = (i * 65) % buckets.MAX_BUCKETS
        local id = buckets.session_id(v4, bucket)
        local parsed = uuid.fromstr(id)
        ok_all = ok_all and parsed ~= nil and id:sub(15, 15) == '8' and id:sub(5, 14) == v4:sub(5, 14)
        carried = carried and buckets.of_session(id) == bucket
    end
    t:ok(ok_all, 'version 8 UUID text, the random part kept')
    t:ok(carried, 'the bucket read back from 1,000 ids')
    t:is(buckets.of_session(uuid.str()), nil, 'a version 4 id: none')
    t:is(buckets.of_session('not-a-uuid'), nil, 'not a UUID: none')
end)

os.exit(test:check() and 0 or 1)
