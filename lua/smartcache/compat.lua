-- The Tarantool version workarounds, in one place (after tarantool/queue's
-- compat.lua): each has a name, a reason, the upstream issue where one is
-- known, where it is applied, the test that fails without it, and the release
-- that made it unnecessary. At load every name becomes a flag of this module,
-- true while the running Tarantool (_TARANTOOL) still needs the workaround;
-- the code tests the flag by name where it applies (compat.NAME), and
-- sc.stats lists the active ones (`workarounds`).
--
-- We run Debian's 2.6.0 (docker/tarantool.Dockerfile), which needs every one.
-- A workaround whose fix is not in a release we know of (fixed_in = nil)
-- stays on for every version: take it off only after its test passes without
-- it on the new version. lua/README.md (Tarantool 2.6.0 workarounds) is the
-- same table for readers.
local M = {}

-- "2.6.0-0-g47aa4e01e", "2.11.1", "3.2.0-entrypoint-12-g..." -> {2, 6, 0}; nil when it does not parse.
function M.parse(version)
    local major, minor, patch = tostring(version or ''):match('^(%d+)%.(%d+)%.(%d+)')
    if major == nil then
        return nil
    end
    return {tonumber(major), tonumber(minor), tonumber(patch)}
end

-- a < b, both {major, minor, patch}.
local function older(a, b)
    for i = 1, 3 do
        if a[i] ~= b[i] then
            return a[i] < b[i]
        end
    end
    return false
end

