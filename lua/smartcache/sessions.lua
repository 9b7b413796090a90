-- Sessions: create (with a per-client limit), get-and-refresh (sliding expiry),
-- touch, update (whole value with compare-and-set, or attribute merges), rotate
-- (a new id for the same session), delete (cascading to the session's cache),
-- delete every session of a client (log out everywhere), list by client.
--
-- Each is one transaction (log out everywhere: one per batch), so what a front
-- tier needs at login and logout holds under concurrency from many front
-- servers: two logins of a client limited to one session leave one, two
-- requests changing different attributes both survive, an old id is gone the
-- instant its rotation commits.
--
-- A session whose deadline has passed is NOT_FOUND at once, swept or not.
local log = require('log')
local util = require('smartcache.util')
local config = require('smartcache.config')
local events = require('smartcache.events')
local idempotency = require('smartcache.idempotency')
local buckets = require('smartcache.buckets')
local F = require('smartcache.schema').F.sessions

local M = {}

local function live(id, now)
    return util.live(box.space.sessions, id, F.expires_at, now)
end
M.live = live

-- The limit of live sessions per client and what a create beyond it does.
M.POLICIES = {refuse = true, evict_oldest = true}
M.MAX_DEVICE_BYTES = 128

local function ttl_ms(ttl_s)
    if ttl_s == nil then
        return config.session_ttl_ms, nil
    end
    local err = util.check_positive(ttl_s, 'ttl_s', config.max_ttl_ms / 1000)
    return ttl_s * 1000, err
end

-- The payload of an event about a session: {client_id}, filled anew for each
-- event (the event's insert encodes it at once), so a write allocates none.
local about = {client_id = ''}
local function of_client(client_id)
    about.client_id = client_id
    return about
end

-- Called with each new session's deadline (ms since the epoch), inside its
-- transaction: smartcache.expiry registers the wake-up of its sweeper, which
-- may sleep past it (set_on_deadline).
local on_deadline = nil

function M.set_on_deadline(fn)
    on_deadline = fn
end

-- The client's live sessions, least recently used first (at most `limit`
-- looked at beyond the first `limit`: enough to decide a limit of that size).
local function live_of(client_id, now)
    local out = {}
    for _, t in box.space.sessions.index.by_client:pairs({client_id}, {iterator = 'EQ'}) do
        if t[F.expires_at] > now then
            table.insert(out, t)
        end
    end
    table.sort(out, function(a, b) return a[F.updated_at] < b[F.updated_at] end)
    return out
end

local function check_limit(max_sessions, policy)
    if max_sessions == nil then
        return config.max_sessions_per_client, policy or config.session_limit_policy, nil
    end
    local err = util.check_positive(max_sessions, 'max_sessions', 10000)
    if err == nil and policy ~= nil and not M.POLICIES[policy] then
        err = 'limit_policy must be refuse or evict_oldest'
    end
    return max_sessions, policy or config.session_limit_policy, err
end

-- id nil: a new random (version 4) UUID, returned as session_id. Generated
-- here, so a repeat under an idempotency key has the same arguments.
-- max_sessions (default SC_MAX_SESSIONS_PER_CLIENT, 0 = none): the client's
-- live sessions after this one; beyond it, limit_policy 'refuse' answers
-- LIMIT_REACHED (saying nothing of the other sessions) and 'evict_oldest' ends
-- the least recently used ones (session.evicted each). Counted and decided in
-- the transaction that inserts, so concurrent creates cannot both pass.
-- A new session id of a client: version 4 (random), or in a sharded cluster
-- version 8 carrying the client's bucket (smartcache.buckets), so that every
-- later call on it routes with no lookup.
local function new_id(client_id)
    local id = util.uuid()
    local count = buckets.count()
    if count ~= nil then
        return buckets.session_id(id, buckets.of(client_id, count))
    end
    return id
end

-- An id the caller chose must carry its client's bucket, if it carries one.
local function id_of_another_bucket(id, client_id)
    local count = buckets.count()
    local carried = count ~= nil and buckets.of_session(id) or nil
    if carried ~= nil and carried ~= buckets.of(client_id, count) then
        return string.format('session id carries bucket %d, client_id\'s bucket is %d', carried,
            buckets.of(client_id, count))
    end
    return nil
end

function M.create(id, client_id, version, ttl_s, data, max_sessions, policy, device)
    local err = util.check(id, 'string', 'session id', true) or util.check(client_id, 'string', 'client_id')
        or util.check(version, 'string', 'version', true) or util.check(device, 'string', 'device', true)
    local ttl, limit
    if err == nil and device ~= nil and #device > M.MAX_DEVICE_BYTES then
        err = string.format('device must be a string of 0..%d bytes', M.MAX_DEVICE_BYTES)
    end
    if err == nil then
        ttl, err = ttl_ms(ttl_s)
    end
    if err == nil then
        limit, policy, err = check_limit(util.opt(max_sessions, nil), util.opt(policy, nil))
    end
    if err == nil and util.opt(id, nil) ~= nil then
        err = id_of_another_bucket(id, client_id)
    end
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    id = util.opt(id, nil) or new_id(client_id)
    return util.atomic(function()
        local t = box.space.sessions:get(id)
        if t ~= nil then
            if t[F.expires_at] > now then
                return util.result('ALREADY_EXISTS')
            end
            events.write('session.expired', id, of_client(t[F.client_id]))  -- expired, not swept yet: it ends here
        end
        local evicted = 0
        if limit > 0 then
            local others = live_of(client_id, now)
            if #others >= limit then
                if policy == 'refuse' then
                    return util.result('LIMIT_REACHED', {max_sessions = limit})
                end
                for i = 1, #others - limit + 1 do
                    M.drop(others[i][F.id], 'session.evicted')
                    evicted = evicted + 1
                end
            end
        end
        util.replace(box.space.sessions, {id, client_id, util.opt(version, ''), 1, now, ttl, now + ttl,
                                          util.opt(data, box.NULL), now, util.opt(device, box.NULL)})
        events.write('session.created', id, of_client(client_id))
        if on_deadline ~= nil then
            on_deadline(now + ttl)
        end
        return util.result('OK', {session_id = id, expires_in_ms = ttl, rev = 1,
                                  evicted = evicted > 0 and evicted or nil})
    end)
end

-- How stale a session's last refresh may be before a read writes a new one:
-- a tenth of its TTL (SC_REFRESH_FRACTION), within SC_REFRESH_GRANULARITY_MS ..
-- SC_REFRESH_MAX_MS. Its deadline is at most that much earlier than exact
-- sliding would make it.
local function refresh_after_ms(ttl)
    return math.min(math.max(ttl * config.refresh_fraction, config.refresh_granularity_ms), config.refresh_max_ms)
end
M.refresh_after_ms = refresh_after_ms

-- Push the deadline to now + ttl, unless the last refresh is recent enough: a
-- session read every few seconds costs a (synchronous) write per tenth of its
-- life, not per read.
local function refresh(id, now)
    local t = live(id, now)
    if t == nil or now - t[F.updated_at] < refresh_after_ms(t[F.ttl_ms]) then
        return t
    end
    M.refreshes = M.refreshes + 1
    return box.space.sessions:update(id, {{'=', F.updated_at, now}, {'=', F.expires_at, now + t[F.ttl_ms]}})
end
-- Refreshes written (reads and touches that moved a deadline), for sc.stats: writes per read.
M.refreshes = 0

-- Refresh failures seen by reads (no lease, disk or memory full), logged once per streak.
M.refresh_failures = 0

-- A read slides the deadline when it can. When the refresh cannot be written
-- (not writable, disk or memory full) the read still answers the data, with
-- refresh_failed = true: the deadline did not move.
-- Where a session lives, for an id made before sharding (version 4: it carries no
-- bucket): its bucket here, if this shard has it live. A read that writes nothing
-- (no refresh), asked of every shard by the service (docs/design/sharding.md).
function M.locate(id)
    local err = util.check(id, 'string', 'session id')
    if err ~= nil then
        return util.bad_request(err)
    end
    local t = live(id, util.now_ms())
    if t == nil then
        return util.result('NOT_FOUND')
    end
    local count = buckets.count()
    return util.result('OK', {bucket = count and buckets.of(t[F.client_id], count) or box.NULL})
end

function M.get(id)
    local now = util.now_ms()
    local t, failed
    if util.writable() then
        local ok, res = pcall(refresh, id, now)
        if ok then
            t = res
        else
            failed = true
            if M.refresh_failures == 0 then
                log.warn('session refresh failed, reads go on without sliding: %s', tostring(res))
            end
            M.refresh_failures = M.refresh_failures + 1
        end
    else
        failed = true
    end
    if failed then
        t = live(id, now)
        failed = t ~= nil and now - t[F.updated_at] >= refresh_after_ms(t[F.ttl_ms]) or nil
    elseif M.refresh_failures > 0 then
        log.info('session refresh works again after %d failed reads', M.refresh_failures)
        M.refresh_failures = 0
    end
    if t == nil then
        return util.result('NOT_FOUND')
    end
    return util.result('OK', {
        client_id = t[F.client_id], version = t[F.version], data = t[F.data], rev = t[F.rev],
        updated_at_ms = t[F.updated_at], expires_in_ms = t[F.expires_at] - now, refresh_failed = failed,
    })
end

function M.touch(id)
    local now = util.now_ms()
    local t = refresh(id, now)
    if t == nil then
        return util.result('NOT_FOUND')
    end
    return util.result('OK', {expires_in_ms = t[F.expires_at] - now})
end

-- A msgpack map: decoded ones say so in their metatable; a plain Lua table is one
-- when it has no array part (an empty table counts as an empty map).
local function is_map(v)
    if type(v) ~= 'table' then
        return false
    end
    local mt = getmetatable(v)
    if mt ~= nil and mt.__serialize ~= nil then
        return mt.__serialize == 'map' or mt.__serialize == 'mapping'
    end
    return #v == 0
end

-- The merge of SESSION_UPDATE's set (attribute -> value) and unset (attributes)
-- into a session's map-valued data (no data yet: an empty map). nil and why for
-- data that is not a map.
local function merged(data, set, unset)
    data = util.opt(data, nil)  -- no data is stored as box.NULL
    if data ~= nil and not is_map(data) then
        return nil, 'set/unset need the session data to be a map; it is not (replace it whole with data)'
    end
    local out = setmetatable({}, {__serialize = 'map'})
    for k, v in pairs(data or {}) do
        out[k] = v
    end
    for k, v in pairs(set or {}) do
        out[k] = v
    end
    for _, k in ipairs(unset or {}) do
        out[k] = nil
    end
    return out
end

local function check_merge(data, set, unset)
    if set == nil and unset == nil then
        return data == nil and 'data, or set / unset, is required' or nil
    end
    if data ~= nil then
        return 'data replaces the whole value; set / unset change attributes: give one or the other'
    end
    if set ~= nil and not is_map(set) then
        return 'set must be a map of attribute -> value'
    end
    if unset ~= nil then
        if type(unset) ~= 'table' or is_map(unset) and next(unset) ~= nil then
            return 'unset must be a list of attribute names'
        end
        for _, k in ipairs(unset) do
            if type(k) ~= 'string' then
                return 'unset must be a list of attribute names'
            end
        end
    end
    for k in pairs(set or {}) do
        if type(k) ~= 'string' then
            return 'set must have string keys'
        end
    end
    return nil
end

-- Replace the data (data), or merge attributes into it (set, unset) inside the
-- transaction, so two requests changing different attributes both survive;
-- expected_rev makes either a compare-and-set.
function M.update(id, data, expected_rev, version, set, unset)
    data, set, unset = util.opt(data, nil), util.opt(set, nil), util.opt(unset, nil)
    expected_rev = util.opt(expected_rev, nil)  -- 10^14 and more come as 64-bit cdata
    local err = util.check_positive(expected_rev, 'expected_rev', util.MAX_SAFE, true)
        or util.check(version, 'string', 'version', true) or check_merge(data, set, unset)
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    return util.atomic(function()
        local t = live(id, now)
        if t == nil then
            return util.result('NOT_FOUND')
        end
        if expected_rev ~= nil and t[F.rev] ~= expected_rev then
            return util.result('CONFLICT', {rev = t[F.rev]})
        end
        local value = data
        if data == nil then
            local why
            value, why = merged(t[F.data], set, unset)
            if value == nil then
                return util.bad_request(why)
            end
        end
        local ops = {{'=', F.data, value}, {'+', F.rev, 1}, {'=', F.updated_at, now},
                     {'=', F.expires_at, now + t[F.ttl_ms]}}
        if version ~= nil then
            table.insert(ops, {'=', F.version, version})
        end
        t = box.space.sessions:update(id, ops)
        events.write('session.updated', id, {client_id = t[F.client_id], rev = t[F.rev]})
        return util.result('OK', {rev = t[F.rev], expires_in_ms = t[F.ttl_ms]})
    end)
end

-- Delete a session tuple and its cache entries, with its event (session.expired
-- past its deadline, else `topic`, session.deleted by default); call inside a
-- transaction.
local function drop(id, topic)
    local entries = box.space.cache.index.primary:select({id}, {iterator = 'EQ'})
    for _, c in ipairs(entries) do
        box.space.cache:delete({c[1], c[2]})
    end
    local t = box.space.sessions:delete(id)
    if t ~= nil then
        local ended = t[F.expires_at] <= util.now_ms() and 'session.expired' or topic or 'session.deleted'
        events.write(ended, id, of_client(t[F.client_id]))
    end
    return #entries
end
M.drop = drop

function M.delete(id)
    local now = util.now_ms()
    return util.atomic(function()
        if live(id, now) == nil then
            -- An expired leftover still goes, with its cache, but the answer is NOT_FOUND.
            if box.space.sessions:get(id) ~= nil then
                drop(id)
            end
            return util.result('NOT_FOUND')
        end
        return util.result('OK', {cache_deleted = drop(id)})
    end)
end

function M.list(client_id)
    local err = util.check(client_id, 'string', 'client_id')
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    local out = {}
    for _, t in box.space.sessions.index.by_client:pairs({client_id}, {iterator = 'EQ'}) do
        if t[F.expires_at] > now then
            table.insert(out, {session_id = t[F.id], version = t[F.version], rev = t[F.rev],
                               created_at_ms = t[F.created_at] or t[F.updated_at], updated_at_ms = t[F.updated_at],
                               expires_in_ms = t[F.expires_at] - now, device = t[F.device]})
        end
    end
    return util.result('OK', {sessions = out})
end

-- A new id for the same session: client, data, revision, cache entries and the
-- deadline move to it in one transaction, and the old id is gone the instant
-- it commits (a front server rotates at login: session fixation). One event,
-- session.rotated, keyed by the new id with the old one in its payload.
function M.rotate(id)
    local now = util.now_ms()
    return util.atomic(function()
        local t = live(id, now)
        if t == nil then
            return util.result('NOT_FOUND')
        end
        local new = new_id(t[F.client_id])
        local entries = box.space.cache.index.primary:select({id}, {iterator = 'EQ'})
        for _, c in ipairs(entries) do
            box.space.cache:delete({c[1], c[2]})
            box.space.cache:insert(c:update({{'=', 1, new}}))
        end
        box.space.sessions:delete(id)
        box.space.sessions:insert(t:update({{'=', F.id, new}, {'=', F.created_at, t[F.created_at] or t[F.updated_at]}}))
        events.write('session.rotated', new, {client_id = t[F.client_id], old_session_id = id})
        return util.result('OK', {session_id = new, expires_in_ms = t[F.expires_at] - now, rev = t[F.rev],
                                  cache_moved = #entries})
    end)
end

-- Log out everywhere: every live session of a client (but `except`, the
-- caller's own, when given) ends with its cache entries, session.deleted each,
-- in transactions of SC_DELETE_BATCH sessions, so a client with 10,000 sessions
-- never holds the transaction thread for long. A session created meanwhile may
-- survive. Stops at the call's deadline with more = true (call again); under an
-- idempotency key a repeat answers the first call's count once it completed.
function M.delete_client(deadline_ms, key, client_id, except)
    local err = util.check(client_id, 'string', 'client_id') or util.check(except, 'string', 'except', true)
    if err == nil and key ~= nil then
        err = idempotency.check_key(key)
    end
    if err ~= nil then
        return util.bad_request(err)
    end
    if not util.writable() then
        return {status = 'NOT_LEADER'}
    end
    if key ~= nil then
        local stored = idempotency.stored(key, 'session_delete_client', client_id, except)
        if stored ~= nil then
            return stored
        end
    end
    local deleted, cache_deleted = 0, 0
    while true do
        if deadline_ms ~= nil and util.now_ms() >= deadline_ms then
            return util.result('OK', {deleted = deleted, cache_deleted = cache_deleted, more = true})
        end
        -- Each batch is its own transaction and the batches yield between them: a move of the client's
        -- bucket may begin meanwhile. Then the rest is the new shard's to delete (asked again there).
        if deleted > 0 and buckets.refusal('key', client_id) ~= nil then
            return util.result('OK', {deleted = deleted, cache_deleted = cache_deleted, more = true})
        end
        local now = util.now_ms()
        local batch = {}
        for _, t in box.space.sessions.index.by_client:pairs({client_id}, {iterator = 'EQ'}) do
            if t[F.id] ~= except and t[F.expires_at] > now then
                table.insert(batch, t[F.id])
                if #batch >= config.delete_batch then
                    break
                end
            end
        end
        local last = #batch < config.delete_batch
        local result = util.atomic(function()
            for _, sid in ipairs(batch) do
                cache_deleted = cache_deleted + drop(sid)
            end
            deleted = deleted + #batch
            local r = util.result('OK', {deleted = deleted, cache_deleted = cache_deleted})
            if last and key ~= nil then
                idempotency.store(key, 'session_delete_client', r, client_id, except)
            end
            return r
        end)
        if last then
            return result
        end
    end
end

return M
