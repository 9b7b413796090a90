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
local create = require('smartcache.sessions.create')
local reads = require('smartcache.sessions.reads')
local update = require('smartcache.sessions.update')
local ends = require('smartcache.sessions.ends')

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

-- The live session tuple of an id, or nil (its deadline past: gone, swept or not).
M.live = reads.live
-- Expiry: the deletion of a due session (with its cache and its event), and the hook a
-- create calls with each new deadline (the sweeper may sleep past it).
M.drop = ends.drop
M.set_on_deadline = create.set_on_deadline

-- Refreshes written so far (reads and touches that moved a deadline): sc.stats.
function M.refreshes()
    return reads.refreshes
end

return M