-- Does version v (parsed) have the fix? fixed_in lists the first fixed release
-- of each series it went into, oldest first: a release of one of those series
-- has it from that patch on, and every series after the newest has it.
function M.has_fix(v, fixed_in)
    if v == nil or fixed_in == nil then
        return false
    end
    local newest = fixed_in[#fixed_in]
    for _, f in ipairs(fixed_in) do
        if v[1] == f[1] and v[2] == f[2] then
            return not older(v, f)
        end
    end
    return not older(v, newest)
end

-- The workarounds. `where`: the code that applies it; `test`: what fails without it.
M.WORKAROUNDS = {
    {
        name = 'SYNC_SNAPSHOT_UNRECOVERABLE',
        why = 'a snapshot holding rows of a synchronous space does not recover (every row waits for a '
            .. 'CONFIRM no snapshot has): no data space is is_sync, one always-empty sc_quorum space is',
        issue = 'tarantool#5298', fixed_in = {{2, 6, 1}},
        where = 'quorum.lua (sc_quorum, strip_on_recovery), schema.lua (migration 4)',
        test = 'tests/integration/test_snapshot_recovery.py',
    },
    {
        name = 'ASYNC_BEHIND_SYNC_ROLLS_BACK',
        why = 'an asynchronous transaction queued in the limbo behind synchronous ones is never confirmed; '
            .. 'its timeout rolls back, in the leader\'s memory only, every transaction behind it: every '
            .. 'write of the leader is made synchronous (cache and prewarm too, DDL of our fibers by join)',
        issue = nil, fixed_in = nil,
        where = 'quorum.lua (GUARDED, join), events/partitions.lua, failover/box_adapter.lua (probe, disk_check), '
            .. 'sessions/cache.lua (a delete of a missing key is a WAL row no trigger sees: read first); '
            .. 'service/smartcache/server/storage/instances.py maybe_applied '
            .. '(ER_WAL_IO of an HA leader: outcome unknown)',
        test = 'tests/integration/test_limbo.py; tests/lua/quorum_test.lua (a write that finds nothing writes '
            .. 'no WAL row); the fault suite (load-fuzz-mix)',
    },
    {
        name = 'SYNC_ROLLBACK_ADMITS_NEWER',
        why = 'a synchronous timeout writes its ROLLBACK row and only then rolls back the limbo in memory; '
            .. 'a write committed during that WAL write lands after the row, is rolled back on the leader '
            .. 'only and kept by the followers, whose appliers then stop on the next event (ER_TUPLE_FOUND): '
            .. 'new synchronous writes are refused as read-only while the oldest one nears its timeout',
        issue = nil, fixed_in = {{2, 6, 1}},  -- 'txn_limbo: introduce cascading rollback' (is_in_rollback)
        where = 'quorum.lua (rollback_near, synchronous)',
        test = 'tests/integration/test_sync_rollback.py (the control diverges the replica, the hold does not)',
    },
    {
        name = 'JOIN_FAILS_ON_SYNCHRO_ROWS',
        why = 'a CONFIRM or ROLLBACK row in the final stage of a join kills the joining instance '
            .. '("Unknown request type 40"): the joiner asks the leader to hold writes (sc.join_hold)',
        issue = 'tarantool#5566', fixed_in = nil,
        where = 'init.lua (hold_leader_for_join), failover/join_hold.lua, quorum.lua (join)',
        test = 'tests/integration/test_snapshot_recovery.py (join under load), tests/lua/failover_test.lua',
    },
    {
        name = 'QUORUM_EXTRA_ACKS_STALL',
        why = 'with more replicas acknowledging than the quorum needs, about 2 % of synchronous writes '
            .. 'stall for replication_synchro_timeout and roll back: the quorum counts every attached follower '
            .. 'that acknowledges (one that stopped for SC_SLOW_FOLLOWER_MS leaves it, never below the '
            .. 'configured quorum; lowering the quorum confirms the writes already waiting)',
        issue = 'tarantool#5144, #5185, #5195', fixed_in = nil,
        where = 'failover/sync_quorum.lua (quorum_for, acknowledging)',
        test = 'tests/lua/failover_test.lua (quorum counts every attached follower; one that stops '
            .. 'acknowledging leaves it); tests/integration/test_failover_dcs.py; the fault suite',
    },
    {
        name = 'QUORUM_RAISE_DROPS_PENDING',
        why = 'writes waiting in the limbo when the quorum goes up are not confirmed by the acknowledgements '
            .. 'they had and roll back on the leader only: the quorum goes up once the limbo has drained',
        issue = nil, fixed_in = nil,
        where = 'failover/sync_quorum.lua (raise_quorum)',
        test = 'tests/lua/failover_test.lua (the quorum goes up only once the limbo has drained); the fault suite',
    },
    {
        name = 'CLEAR_SYNCHRO_QUEUE_WAITS',
        why = 'box.ctl.clear_synchro_queue() first waits 2 x replication_synchro_timeout for another '
            .. 'instance to empty the queue: a new leader calls it with the timeout at 1 ms',
        issue = 'tarantool#5435', fixed_in = {{2, 6, 2}, {2, 7, 1}},
        where = 'failover/box_adapter.lua (clear_synchro_queue)',
        test = 'tests/integration/test_failover_storage.py (a new leader writes within TTL + 2 s)',
    },
    {
        name = 'NO_MVCC_DIRTY_READS',
        why = 'no MVCC: a write waiting for its quorum is visible and may still roll back; single-key '
            .. 'reads and keyed writes wait for their key, event readers stop before the oldest unsettled event',
        issue = nil, fixed_in = nil,  -- memtx_use_mvcc_engine (2.6.1) with read-confirmed (2.10); not configured
        where = 'quorum.lua (pending keys, wait_key), api.lua (WRITE_PENDING), api/reads.lua and api/writes.lua '
            .. '(KEYED), events/log.lua (visible)',
        test = 'tests/integration/test_storage_answers.py (no dirty read), test_coordination_failover.py',
    },
    {
        name = 'APPLIER_STAYS_STOPPED',
        why = 'an applier stopped by an error (a full disk, a row it cannot apply) never retries: a '
            .. 'follower reconnects it every 5 s and reports it',
        issue = 'tarantool#13134', fixed_in = nil,
        where = 'failover/watch.lua (watch_upstream), runtime.lua (health)',
        test = 'tests/lua/failover_test.lua (a follower whose applier stopped reconnects it)',
    },
    {
        name = 'WAL_FAILURE_CRASH',
        why = 'a synchronous write failing in the WAL under concurrent load crashed the instance (SIGSEGV in '
            .. 'txn_free): a leader steps down on low free space, before writes fail',
        issue = nil, fixed_in = nil,
        where = 'failover/watch.lua (check_disk), disk.lua',
        test = 'tests/lua/failover_test.lua (a WAL disk that runs out of room); the fault suite (disk-full)',
    },
    {
        name = 'NO_BOX_INFO_SYNCHRO',
        why = 'box.info.synchro does not exist: sc.role answers sync_queue_len = null',
        issue = 'tarantool#5191', fixed_in = {{2, 7, 3}, {2, 10, 0}},  -- 2.8/2.9 not checked: null there
        where = 'failover/procedures.lua (role)',
        test = 'tests/lua/compat_test.lua',
    },
    {
        name = 'NO_SPACE_ALTER',
        why = 'space:alter() does not exist: is_sync comes off a data space of an earlier version by an '
            .. 'update of _space',
        issue = nil, fixed_in = {{2, 5, 2}, {2, 6, 1}},
        where = 'quorum.lua (clear_sync_flags)',
        test = 'tests/integration/test_snapshot_recovery.py (data written by an earlier version)',
    },
    {
        name = 'LUA_TRIGGER_COSTS_A_COROUTINE',
        why = 'each run of a Lua transaction trigger costs a coroutine (0.6 us, 500 bytes of garbage): '
            .. 'util.atomic reports the end of its transactions to the event log itself',
        issue = nil, fixed_in = nil,
        where = 'util.lua (atomic), events/log.lua (track)',
        test = 'none that fails: the session bench (a write with its event cost twice the CPU)',
    },
    {
        name = 'UUID_STR_READS_URANDOM',
        why = 'uuid.str() reads /dev/urandom for every uuid (0.52 us against 0.12): util.uuid reads it '
            .. '4 KiB at a time',
        issue = 'tarantool#3697', fixed_in = nil,
        where = 'util.lua (uuid)',
        test = 'none that fails: the session bench',
    },
    {
        name = 'FFI_NO_LUA_REENTRY',
        why = 'LuaJIT does not allow Lua -> FFI -> C -> Lua: the box C API through FFI (util.insert, '
            .. 'util.replace) only inside a transaction and on spaces without a Lua trigger',
        issue = 'tarantool#4427', fixed_in = nil,  -- a LuaJIT rule, not a bug of one release
        where = 'util.lua (insert, replace), quorum.lua (guard registers its spaces)',
        test = 'tests/lua/sessions_test.lua (hot loops with a Lua trigger), tests/lua/quorum_test.lua',
    },
}

-- {NAME = true while version still needs it}; a version that does not parse needs all.
function M.flags_for(version)
    local v = M.parse(version)
    local flags = {}
    for _, w in ipairs(M.WORKAROUNDS) do
        flags[w.name] = not M.has_fix(v, w.fixed_in)
    end
    return flags
end

M.VERSION = rawget(_G, '_TARANTOOL')  -- Tarantool's own global: "2.6.0-0-g47aa4e01e"
for name, on in pairs(M.flags_for(M.VERSION)) do
    M[name] = on
end

-- The names of the workarounds on for this Tarantool, in table order (sc.stats).
function M.active()
    local out = {}
    for _, w in ipairs(M.WORKAROUNDS) do
        if M[w.name] then
            table.insert(out, w.name)
        end
    end
    return out
end

return M
