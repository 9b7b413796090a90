-- Coordination primitives (issue 17): what a cluster of front servers needs
-- beside its sessions, as Apache Ignite builds them on its cache, here as
-- stored procedures that each run in one transaction.
--
-- The public surface of smartcache/coordination/ (the rest of the code requires
-- this, never the folder's modules: tests/unit/test_lua_layers.py):
--
--   atomics.lua      counters (add with bounds and TTL, compare-and-set),
--                    registers (msgpack value, compare-and-set by revision
--                    or value), sequences (id ranges)
--   semaphores.lua   semaphores and locks with leases and fencing tokens;
--                    acquire waits in FIFO order on a fiber.cond
--   latches.lua      count-down latches; await is woken by the change,
--                    local or replicated
--   queues.lua       task queues: ready/taken/delayed, time-to-run, one
--                    fiber for every timeout (after tarantool/queue's fifottl)
--   waitlist.lua     fibers waiting per key in FIFO order (woken, never polling)
--   common.lua       what they share: limits, checks, the wait budget
--
-- smartcache.runtime installs their triggers and starts the queues' fiber
-- (install, start), smartcache.stats reports their counters (stats).
local atomics = require('smartcache.coordination.atomics')
local semaphores = require('smartcache.coordination.semaphores')
local latches = require('smartcache.coordination.latches')
local queues = require('smartcache.coordination.queues')

local M = {}

-- Procedures (registered in smartcache.api).
M.counter_get = atomics.counter_get
M.counter_add = atomics.counter_add
M.counter_cas = atomics.counter_cas
M.register_get = atomics.register_get
M.register_cas = atomics.register_cas
M.sequence_reserve = atomics.sequence_reserve
M.sequence_get = atomics.sequence_get
M.semaphore_acquire = semaphores.acquire
M.semaphore_release = semaphores.release
M.semaphore_renew = semaphores.renew
M.semaphore_get = semaphores.get
M.latch_create = latches.create
M.latch_count_down = latches.count_down
M.latch_await = latches.await
M.latch_get = latches.get
M.queue_put = queues.put
M.queue_take = queues.take
M.queue_ack = queues.ack
M.queue_release = queues.release
M.queue_stats = queues.stats

-- The triggers that wake waiters on a change, local or replicated (once the spaces exist).
function M.install()
    semaphores.install()
    latches.install()
    queues.install()
end

-- The queues' timeout fiber.
M.start = queues.start

-- Waiters right now on this instance, and what ran out (sc.stats, /metrics).
function M.stats()
    return {
        semaphore_waiters = semaphores.waiters:total(),
        latch_waiters = latches.waiters:total(),
        queue_waiters = queues.waiters:total(),
        leases_expired = semaphores.expired,
        tasks_ttr_returned = queues.counters.ttr_returned,
        tasks_expired = queues.counters.expired,
        tasks_delay_ended = queues.counters.delay_ended,
    }
end

return M
