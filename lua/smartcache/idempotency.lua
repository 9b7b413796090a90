-- Idempotency keys: a write repeated under the same key is applied once.
--
-- run() executes a write procedure and stores its result under the client's
-- key in the same transaction, so the key exists if and only if the write
-- happened. A repeat within SC_IDEMPOTENCY_TTL_S returns the stored result
-- (with replayed = true) and changes nothing: the model of Stripe's
-- Idempotency-Key and Kafka's idempotent producer. The key is bound to the
-- procedure and a digest of its arguments; reusing it for another request is
-- BAD_REQUEST.
local digest = require('digest')
local msgpack = require('msgpack')
local util = require('smartcache.util')
local config = require('smartcache.config')
local F = require('smartcache.schema').F.idempotency

local M = {}

M.MAX_KEY_BYTES = 64

local function fingerprint(procedure, ...)
    return procedure .. ':' .. digest.sha1_hex(msgpack.encode({...}))
end

-- The stored result, marked as a replay (a copy: the tuple's table is not ours to change).
local function replay(stored)
    local r = {}
    for k, v in pairs(stored) do
        r[k] = v
    end
    r.replayed = true
    return r
end

function M.check_key(key)
    if type(key) ~= 'string' or #key == 0 or #key > M.MAX_KEY_BYTES then
        return string.format('idempotency_key must be a string of 1..%d bytes', M.MAX_KEY_BYTES)
    end
    return nil
end

-- Run fn(...) once per key; returns its result, now or as stored.
function M.run(procedure, key, fn, ...)
    local err = M.check_key(key)
    if err ~= nil then
        return util.bad_request(err)
    end
    local fp = fingerprint(procedure, ...)
    return util.atomic(function(...)
        local now = util.now_ms()
        local t = box.space.idempotency:get(key)
        if t ~= nil and t[F.expires_at] > now then
            if t[F.fingerprint] ~= fp then
                return util.bad_request('idempotency_key was used for a different request')
            end
            return replay(t[F.result])
        end
        local result = fn(...)
        box.space.idempotency:replace({key, procedure, fp, now + config.idempotency_ttl_ms, result})
        return result
    end, ...)
end

return M
