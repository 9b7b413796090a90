-- Sessions: create (with a per-client limit), get-and-refresh (sliding expiry),
-- touch, update (whole value with compare-and-set, or attribute merges), rotate
-- (a new id for the same session, the old one readable for a grace window), delete
-- (cascading to the session's cache; by id, or by handle and client), delete every
-- session of a client (log out everywhere), list by client (handles, never ids).
--
-- Each is one transaction (log out everywhere: one per batch), so what a front
-- tier needs at login and logout holds under concurrency from many front
-- servers: two logins of a client limited to one session leave one, two
-- requests changing different attributes both survive, an old id stops taking
-- writes the instant its rotation commits.
--
-- A session id is a credential (issue 37): storage keys sessions by the stored id the
-- service derives (it never sees the client's raw id), names them outside by handle,
-- enforces an absolute lifetime beside the idle one and, when a session was created
-- with one, its binding. A session whose deadline has passed is NOT_FOUND at once,
-- swept or not.
--
-- The public surface of smartcache/sessions/ (the rest of the code requires
-- this, never the folder's modules: tests/unit/test_lua_layers.py):
--
--   access.lua   what every procedure on a session checks: live, the absolute deadline, the
--                binding, an old id's grace window (reads), the session's name in events
--   handles.lua  handles: render and parse ("h" + base32 of the stored id)
--   create.lua   create: the per-client limit, the absolute deadline, the binding
--   reads.lua    get, touch (the sliding deadline, capped), locate, list
--   update.lua   update (compare-and-set, attribute merges)
--   rotations.lua rotate, with its grace window (the space rotations)
--   ends.lua     delete (by id, or by handle and client), delete_client (log out everywhere),
--                drop (expiry's too)
--   keys.lua     the session key's id (session_key_check), the rekey of raw-keyed rows
--   cache.lua    a session's cache entries (and a global namespace), lossy under memory pressure
--   device.lua   device bindings: a device id -> the client it belongs to
--   prewarm.lua  client data fetched before login: one fetcher (a lease), the others wait
local create = require('smartcache.sessions.create')
local reads = require('smartcache.sessions.reads')
local update = require('smartcache.sessions.update')
local rotations = require('smartcache.sessions.rotations')
local ends = require('smartcache.sessions.ends')
local keys = require('smartcache.sessions.keys')
local handles = require('smartcache.sessions.handles')
local access = require('smartcache.sessions.access')
local cache = require('smartcache.sessions.cache')
local device = require('smartcache.sessions.device')
local prewarm = require('smartcache.sessions.prewarm')

local M = {}

-- Procedures (registered in smartcache.api).
M.create = create.create
M.get = reads.get
M.touch = reads.touch
M.locate = reads.locate
M.list = reads.list
M.update = update.update
M.rotate = rotations.rotate
M.delete = ends.delete
M.delete_client = ends.delete_client
M.key_check = keys.key_check
M.rekey = keys.rekey
M.page = keys.page
M.cache_put = cache.put
M.cache_get = cache.get
M.cache_delete = cache.delete
M.device_bind = device.bind
M.device_lookup = device.lookup
M.prewarm_acquire = prewarm.acquire
M.prewarm_complete = prewarm.complete
M.prewarm_fail = prewarm.fail
M.prewarm_wait = prewarm.wait

-- The live session tuple of an id, or nil (its deadline past: gone, swept or not).
M.live = reads.live
-- A session's name outside (its handle; a raw-keyed row's digest name), what reply fields say of
-- its deadlines, and a handle's stored id (nil, why: not a handle): the operator HTTP.
M.name = access.name
M.alive = access.alive
M.is_stored = access.is_stored
M.created_at = access.created_at
M.expiry_fields = access.expiry_fields
M.handle = handles.handle
M.parse_handle = handles.parse
-- Expiry: the deletion of a due session (with its cache and its event), and the hooks a
-- create and a rotation call with each new deadline (the sweepers may sleep past it).
M.drop = ends.drop
M.set_on_deadline = create.set_on_deadline
M.set_on_rotation_deadline = rotations.set_on_deadline
-- The prewarm space's trigger that wakes its waiters on a change, local or replicated
-- (smartcache.runtime, once the space exists).
M.install_prewarm_trigger = prewarm.install_trigger

-- Refreshes written so far (reads and touches that moved a deadline): sc.stats.
function M.refreshes()
    return reads.refreshes
end

return M
