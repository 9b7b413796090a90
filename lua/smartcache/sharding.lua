-- Sharding: which of a sharded cluster's buckets a key belongs to, whether this
-- shard serves it, and the moves of buckets between shards (online resharding).
-- docs/design/sharding.md and docs/design/resharding.md are the design.
--
-- The public surface of smartcache/sharding/ (the rest of the code requires
-- this, never the folder's modules: tests/unit/test_lua_layers.py):
--
--   buckets.lua   a key's bucket (CRC-32C), the bucket a session id carries, the
--                 refusal of a call whose bucket is not active here, the stamping
--                 triggers that keep every row's bucket and fence a moving one,
--                 sc.buckets_init
--   moves.lua     sc.bucket_* and sc.buckets_held: each a checked transition of
--                 one bucket's row, driven by the operator and every settler
--   transitions.lua  the moves' state machine as data: EDGES (every change a
--                 row may go through), STEPS (the one-transaction transitions)
--   rows.lua      a bucket's rows as a move handles them: counted, paged,
--                 written a chunk at a time, deleted while the row's mark holds
--   consts.lua    the states of a bucket's row (BUCKET.ACTIVE ...)
local consts = require('smartcache.sharding.consts')
local buckets = require('smartcache.sharding.buckets')
local moves = require('smartcache.sharding.moves')

local M = {}

-- The states of a bucket's row in sc_buckets (BUCKET.ACTIVE ...).
M.BUCKET = consts.BUCKET

-- The bucket count of a sharded cluster, or nil: not sharded.
M.count = buckets.count
-- The bucket of a routing key among count buckets; the bucket a session id carries (nil for
-- a version 4 id); a version 8 id carrying a bucket; the bucket of a row of a sharded space.
M.of = buckets.of
M.of_session = buckets.of_session
M.session_id = buckets.session_id
M.of_row = buckets.of_row
-- nil when this shard may serve a call on (kind, value), else its WRONG_BUCKET or
-- BUCKET_MOVING answer (smartcache.api asks before every routed procedure).
M.refusal = buckets.refusal
-- Whether this shard serves the bucket of a row: the background fibers ask before they change one.
M.serves_row = buckets.serves_row
-- The stamping triggers, once the cluster is sharded (smartcache.runtime, at start).
M.install = buckets.install
-- fn(match) wakes the fibers waiting on objects of a bucket that begins to move (match(key):
-- the key is of it); the rooms that keep waiters register at load.
M.on_moving = moves.on_moving

-- Procedures (registered in smartcache.api).
M.buckets_init = buckets.init
M.buckets_held = moves.held
M.bucket_state = moves.state
M.bucket_rows = moves.rows
M.bucket_send_start = moves.send_start
M.bucket_send_abort = moves.send_abort
M.bucket_send_done = moves.send_done
M.bucket_gc = moves.gc
M.bucket_recv_start = moves.recv_start
M.bucket_recv = moves.recv
M.bucket_recv_done = moves.recv_done
M.bucket_recv_abort = moves.recv_abort

return M
