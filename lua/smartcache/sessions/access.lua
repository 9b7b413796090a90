-- How a procedure finds the session it is called on, and what it may do with it (issue 37):
--
--   * live: a session whose deadline has passed is absent, swept or not;
--   * the absolute deadline: no refresh moves expires_at past absolute_at (created_at + max_lifetime_s),
--     so the sweeper and NOT_FOUND need nothing new; a row of before version 9 has none: it counts
--     created_at + SC_SESSION_MAX_LIFETIME_S, is absent past it (alive) and gets it written at its
--     next write (refresh_ops);
--   * the binding: a session created with one answers only a request that names the same one; the
--     service gives storage its SHA-256 (hex), never the value, and storage keeps that; anything else
--     is BINDING_MISMATCH, nothing done and nothing refreshed, with a session.binding_mismatch event
--     for the bank's fraud systems;
--   * the grace window: a read by the old id of a rotated session answers the session it was rotated
--     to (resolve; rotated = true) until the rotation's row expires; writes never resolve (NOT_FOUND);
--   * names: every session.* event is keyed by the session's handle (smartcache.sessions.handles).
local util = require('smartcache.util')
local config = require('smartcache.config')
local events = require('smartcache.events')
local quorum = require('smartcache.quorum')
local handles = require('smartcache.sessions.handles')
local schema = require('smartcache.schema')

local F = schema.F.sessions
local FR = schema.F.rotations

local M = {}

-- A binding as storage is given it: the SHA-256 of the request's value, as lowercase hex.
M.BINDING_HEX = 64
M.WIDTH = #schema.FORMAT.sessions

-- Whether a session row is alive at now: before its deadline, and before its absolute deadline (which a
-- row of version 9 has in its deadline already; a row of before counts it from its creation).
function M.alive(t, now)
    return t[F.expires_at] > now and (t[F.absolute_at] ~= nil or M.absolute(t) > now)
end

-- The live session row of an id, or nil.
function M.live(id, now)
    local t = box.space.sessions:get(id)
    if t == nil or not M.alive(t, now) then
        return nil
    end
    return t
end

-- Fields a row may hold as msgpack nil (box.NULL, which is truthy in Lua) or lack (older rows):
-- whether its id is a stored id; when it was created (older rows: their last refresh).
function M.is_stored(t)
    return t[F.stored] == true
end

function M.created_at(t)
    return util.opt(t[F.created_at], t[F.updated_at])
end

-- The session's absolute deadline (ms since epoch): its own, or for a row of before version 9
-- created_at (else its last refresh) + the cluster's default lifetime.
function M.absolute(t)
    local at = t[F.absolute_at]
    if at ~= nil then
        return at
    end
    return M.created_at(t) + config.session_max_lifetime_ms
end

-- The deadline a refresh at now gives: now + the session's TTL, never past its absolute deadline.
function M.deadline(t, now)
    return math.min(now + t[F.ttl_ms], M.absolute(t))
end

-- What a reply says of the deadlines, added to fields.
function M.expiry_fields(t, now, fields)
    fields.expires_in_ms = t[F.expires_at] - now
    fields.absolute_expires_in_ms = M.absolute(t) - now
    return fields
end

-- The update operations that refresh t at now (its last refresh, the new deadline), appended to ops;
-- a row of before version 9 gets its absolute deadline with them (a tuple shorter than the format
-- gets the missing nullable fields first: Tarantool 2.6 sets a field only up to one past the end).
function M.refresh_ops(t, now, ops)
    ops = ops or {}
    table.insert(ops, {'=', F.updated_at, now})
    table.insert(ops, {'=', F.expires_at, M.deadline(t, now)})
    if t[F.absolute_at] == nil then
        for i = #t + 1, F.absolute_at - 1 do
            table.insert(ops, {'!', i, box.NULL})
        end
        table.insert(ops, {'=', F.absolute_at, M.absolute(t)})
    end
    return ops
