-- Idempotency keys: a write repeated under the same key is applied once.
--
-- run() executes a write procedure and, when it was applied (OK), stores its
-- result under the client's key in the same transaction, so the key exists if
-- and only if the write happened. A repeat within SC_IDEMPOTENCY_TTL_S returns
-- the stored result (with replayed = true) and changes nothing: the model of
-- Stripe's Idempotency-Key and Kafka's idempotent producer. The key is bound
-- to the procedure and a digest of its arguments (the session id is one of
-- them); reusing it for another request is BAD_REQUEST.
--
-- A refusal (BAD_REQUEST, CONFLICT, NOT_FOUND, ALREADY_EXISTS: anything but
-- OK) changed nothing, so it is not stored: a repeat runs again and answers
-- the state of now. Stored, a refusal would be replayed stale for ten minutes
-- (a CONFLICT with a value long gone; a BAD_REQUEST that kept the key from
-- the corrected request), and running a refusal again applies nothing twice.
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

-- What a repeat under `key` answers: the stored result as a replay, BAD_REQUEST
-- when the key was used for another request, nil when the key is unused (or
-- expired): run the write.
local function stored(key, fp, now)
    local t = box.space.idempotency:get(key)
    if t ~= nil and t[F.expires_at] > now then
        if t[F.fingerprint] ~= fp then
            return util.bad_request('idempotency_key was used for a different request')
        end
        return replay(t[F.result])
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
        local repeated = stored(key, fp, now)
        if repeated ~= nil then
            return repeated
        end
        local result = fn(...)
        if result.status == 'OK' then
            box.space.idempotency:replace({key, procedure, fp, now + config.idempotency_ttl_ms, result})
        end
        return result
    end, ...)
end

-- For a write of several transactions of its own (SESSION_DELETE_CLIENT): what
-- a repeat answers (as M.run's), and, in its last transaction, store its result.
function M.stored(key, procedure, ...)
    return stored(key, fingerprint(procedure, ...), util.now_ms())
end

function M.store(key, procedure, result, ...)
    box.space.idempotency:replace({key, procedure, fingerprint(procedure, ...),
                                   util.now_ms() + config.idempotency_ttl_ms, result})
end

return M
