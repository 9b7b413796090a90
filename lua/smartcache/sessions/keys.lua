-- The session key, as storage sees it (issue 37): storage never holds the key the service derives
-- stored ids with, but it keeps the cluster to one:
--
--   * sc.session_key_check(key_id): every service instance, at start, gives the id of its key (the
--     first 8 bytes of HMAC-SHA256(K, "smartcache session key id"), hex); the first one given is
--     kept in sc_meta ('session_key_id') and every later one must match it (MISMATCH otherwise: that
--     service stays not ready). Changing the key is a rekey (docs/operations.md), not a restart.
--   * the migration of rows written before revision 11, keyed by the raw id (no `stored` mark):
--     sc.session_rekey(raw, stored) renames one (its row, its cache entries, its rotations' rows, in
--     one transaction), asked by the service on a NOT_FOUND (SMARTCACHE_SESSION_REKEY=lazy) and by
--     `smartcache-cli cluster sessions-rekey`, which pages through them with sc.sessions_page.
local util = require('smartcache.util')
local quorum = require('smartcache.quorum')
local sharding = require('smartcache.sharding')
local access = require('smartcache.sessions.access')
local handles = require('smartcache.sessions.handles')
local rotations = require('smartcache.sessions.rotations')
local F = require('smartcache.schema').F.sessions

local M = {}

M.META_KEY = 'session_key_id'
M.KEY_ID_HEX = 16
M.PAGE_LIMIT, M.PAGE_MAX = 100, 1000
-- A page looks at no more rows than this (most rows are rekeyed already), then answers with
-- what it found and the cursor to go on from.
M.SCAN_MAX = 10000

-- sc.session_key_check(key_id): OK {key_id, first?} (first: this call stored it) · MISMATCH {expected}
-- (another key's id is kept: nothing written) · NOT_LEADER (none kept yet and this instance may not
-- write) · BAD_REQUEST.
function M.key_check(key_id)
    if type(key_id) ~= 'string' or #key_id ~= M.KEY_ID_HEX or not key_id:match('^%x+$') then
        return util.bad_request(string.format('key_id must be %d hex characters (the first 8 bytes of '
            .. 'HMAC-SHA256(key, "smartcache session key id"))', M.KEY_ID_HEX))
    end
    key_id = key_id:lower()
    local kept = box.space.sc_meta:get(M.META_KEY)
    if kept ~= nil then
        if kept[2] == key_id then
            return util.result('OK', {key_id = key_id})
        end
        return util.result('MISMATCH', {expected = kept[2], message = string.format(
            'this cluster\'s sessions are keyed with key id %s, not %s', kept[2], key_id)})
    end
    if not util.writable() then
        return util.result('NOT_LEADER')
    end
    return util.atomic(function()
        kept = box.space.sc_meta:get(M.META_KEY)  -- (no yield since: still none)
        if kept ~= nil then
            return util.result(kept[2] == key_id and 'OK' or 'MISMATCH', {expected = kept[2]})
        end
        -- sc_meta is not guarded: its write joins the synchronous ones in flight (quorum.join).
        box.space.sc_meta:insert({M.META_KEY, key_id})
        quorum.join()
        return util.result('OK', {key_id = key_id, first = true})
    end)
end

-- Do a raw id and the stored id derived from it route alike? (the derivation keeps the version,
-- the variant and, for version 8, the bucket: proto/PROTOCOL.md)
local function same_routing(raw, stored)
    if raw:sub(15, 15) ~= stored:sub(15, 15) then
        return 'the stored id must have the raw id\'s version'
    end
    local variant = function(id)
        return bit.rshift(tonumber(id:sub(20, 20), 16), 2)
    end
    if variant(raw) ~= variant(stored) then
        return 'the stored id must have the raw id\'s variant'
    end
    if sharding.of_session(raw) ~= sharding.of_session(stored) then
        return 'the stored id must carry the raw id\'s bucket'
    end
    return nil
end

-- sc.session_rekey(raw, stored): the raw-keyed session `raw` becomes `stored`, with its cache entries
-- and its rotations' rows, in one transaction; it gets its absolute deadline (created_at + the
-- cluster's default) as at any write. OK {cache_moved, expires_in_ms, absolute_expires_in_ms} ·
-- NOT_FOUND (no live raw-keyed session `raw`: rekeyed already, never there, expired, past its absolute
-- deadline) · ALREADY_EXISTS (`stored` is a session already) · BAD_REQUEST.
function M.rekey(raw, stored)
    local err = (not handles.is_uuid(raw) and 'raw must be canonical UUID text (lowercase)')
        or (not handles.is_uuid(stored) and 'stored must be canonical UUID text (lowercase)')
        or (raw == stored and 'stored must differ from raw') or nil
    err = err or same_routing(raw, stored)
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    return util.atomic(function()
        local t = access.live(raw, now)
        if t == nil or access.is_stored(t) then
            return util.result('NOT_FOUND')
        end
        if box.space.sessions:get(stored) ~= nil then
            return util.result('ALREADY_EXISTS', {message = 'the stored id is a session already'})
        end
        local moved = rotations.move_rows(raw, stored)
        box.space.sessions:delete(raw)
        local row = rotations.renamed(t, stored, true)
        box.space.sessions:insert(row)
        return util.result('OK', {cache_moved = moved, expires_in_ms = row[F.expires_at] - now,
                                  absolute_expires_in_ms = row[F.absolute_at] - now})
    end)
end

-- sc.sessions_page(after?, limit?): operators (the CLI's sessions-rekey): the live raw-keyed sessions
-- this shard serves, in id order after `after`, at most `limit` (100; 1..1000), looking at no more
-- than SCAN_MAX rows: OK {sessions: [{session_id (the raw id), client_id}], last (the last id looked
-- at: the next page's `after`), done}. The raw ids are credentials: operators only, and only until
-- the migration is done.
function M.page(after, limit)
    after, limit = util.opt(after, nil), util.opt(limit, M.PAGE_LIMIT)
    local err = util.check(after, 'string', 'after', true) or util.check_positive(limit, 'limit', M.PAGE_MAX)
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    local out, last, scanned = setmetatable({}, {__serialize = 'array'}), after or box.NULL, 0
    local from, iterator = after, 'GT'
    if after == nil then
        from, iterator = nil, 'ALL'
    end
    for _, t in box.space.sessions.index.primary:pairs(from, {iterator = iterator}) do
        if #out >= limit or scanned >= M.SCAN_MAX then
            return util.result('OK', {sessions = out, last = last, done = false})
        end
        scanned = scanned + 1
        last = t[F.id]
        if not access.is_stored(t) and access.alive(t, now) and sharding.serves_row('sessions', t) then
            table.insert(out, {session_id = t[F.id], client_id = t[F.client_id]})
        end
    end
    return util.result('OK', {sessions = out, last = last, done = true})
end

return M
