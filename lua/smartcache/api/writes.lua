-- The writes the service calls (registered by smartcache.api): procedures that
-- change data, and the procedures that may wait before they answer. A write is
-- wrapped so that it does nothing past its deadline, answers NOT_LEADER where this
-- instance may not write, WRONG_BUCKET or BUCKET_MOVING for a bucket not served
-- here, WRITES_HELD while a synchronous rollback may be under way, and runs once
-- per idempotency key.
local sessions = require('smartcache.sessions')
local coordination = require('smartcache.coordination')
local events = require('smartcache.events')

local M = {}

-- Procedures that change data. Their answers may be stored under an idempotency key.
local writes = {
    session_create = sessions.create,
    session_touch = sessions.touch,
    session_update = sessions.update,
    session_delete = sessions.delete,
    session_rotate = sessions.rotate,
    session_rekey = sessions.rekey,  -- the migration of raw-keyed rows (the service's lazy rekey, the CLI's)
    session_key_check = sessions.key_check,  -- every service instance at start: one key for the cluster
    cache_put = sessions.cache_put,
    cache_delete = sessions.cache_delete,
    device_bind = sessions.device_bind,
    prewarm_acquire = sessions.prewarm_acquire,
    prewarm_complete = sessions.prewarm_complete,
    prewarm_fail = sessions.prewarm_fail,
    counter_add = coordination.counter_add,
    counter_cas = coordination.counter_cas,
    register_cas = coordination.register_cas,
    sequence_reserve = coordination.sequence_reserve,
    semaphore_release = coordination.semaphore_release,
    semaphore_renew = coordination.semaphore_renew,
    latch_create = coordination.latch_create,
    latch_count_down = coordination.latch_count_down,
    queue_put = coordination.queue_put,
    queue_ack = coordination.queue_ack,
    queue_release = coordination.queue_release,
    event_publish = events.publish,
}
M.procedures = writes

-- Writes whose answer reads the key's current state (a compare-and-set's CONFLICT, a NOT_FOUND, the
-- value a counter reaches), by the space whose key is the first argument. Like the keyed reads they
-- wait until their key has no pending write (compat.NO_MVCC_DIRTY_READS): a CONFLICT answered against
-- a write that then rolled back names a revision that never existed (the fault suite's linearizability
-- check found one in partition-leader-followers). A write on top of a pending one needs no wait to be
-- right (it would roll back with it), only the answers that refuse need it; waiting for all keeps it
-- simple, and costs a write only the pending one's quorum wait.
M.KEYED = {session_update = 'sessions', session_touch = 'sessions', session_delete = 'sessions',
           session_rotate = 'sessions', session_create = 'sessions', session_rekey = 'sessions',
           counter_add = 'counters',
           counter_cas = 'counters', register_cas = 'registers', sequence_reserve = 'sequences',
           latch_create = 'latches', latch_count_down = 'latches', device_bind = 'device',
           semaphore_release = 'semaphore_holders', semaphore_renew = 'semaphore_holders'}

-- Procedures that may wait (on a fiber.cond, outside any transaction) before
-- they answer. They get the call's deadline (ms, or nil) and idempotency key
-- (or nil) first, grant nothing after the deadline, check util.writable()
-- themselves before writing and write in short transactions of their own.
-- Not in `writes`: a yield inside the idempotency wrapper's transaction would
-- abort it; each says what a repeat does (the holder of an acquire, the key
-- of a take).
M.waits = {
    semaphore_acquire = coordination.semaphore_acquire,
    latch_await = coordination.latch_await,
    queue_take = coordination.queue_take,
    -- Writes in several transactions (batches), each checking util.writable(); the key is stored with the last.
    session_delete_client = sessions.delete_client,
    events_read = events.read,  -- a read that waits for the next commit; NOT_LEADER off the writable instance
}

return M
