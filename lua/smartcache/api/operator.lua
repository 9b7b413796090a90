-- The operators' procedures (registered by smartcache.api): smartcache-cli cluster
-- and the console change the cluster with them, the service never needs them,
-- except the moves of buckets, which every service instance's settler drives too
-- (api.lua's OPERATOR_ONLY and OPERATOR_TOO say who may call which). Each is
-- about this instance or its shard as a whole (no route, no idempotency key):
-- each checks its own preconditions (the leader, a compare-and-set of a bucket's
-- row) and says what a repeat does. They are wrapped as reads are: past its
-- deadline one does nothing, and a WAL or memory failure is counted.
local failover = require('smartcache.failover')
local sharding = require('smartcache.sharding')
local sessions = require('smartcache.sessions')
local digest = require('smartcache.digest')
local audit = require('smartcache.audit')

local M = {}

M.procedures = {
    -- Failover (smartcache.failover): the operator's actions.
    switchover = failover.switchover,
    rejoin = failover.rejoin,
    join_hold = failover.join_hold,  -- asked by an instance about to join (the replication user may call it)
    -- Membership as data in etcd (smartcache.failover.membership): the leader changes it.
    topology_init = failover.topology_init,
    topology_add = failover.topology_add,
    topology_remove = failover.topology_remove,
    -- Sharding: a shard takes its buckets (the operator, at cluster init --shards).
    buckets_init = sharding.buckets_init,
    -- Moves of buckets between shards (smartcache.sharding): each a checked transition of one bucket,
    -- driven by the operator's command and by every service instance's settler.
    buckets_held = sharding.buckets_held,
    bucket_state = sharding.bucket_state,
    bucket_rows = sharding.bucket_rows,
    bucket_send_start = sharding.bucket_send_start,
    bucket_send_abort = sharding.bucket_send_abort,
    bucket_send_done = sharding.bucket_send_done,
    bucket_gc = sharding.bucket_gc,
    bucket_recv_start = sharding.bucket_recv_start,
    bucket_recv = sharding.bucket_recv,
    bucket_recv_done = sharding.bucket_recv_done,
    bucket_recv_abort = sharding.bucket_recv_abort,
    digest = digest.digest,  -- this instance's data, space by space (compare a follower with the leader)
    -- The audit log (smartcache.audit): what operators did; a write checks util.writable() itself.
    audit_write = audit.write,
    audit_read = audit.read,
    -- The raw-keyed sessions of before revision 11, a page at a time (the CLI's sessions-rekey).
    sessions_page = sessions.page,
}

return M
