-- The event log (issue 16): every change of state that front servers must hear
-- of (a session created, ended, rotated; a device bound; products stored; a
-- bucket sent or received), written in the transaction of the change, numbered
-- by a gap-free sequence, read by cursor with a wait for the next commit.
--
-- The public surface of smartcache/events/ (the rest of the code requires this,
-- never the folder's modules: tests/unit/test_lua_layers.py):
--
--   log.lua          write, publish, read, stats: the log, its sequence, its readers
--   partitions.lua   one space per UTC day, created ahead, dropped whole after
--                    SC_EVENTS_RETENTION_DAYS by a fiber on the writable instance
local log = require('smartcache.events.log')
local partitions = require('smartcache.events.partitions')

local M = {}

-- write(topic, key, payload, always): the event of a change, inside the change's
-- transaction; its sequence, or nil when events are off (SC_EVENTS=false).
M.write = log.write
-- The partitions' fiber, and today's partition at once when writable (smartcache.runtime).
M.start = log.start
-- The partitions' space names, in day order: init.lua guards them (smartcache.quorum).
M.partitions = partitions.list

-- Procedures (registered in smartcache.api).
M.publish = log.publish
M.read = log.read
M.stats = log.stats
-- The position of a read (PROTOCOL.md 11, *Reading at a position*): the newest sequence whose transaction has
-- ended; every change a read made now does not see comes with a later sequence.
M.visible = log.visible
-- Whether changes of state write events (SC_EVENTS; a test may turn it off at run time).
function M.enabled()
    return log.enabled
end

return M
