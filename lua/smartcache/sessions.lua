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
--
-- The public surface of smartcache/sessions/ (the rest of the code requires
-- this, never the folder's modules: tests/unit/test_lua_layers.py):
--
--   create.lua   create: the per-client limit, the ids (version 8 in a sharded cluster)
--   reads.lua    get, touch (the sliding deadline), locate, list
--   update.lua   update (compare-and-set, attribute merges), rotate
--   ends.lua     delete, delete_client (log out everywhere), drop (expiry's too)
--   cache.lua    a session's cache entries (and a global namespace), lossy under memory pressure
--   device.lua   device bindings: a device id -> the client it belongs to
--   prewarm.lua  client data fetched before login: one fetcher (a lease), the others wait
local create = require('smartcache.sessions.create')
local reads = require('smartcache.sessions.reads')
local update = require('smartcache.sessions.update')
local ends = require('smartcache.sessions.ends')
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
M.rotate = update.rotate
M.delete = ends.delete
M.delete_client = ends.delete_client
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
-- Expiry: the deletion of a due session (with its cache and its event), and the hook a
-- create calls with each new deadline (the sweeper may sleep past it).
M.drop = ends.drop
M.set_on_deadline = create.set_on_deadline
-- The prewarm space's trigger that wakes its waiters on a change, local or replicated
-- (smartcache.runtime, once the space exists).
M.install_prewarm_trigger = prewarm.install_trigger

-- Refreshes written so far (reads and touches that moved a deadline): sc.stats.
function M.refreshes()
    return reads.refreshes
end

return M