end

-- The row's fields as a Lua table as wide as the format (missing nullable fields box.NULL).
function M.fields(t)
    local out = t:totable()
    for i = #out + 1, M.WIDTH do
        out[i] = box.NULL
    end
    return out
end

-- The name of a session outside: its handle (a raw-keyed row of before: a digest of its id).
function M.name(t)
    return handles.name(t[F.id], M.is_stored(t))
end

-- Payloads of the events about a session, filled anew for each event (the event's insert encodes
-- it at once), so a write allocates none.
local about = {client_id = ''}
function M.of_client(client_id)
    about.client_id = client_id
    return about
end
local expired = {client_id = '', reason = ''}
-- session.expired: reason "absolute" when the deadline that passed was the absolute one, else "idle".
function M.expired(t, now)
    expired.client_id = t[F.client_id]
    local absolute = M.absolute(t)
    expired.reason = (t[F.expires_at] >= absolute or absolute <= now) and 'absolute' or 'idle'
    return expired
end

-- A binding as the service gives it: nil (none) or its SHA-256 as 64 lowercase hex characters (the
-- value's range, 1..256 bytes, is the service's to check: storage never sees the value); why not.
function M.check_binding(binding)
    if binding ~= nil and (type(binding) ~= 'string' or #binding ~= M.BINDING_HEX
            or not binding:match('^[0-9a-f]+$')) then
        return string.format('binding must be the SHA-256 of the request\'s binding, %d lowercase hex characters',
            M.BINDING_HEX)
    end
    return nil
end

-- Whether a request naming `binding` (nil: none) may act on t: always for a session created without
-- one; else only with the same one.
function M.bound(t, binding)
    local kept = t[F.binding]
    if kept == nil then
        return true
    end
    return binding == kept
end

-- The answer to a request whose binding does not match, with its event, inside the caller's
-- transaction (a write procedure: nothing else of it is done).
function M.mismatch(t)
    events.write('session.binding_mismatch', M.name(t), M.of_client(t[F.client_id]))
    return util.result('BINDING_MISMATCH')
end

-- The live session a write procedure acts on, or the answer refusing it: NOT_FOUND, or
-- BINDING_MISMATCH with its event (M.mismatch) for a bound session and another binding.
function M.acting_on(id, binding, now)
    local t = M.live(id, now)
    if t == nil then
        return nil, util.result('NOT_FOUND')
    end
    if not M.bound(t, binding) then
        return nil, M.mismatch(t)
    end
    return t
end

-- The same for a read, which runs in no transaction: the event in one of its own when this
-- instance may write; a read that cannot write it (not writable, disk full) still refuses.
function M.mismatch_read(t)
    if util.writable() then
        pcall(util.atomic, function()
            events.write('session.binding_mismatch', M.name(t), M.of_client(t[F.client_id]))
        end)
    end
    return util.result('BINDING_MISMATCH')
end

-- The live session a READ by id answers, and whether it was reached through a rotation: id's own,
-- else, within the grace window of a rotation of id, the session it was rotated to. Writes use
-- live() alone: an old id is NOT_FOUND for them from the rotation's commit.
function M.resolve(id, now)
    local t = M.live(id, now)
    if t ~= nil then
        return t, false
    end
    local rotations = box.space.rotations  -- nil on a replica the schema of version 9 has not reached
    local r = rotations and type(id) == 'string' and rotations:get(id) or nil
    if r == nil or r[FR.expires_at] <= now then
        return nil, false
    end
    local new = r[FR.new_id]
    -- The rotated session's row may have a write waiting for its quorum (compat.NO_MVCC_DIRTY_READS):
    -- api.lua waited for the old id's key only.
    if quorum.enabled and quorum.is_pending('sessions', new) then
        quorum.wait_key('sessions', new)
    end
    t = M.live(new, now)
    return t, t ~= nil
end

return M
