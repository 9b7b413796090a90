-- Rotation: a new id for the same session (a front server rotates at login: session
-- fixation), with a grace window (issue 37). Client, data, revision, binding, cache
-- entries and both deadlines move to the new id in one transaction; for grace_ms
-- after its commit the old id still answers READS (smartcache.sessions.access
-- resolve: the rotated session's current data with rotated = true, its cache; never
-- a refresh), so a mobile app's requests already in flight with the old id do not
-- fail at every login; writes with it are NOT_FOUND from the commit, so of two
-- concurrent rotations exactly one wins. grace_ms 0 is the behaviour before: the old
-- id is gone at the commit.
--
-- The space `rotations` keeps {old_id -> new_id, expires_at} (guarded, swept at
-- expires_at by the expiry fibers); when the session rotates again its old ids follow
-- it to the newest (their windows unchanged), and when it ends they go with it
-- (smartcache.sessions.ends drop).
local util = require('smartcache.util')
local config = require('smartcache.config')
local events = require('smartcache.events')
local sharding = require('smartcache.sharding')
local access = require('smartcache.sessions.access')
local handles = require('smartcache.sessions.handles')
local create = require('smartcache.sessions.create')
local schema = require('smartcache.schema')
local F = schema.F.sessions
local FR = schema.F.rotations

local M = {}

-- Called with each new grace window's end (ms since the epoch), inside its transaction:
-- smartcache.expiry wakes the rotations' sweeper, which may sleep past it.
local on_deadline = nil

function M.set_on_deadline(fn)
    on_deadline = fn
end

local function check_grace(grace_ms)
    if grace_ms ~= nil and (type(grace_ms) ~= 'number' or grace_ms ~= math.floor(grace_ms) or grace_ms < 0
            or grace_ms > config.limits.grace_ms.max) then
        return string.format('grace_ms must be an integer in 0..%d', config.limits.grace_ms.max)
    end
    return nil
end

-- Move the cache entries and the rotations' rows of session `from` to `to`, inside a transaction
-- (a rotation, a rekey); how many cache entries moved.
function M.move_rows(from, to)
    local entries = box.space.cache.index.primary:select({from}, {iterator = 'EQ'})
    for _, c in ipairs(entries) do
        box.space.cache:delete({c[1], c[2]})
        box.space.cache:insert(c:update({{'=', 1, to}}))
    end
    local rotations = box.space.rotations
    for _, r in ipairs(rotations.index.by_new:select({from}, {iterator = 'EQ'})) do
        rotations:update(r[FR.old_id], {{'=', FR.new_id, to}})  -- an older id of the session follows it
    end
    local own = rotations:get(from)  -- a rekey: the raw id was an old id itself (rotated to another)
    if own ~= nil then
        rotations:delete(from)
        rotations:replace(own:update({{'=', FR.old_id, to}}))
    end
    return #entries
end

-- The session's row under a new id (a rotation, a rekey): the absolute deadline set (a row of before
-- version 9 gets its own now) and the idle one never past it. `stored`: the new id is a stored id.
function M.renamed(t, id, stored)
    local row = access.fields(t)
    row[F.id] = id
    row[F.created_at] = access.created_at(t)
    row[F.absolute_at] = access.absolute(t)
    row[F.expires_at] = math.min(t[F.expires_at], row[F.absolute_at])
    row[F.stored] = stored or box.NULL
    return row
end

-- sc.session_rotate(id, new_id, grace_ms?, binding?): id, the old stored id; new_id, the new one
-- the service derived from the raw id it made (nil: a service of revision 10, see
-- smartcache.sessions.create: made here and answered as session_id); grace_ms, how long the old id
-- answers reads (default SC_ROTATE_GRACE_MS). OK {rev, cache_moved, handle, expires_in_ms,
-- absolute_expires_in_ms} · NOT_FOUND (not live: a second rotation, an old id, an ended session) ·
-- ALREADY_EXISTS (new_id is a session already) · BINDING_MISMATCH · BAD_REQUEST.
-- One event, session.rotated, keyed by the new handle with the old one in its payload.
function M.rotate(id, new, grace_ms, binding)
    new, grace_ms, binding = util.opt(new, nil), util.opt(grace_ms, nil), util.opt(binding, nil)
    local err = util.check(id, 'string', 'session id') or check_grace(grace_ms) or access.check_binding(binding)
    if err == nil and new ~= nil then
        if not handles.is_uuid(new) then
            err = 'new session id must be canonical UUID text (lowercase)'
        elseif new == id then
            err = 'the new session id must differ from the old one'
        elseif sharding.of_session(new) ~= nil and sharding.of_session(id) ~= nil
                and sharding.of_session(new) ~= sharding.of_session(id) then
            err = 'the new session id must carry the old one\'s bucket'
        end
    end
    if err ~= nil then
        return util.bad_request(err)
    end
    local grace = grace_ms or config.rotate_grace_ms
    local now = util.now_ms()
    return util.atomic(function()
        local t, refused = access.acting_on(id, binding, now)
        if t == nil then
            return refused
        end
        local made = new == nil
        if made then
            new = create.new_id(t[F.client_id])
        else
            local why = create.id_of_another_bucket(new, t[F.client_id])  -- an old id of before sharding
            if why ~= nil then
                return util.bad_request(why)
            end
            if box.space.sessions:get(new) ~= nil then
                return util.result('ALREADY_EXISTS', {message = 'the new session id is a session already'})
            end
        end
        local moved = M.move_rows(id, new)
        box.space.sessions:delete(id)
        local row = M.renamed(t, new, not made)
        box.space.sessions:insert(row)
        if grace > 0 then
            box.space.rotations:replace({id, new, now + grace})
            if on_deadline ~= nil then
                on_deadline(now + grace)
            end
        end
        local name = handles.name(new, not made)
        events.write('session.rotated', name, {client_id = t[F.client_id], old_handle = access.name(t)})
        return util.result('OK', {session_id = made and new or nil, rev = t[F.rev], cache_moved = moved,
                                  handle = name, expires_in_ms = row[F.expires_at] - now,
                                  absolute_expires_in_ms = row[F.absolute_at] - now})
    end)
end

return M
