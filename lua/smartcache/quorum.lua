-- Synchronous writes without synchronous rows at rest.
--
-- (compat.SYNC_SNAPSHOT_UNRECOVERABLE) Tarantool 2.6.0 cannot recover a snapshot that holds rows of a synchronous
-- space (tarantool#5298, fixed in 2.6.1): each such row waits in the limbo for
-- a CONFIRM that a snapshot never has, and box.cfg dies with "transaction
-- rolled back during snapshot recovery" after replication_synchro_timeout. A
-- restart after the first checkpoint, or a replica joining from a snapshot,
-- would fail.
--
-- So no data space is synchronous. One space is, sc_quorum, and it is always
-- empty: every write to a guarded space also inserts and deletes the same key
-- of sc_quorum in its own transaction (an on_replace trigger). A transaction
-- that touches a synchronous space is synchronous as a whole: it commits when a
-- quorum has it, a timeout or a ROLLBACK takes all of it back, on the leader,
-- on the followers and in recovery from the WAL (the CONFIRM/ROLLBACK rows are
-- there). Snapshots and joins see sc_quorum empty: nothing to wait for.
--
-- The trigger does nothing where the rows come from replication (the leader's
-- transaction carries its own pair of rows) and costs two small WAL rows per
-- guarded statement.
--
-- Data written by an earlier version, with is_sync on data spaces, recovers
-- too: strip_on_recovery() removes the flag from those spaces' definitions as
-- they are read (the leader then writes the definitions without it).
local fiber = require('fiber')
local log = require('log')
local util = require('smartcache.util')
local compat = require('smartcache.compat')

local M = {}

M.SPACE = 'sc_quorum'
M.KEY = 1

-- Spaces whose writes must be on a quorum before they are acknowledged: every
-- space the leader writes, the cache and prewarm spaces included, although
-- losing them only costs a reload from the core. The reason is Tarantool
-- 2.6.0's limbo (compat.ASYNC_BEHIND_SYNC_ROLLS_BACK), not their value: an asynchronous transaction committed while
-- the limbo holds synchronous ones that are already acknowledged but not yet
-- removed (their CONFIRM is being written) is queued behind them, becomes the
-- first entry once they leave, and nothing ever confirms it (an acknowledgement
-- only confirms asynchronous entries that follow a synchronous one it
-- confirms). After replication_synchro_timeout it "times out": the leader
-- writes ROLLBACK with lsn -1, which rolls back nothing on the followers, and
-- rolls back in its own memory every transaction queued behind it, those whose
-- CONFIRM is already in the WAL and on the followers included (their callers
-- get ER_WAL_IO from txn.c:876). The leader's memory then differs from its
-- followers and from its own WAL: the next event reuses a sequence number the
-- followers hold, their appliers stop on ER_TUPLE_FOUND, and the leader cannot
-- restart from its WAL either (fixed upstream in 2.6.1, txn_limbo reworked).
-- With every write of the leader synchronous, no asynchronous transaction
-- enters the limbo. DDL of our own fibers joins the rule through M.join().
M.GUARDED = {'sessions', 'device', 'idempotency', 'counters', 'registers', 'sequences', 'semaphore_holders',
             'latches', 'queue_tasks', 'sc_buckets', 'rotations', 'audit'}
if compat.ASYNC_BEHIND_SYNC_ROLLS_BACK then
    table.insert(M.GUARDED, 'cache')
    table.insert(M.GUARDED, 'prewarm')
end
-- Besides these, every events partition (smartcache.events.partitions guards its own).

M.enabled = false
local guarded_ids = {}

-- No dirty reads of a guarded key (compat.NO_MVCC_DIRTY_READS). Tarantool 2.6.0 has no MVCC: a write that
-- waits for its quorum is in the space already, and may still be rolled back.
-- A reader that saw it and then acted on it (a compare-and-set with the
-- revision it read) could match a later write that reuses that revision: the
-- fault suite lost an acknowledged register update that way. So each guarded
-- write counts its key (the primary key's first part, field 1 in every
-- guarded space) as pending until it commits or rolls back, and single-key
-- reads wait until their key has no pending write (wait_key).
local pending = {}  -- space name -> {key -> writes waiting for their quorum}
local settled = fiber.cond()
M.reads_waited = 0

-- Synchronous statements of this instance whose transaction has not ended yet.
-- A transaction's commit and rollback triggers run after it has left the limbo,
-- so while this is 0 no synchronous transaction of ours is in it.
M.inflight = 0

-- (compat.SYNC_ROLLBACK_ADMITS_NEWER) When the oldest transaction in the limbo has waited
-- replication_synchro_timeout without its quorum, 2.6.0 writes a ROLLBACK row naming its LSN and only
-- after that WAL write, in the same fiber, rolls back in memory every transaction in the limbo
-- (txn_limbo.c, txn_limbo_wait_complete). The WAL write yields; a transaction committed meanwhile
-- enters the limbo and the WAL after the ROLLBACK row, is rolled back in the leader's memory with the
-- rest, and is kept by every follower (the ROLLBACK row they applied came before it). The next event
-- then reuses its sequence number and the followers' appliers stop on ER_TUPLE_FOUND: every write
-- fails from then on (issue 35; tests/integration/test_sync_rollback.py shows it). So a new
-- synchronous statement is refused, as read-only (the service answers NOT_LEADER and retries), from
-- the moment the oldest one still in flight has waited the timeout less a margin until it has ended.
-- Tarantool's clock for the timeout (fiber_clock, the event loop's cached time) is the one
-- fiber.clock() reads, and it starts only once the write is in the WAL, so this hold always starts
-- first; the abort loop that ends a rollback runs without a yield, so the hold cannot end before it.
M.ROLLBACK_MARGIN_S = 0.25   -- the hold starts this much before the timeout, or a tenth of it if less
M.rollback_holds = 0         -- writes refused so (sc.stats, the service's metrics)
-- How a statement refused inside a transaction says so (ER_READONLY): the service tells it from a
-- read-only instance by this prefix and sends the call again to the same leader.
M.HELD_PREFIX = 'writes held:'
local started = {}           -- statement number -> fiber.clock() when it was made; nil once ended
local oldest, newest = 1, 0  -- the statement numbers in flight are among oldest..newest

-- fiber.clock() when the oldest synchronous statement still in flight was made, or nil.
local function oldest_start()
    while oldest <= newest and started[oldest] == nil do
        oldest = oldest + 1
    end
    return started[oldest]
end

-- Would a synchronous write made now risk entering the limbo during a rollback? nil, or the seconds
-- the oldest write in flight has waited.
function M.rollback_near()
    if not M.enabled then
        return nil
    end
    local t0 = oldest_start()
    if t0 == nil then
        return nil
    end
    local timeout = box.cfg.replication_synchro_timeout
    local waited = fiber.clock() - t0
    if waited >= timeout - math.min(M.ROLLBACK_MARGIN_S, timeout / 10) then
        return waited
    end
    return nil
end

-- While writes are held so (rollback_near): the seconds until the oldest write in flight reaches
-- its timeout (0 once it has: its rollback is being written), else nil. The answer of a write
-- procedure refused up front (api.lua, WRITES_HELD: the service tries again after it).
function M.rollback_left()
    if not compat.SYNC_ROLLBACK_ADMITS_NEWER then
        return nil
    end
    local waited = M.rollback_near()
    if waited == nil then
        return nil
    end
    return math.max(0, box.cfg.replication_synchro_timeout - waited)
end

local function settle(space_name, key, n)
    M.inflight = M.inflight - 1
    started[n] = nil
    if space_name == nil then
        return
    end
    local p = pending[space_name]
    local c = p[key] - 1
    if c == 0 then
        p[key] = nil
    else
        p[key] = c
    end
    settled:broadcast()
end

-- The pair of sc_quorum rows that makes the open transaction synchronous; key
-- (of space_name) is pending until the transaction ends. Raises ER_READONLY
-- while a rollback may be under way (above): then nothing of it is written.
local function synchronous(space_name, key)
    if compat.SYNC_ROLLBACK_ADMITS_NEWER then
        local waited = M.rollback_near()
        if waited ~= nil then
            M.rollback_holds = M.rollback_holds + 1
            box.error({code = box.error.READONLY, reason = string.format(
                '%s a synchronous write has waited %.2f s for its quorum and may be rolled back now '
                .. '(read-only until it ends)', M.HELD_PREFIX, waited)})
        end
    end
    local q = box.space[M.SPACE]
    q:insert({M.KEY})
    q:delete({M.KEY})
    M.inflight = M.inflight + 1
    newest = newest + 1
    local n = newest
    started[n] = fiber.clock()
    if space_name ~= nil then
        local p = pending[space_name]
        if p == nil then
            p = {}
            pending[space_name] = p
        end
        p[key] = (p[key] or 0) + 1
    end
    local function done()
        settle(space_name, key, n)
    end
    box.on_commit(done)
    box.on_rollback(done)
end

local function touch(old, new, space_name)
    if box.session.type() == 'applier' then
        return  -- replicated: the leader's transaction has its own sc_quorum rows
    end
    synchronous(space_name, (new or old)[1])
end

-- Wait until no write of key in space_name waits for its quorum (at most until
-- deadline, fiber.time() seconds; nil: twice the synchronous timeout, after
-- which a write has committed or rolled back). false when the deadline passed.
function M.wait_key(space_name, key, deadline)
    local p = pending[space_name]
    if p == nil or p[key] == nil then
        return true
    end
    M.reads_waited = M.reads_waited + 1
    deadline = deadline or (fiber.time() + 2 * box.cfg.replication_synchro_timeout)
    while p[key] ~= nil do
        local left = deadline - fiber.time()
        if left <= 0 then
            return false
        end
        settled:wait(left)
    end
    return true
end

-- Whether a write of key in space_name waits for its quorum now (what a read would see is not committed).
function M.is_pending(space_name, key)
    local p = pending[space_name]
    return p ~= nil and p[key] ~= nil
end

-- For writes our own fibers make outside the guarded spaces (the events
-- partitions' DDL): make the open transaction synchronous when a synchronous
-- transaction is in flight, so that no asynchronous transaction enters the
-- limbo (see GUARDED). When none is, the write stays asynchronous: it does not
-- enter the limbo, and needs no quorum (a partition created at the first
-- election, while the followers are still joining: on 2.6.0 a joining replica
-- fails on a CONFIRM row in its final data, "Unknown request type 40":
-- compat.JOIN_FAILS_ON_SYNCHRO_ROWS). Call it right before the commit, without
-- a yield in between.
function M.join()
    if M.enabled and compat.ASYNC_BEHIND_SYNC_ROLLS_BACK and M.inflight > 0 and box.space[M.SPACE] ~= nil then
        synchronous(nil, nil)
    end
end

-- The schema (smartcache.schema, migration 4) creates the space; this is its definition.
function M.create_space()
    local q = box.schema.space.create(M.SPACE, {is_sync = true, if_not_exists = true,
                                                 format = {{name = 'key', type = 'unsigned'}}})
    q:create_index('primary', {parts = {'key'}, if_not_exists = true})
end

-- Make every write to space s synchronous (idempotent; no-op unless enabled).
function M.guard(s)
    if not M.enabled or s == nil or guarded_ids[s.id] == s then
        return
    end
    local installed = false
    for _, t in ipairs(s:on_replace()) do
        installed = installed or t == touch
    end
    if not installed then
        s:on_replace(touch)
    end
    guarded_ids[s.id] = s
    -- A Lua trigger: util.insert / util.replace write this space through space:insert.
    util.register_lua_trigger(s)  -- compat.FFI_NO_LUA_REENTRY
end

-- Guard every listed space that exists, and more (events partitions) by name pattern.
function M.guard_all(extra_names)
    if not M.enabled then
        return 0
    end
    local n = 0
    for _, name in ipairs(M.GUARDED) do
        if box.space[name] ~= nil then
            M.guard(box.space[name])
            n = n + 1
        end
    end
    for _, name in ipairs(extra_names or {}) do
        if box.space[name] ~= nil then
            M.guard(box.space[name])
            n = n + 1
        end
    end
    return n
end

-- Guard each space created from now on whose name wanted(name) accepts, once
-- its creation commits (on the leader and, through replication, on followers).
function M.watch_new_spaces(wanted)
    box.space._space:on_replace(function(old, new)
        if old == nil and new ~= nil and M.enabled and wanted(new[3]) then
            local name = new[3]
            box.on_commit(function()
                M.guard(box.space[name])
            end)
        end
    end)
end

-- Is s guarded? (the tests and /health ask)
function M.is_guarded(s)
    if s == nil then
        return false
    end
    for _, t in ipairs(s:on_replace()) do
        if t == touch then
            return true
        end
    end
    return false
end

-- For sc.stats: on or off, the guarded spaces, and rows in sc_quorum (always 0
-- between transactions; anything else is a bug).
function M.stats()
    local names = {}
    for id in pairs(guarded_ids) do
        local now = box.space[id]
        if now ~= nil and M.is_guarded(now) then
            table.insert(names, now.name)
        end
    end
    table.sort(names)
    local q = box.space[M.SPACE]
    local keys = 0
    for _, p in pairs(pending) do
        for _ in pairs(p) do
            keys = keys + 1
        end
    end
    return {enabled = M.enabled, guarded = names, quorum_rows = q and q:len() or box.NULL, pending_keys = keys,
            reads_waited = M.reads_waited, inflight = M.inflight,
            rollback_holds = M.rollback_holds}
end

-- Turn synchronous writes on (HA with SC_SYNC). Before box.cfg: only records it.
function M.enable(on)
    M.enabled = on and true or false
end

-- Before box.cfg: drop is_sync from every user space but sc_quorum as its
-- definition is read from the snapshot, the WAL or the leader's join, so a
-- data directory of an earlier version recovers. Returns the function that
-- removes the hook (call it once box.cfg has returned).
function M.strip_on_recovery()
    local stripped = {}
    local function strip(_, new)
        if new == nil or new[1] < 512 or new[3] == M.SPACE then
            return new
        end
        local flags = new[6]
        if type(flags) ~= 'table' or flags.is_sync ~= true then
            return new
        end
        local copy = {}
        for k, v in pairs(flags) do
            copy[k] = v
        end
        copy.is_sync = nil
        stripped[new[3]] = true
        return new:update({{'=', 6, setmetatable(copy, {__serialize = 'map'})}})
    end
    box.ctl.on_schema_init(function()
        box.space._space:before_replace(strip)
    end)
    return function()
        if box.space._space ~= nil then
            pcall(box.space._space.before_replace, box.space._space, nil, strip)
        end
        local names = {}
        for name in pairs(stripped) do
            table.insert(names, name)
        end
        if #names > 0 then
            table.sort(names)
            log.warn('recovery: is_sync taken off %s (written by an earlier version; sc_quorum makes '
                .. 'their writes synchronous now)', table.concat(names, ', '))
        end
        return names
    end
end

-- is_sync off space id: by space:alter(), or where there is none (Tarantool
-- 2.6.0: compat.NO_SPACE_ALTER) by an update of its _space row.
local function sync_off(id)
    if not compat.NO_SPACE_ALTER then
        box.space[id]:alter({is_sync = false})
        return box.space[id].name
    end
    local flags = {}
    for k, v in pairs(box.space._space:get(id)[6]) do
        flags[k] = v
    end
    flags.is_sync = nil
    return box.space._space:update(id, {{'=', 6, setmetatable(flags, {__serialize = 'map'})}})[3]
end

-- On the writable instance: data spaces of an earlier version lose is_sync in
-- _space for good.
function M.clear_sync_flags()
    local ids = {}
    for _, t in box.space._space:pairs({512}, {iterator = 'GE'}) do
        if t[3] ~= M.SPACE and type(t[6]) == 'table' and t[6].is_sync == true then
            table.insert(ids, t[1])
        end
    end
    for _, id in ipairs(ids) do
        log.info('space %s: is_sync off (sc_quorum makes its writes synchronous)', sync_off(id))
    end
    return #ids
end

return M
