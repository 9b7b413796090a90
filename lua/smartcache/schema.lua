-- Spaces, indexes and their versioned, idempotent upgrades.
--
-- Each space's format is declared once (M.FORMAT); the tuple positions
-- (M.F.<space>.<field>) are derived from it. Run `upgrade()` on the writable
-- instance only: the others receive the schema through replication.
local log = require('log')
local quorum = require('smartcache.quorum')

local M = {}

-- Bump when a migration is added; stored in space sc_meta under 'schema_version'.
M.VERSION = 9

M.FORMAT = {
    sc_meta = {
        {name = 'key', type = 'string'},
        {name = 'value', type = 'any'},
    },
    -- Version 6: the buckets this shard holds, in a sharded cluster (smartcache.sharding.buckets;
    -- empty: not sharded, every key is here). status: active | sending | sent |
    -- receiving | garbage (the moves of docs/design/sharding.md); generation is raised
    -- when a move starts; peer: the other shard of a move (where a sent bucket went).
    sc_buckets = {
        {name = 'id', type = 'unsigned'},
        {name = 'status', type = 'string'},
        {name = 'generation', type = 'unsigned'},
        {name = 'peer', type = 'string', is_nullable = true},
        -- Version 8: when the bucket entered its status, or a move last made progress (ms since
        -- epoch): the settler gives up a move that has made none for a while (smartcache.sharding.moves).
        {name = 'since', type = 'unsigned', is_nullable = true},
    },
    sessions = {
        {name = 'id', type = 'string'},            -- canonical UUID text
        {name = 'client_id', type = 'string'},
        {name = 'version', type = 'string'},       -- front service version, as given
        {name = 'rev', type = 'unsigned'},         -- 1, +1 per update (compare-and-set)
        {name = 'updated_at', type = 'unsigned'},  -- ms since epoch
        {name = 'ttl_ms', type = 'unsigned'},
        {name = 'expires_at', type = 'unsigned'},  -- updated_at + ttl_ms: sliding deadline
        {name = 'data', type = 'any', is_nullable = true},
        -- Version 5: when it was created (ms since epoch; kept by a rotation), and the device the
        -- front server named at create ("where you are logged in"). Absent in older tuples.
        {name = 'created_at', type = 'unsigned', is_nullable = true},
        {name = 'device', type = 'string', is_nullable = true},
        {name = 'bucket', type = 'unsigned', is_nullable = true},  -- version 7 (smartcache.sharding.buckets)
        -- Version 9 (issue 37): the absolute deadline (ms since epoch; no refresh passes it: expires_at <=
        -- absolute_at), the SHA-256 (hex) of the binding the session was created with (never the value),
        -- and whether the id is a stored id (derived by the service from the client's raw id; absent: a raw
        -- id of a row written before, which has no handle until it is rekeyed). Absent in older tuples: a
        -- session of before gets created_at + SC_SESSION_MAX_LIFETIME_S at its next write.
        {name = 'absolute_at', type = 'unsigned', is_nullable = true},
        {name = 'binding', type = 'string', is_nullable = true},
        {name = 'stored', type = 'boolean', is_nullable = true},
    },
    -- Version 9: the old ids of rotated sessions during their grace window (smartcache.sessions.rotations):
    -- a read by old_id answers new_id's session until expires_at, then the row is swept.
    rotations = {
        {name = 'old_id', type = 'string'},
        {name = 'new_id', type = 'string'},
        {name = 'expires_at', type = 'unsigned'},  -- the end of the grace window, ms since epoch
        {name = 'bucket', type = 'unsigned', is_nullable = true},  -- (smartcache.sharding.buckets)
    },
    -- Version 9: the operators' audit log (smartcache.audit), append-only; entries go after
    -- SC_AUDIT_RETENTION_DAYS (never the newest).
    audit = {
        {name = 'seq', type = 'unsigned'},         -- 1, 2, ... gap-free on this replica set
        {name = 'time_ms', type = 'unsigned'},     -- ms since epoch, this instance's clock
        {name = 'who', type = 'string'},           -- a token id, a CURVE key (z85), user@host
        {name = 'action', type = 'string'},        -- e.g. console.reveal, cluster.switchover
        {name = 'target', type = 'string'},        -- what it acted on ('' none)
        {name = 'reason', type = 'string'},        -- what the operator typed ('' none)
        {name = 'details', type = 'any', is_nullable = true},  -- a map, or nil
    },
    cache = {
        {name = 'session_id', type = 'string'},    -- '' = global namespace
        {name = 'key', type = 'string'},
        {name = 'data_type', type = 'integer'},
        {name = 'updated_at', type = 'unsigned'},
        {name = 'ttl_ms', type = 'unsigned'},
        {name = 'expires_at', type = 'unsigned'},
        {name = 'data', type = 'any', is_nullable = true},
        {name = 'bucket', type = 'unsigned', is_nullable = true},  -- version 7 (smartcache.sharding.buckets)
    },
    device = {
        {name = 'device_id', type = 'string'},
        {name = 'client_id', type = 'string'},
        {name = 'updated_at', type = 'unsigned'},
        {name = 'bucket', type = 'unsigned', is_nullable = true},  -- version 7 (smartcache.sharding.buckets)
    },
    prewarm = {
        {name = 'client_id', type = 'string'},
        {name = 'data_type', type = 'integer'},
        {name = 'session_id', type = 'string'},
        {name = 'version', type = 'string'},
        {name = 'updated_at', type = 'unsigned'},  -- when data was last stored (0 = never)
        {name = 'state', type = 'string'},         -- 'idle' | 'updating'
        {name = 'owner', type = 'string'},         -- lease holder while updating, '' when idle
        {name = 'lease_until', type = 'unsigned'}, -- ms; an expired lease counts as free
        {name = 'expires_at', type = 'unsigned'},  -- record retention deadline
        {name = 'data', type = 'any', is_nullable = true},
        {name = 'bucket', type = 'unsigned', is_nullable = true},  -- version 7 (smartcache.sharding.buckets)
    },
    -- A write done under an idempotency key, with its result (smartcache.idempotency).
    idempotency = {
        {name = 'key', type = 'string'},           -- the client's idempotency_key
        {name = 'procedure', type = 'string'},     -- what it was used for
        {name = 'fingerprint', type = 'string'},   -- digest of the arguments
        {name = 'expires_at', type = 'unsigned'},  -- ms; swept after this
        {name = 'result', type = 'any'},           -- the procedure's answer, returned on a repeat
    },
    -- Coordination primitives (smartcache.coordination). NEVER (2^46 ms) = no deadline.
    counters = {
        {name = 'name', type = 'string'},
        {name = 'value', type = 'integer'},        -- |value| <= 2^53 - 1
        {name = 'rev', type = 'unsigned'},         -- 1 at create, +1 per change
        {name = 'updated_at', type = 'unsigned'},
        {name = 'expires_at', type = 'unsigned'},  -- creation + ttl (a fixed window), or NEVER
        {name = 'bucket', type = 'unsigned', is_nullable = true},  -- version 7 (smartcache.sharding.buckets)
    },
    registers = {
        {name = 'name', type = 'string'},
        {name = 'rev', type = 'unsigned'},         -- 1 at create, +1 per write
        {name = 'updated_at', type = 'unsigned'},
        {name = 'expires_at', type = 'unsigned'},  -- last write + its ttl, or NEVER
        {name = 'value', type = 'any'},
        {name = 'bucket', type = 'unsigned', is_nullable = true},  -- version 7 (smartcache.sharding.buckets)
    },
    sequences = {
        {name = 'name', type = 'string'},
        {name = 'next', type = 'unsigned'},        -- first id not handed out yet
        {name = 'updated_at', type = 'unsigned'},
        {name = 'bucket', type = 'unsigned', is_nullable = true},  -- version 7 (smartcache.sharding.buckets)
    },
    semaphore_holders = {
        {name = 'name', type = 'string'},          -- the semaphore (or lock)
        {name = 'holder', type = 'string'},        -- chosen by the caller, unique per acquirer
        {name = 'token', type = 'unsigned'},       -- fencing token (sequence sc_fence)
        {name = 'permits', type = 'unsigned'},     -- the semaphore's size, as this holder gave it
        {name = 'acquired_at', type = 'unsigned'},
        {name = 'lease_until', type = 'unsigned'}, -- the permit is free from then on
        {name = 'bucket', type = 'unsigned', is_nullable = true},  -- version 7 (smartcache.sharding.buckets)
    },
    latches = {
        {name = 'name', type = 'string'},
        {name = 'count', type = 'unsigned'},       -- 0: open
        {name = 'initial', type = 'unsigned'},
        {name = 'created_at', type = 'unsigned'},
        {name = 'expires_at', type = 'unsigned'},
        {name = 'bucket', type = 'unsigned', is_nullable = true},  -- version 7 (smartcache.sharding.buckets)
    },
    queue_tasks = {
        {name = 'id', type = 'unsigned'},          -- sequence sc_task_id, across queues
        {name = 'queue', type = 'string'},
        {name = 'state', type = 'string'},         -- ready | taken | delayed (done = deleted)
        {name = 'priority', type = 'unsigned'},    -- 0 first; FIFO within a priority
        {name = 'next_event', type = 'unsigned'},  -- ready: expires_at; taken: end of ttr; delayed: end of delay
        {name = 'expires_at', type = 'unsigned'},  -- TTL deadline, or NEVER
        {name = 'created_at', type = 'unsigned'},
        {name = 'attempt', type = 'unsigned'},     -- times taken
        {name = 'ttr_ms', type = 'unsigned'},      -- time-to-run of the last take
        {name = 'taken_key', type = 'string'},     -- idempotency key of the current take, or ''
        {name = 'payload', type = 'any', is_nullable = true},
        {name = 'bucket', type = 'unsigned', is_nullable = true},  -- version 7 (smartcache.sharding.buckets)
    },
}

-- The spaces whose rows live in a bucket (a sharded cluster's; smartcache.sharding.buckets
-- says by which key). Each row records its bucket (the last field, version 7),
-- indexed, for the moves of buckets between shards. The others are the shard's
-- own: sc_meta, sc_buckets, idempotency (its keys live in the shard of their
-- write), the event log (one per shard) and sc_quorum.
M.SHARDED = {'sessions', 'cache', 'device', 'prewarm', 'counters', 'registers', 'sequences',
             'semaphore_holders', 'latches', 'queue_tasks', 'rotations'}

-- Tuple positions by field name, from the formats above.
M.F = {}
for space, format in pairs(M.FORMAT) do
    M.F[space] = {}
    for i, f in ipairs(format) do
        M.F[space][f.name] = i
    end
end

local function space(name)
    return box.schema.space.create(name, {if_not_exists = true, format = M.FORMAT[name]})
end

local migrations = {}

-- Version 1: the four spaces of the brief plus the meta space.
migrations[1] = function()
    space('sc_meta'):create_index('primary', {parts = {'key'}, if_not_exists = true})

    local sessions = space('sessions')
    sessions:create_index('primary', {parts = {'id'}, if_not_exists = true})
    sessions:create_index('by_client', {parts = {'client_id', 'id'}, if_not_exists = true})
    sessions:create_index('by_deadline', {parts = {'expires_at', 'id'}, if_not_exists = true})

    local cache = space('cache')
    -- Primary (session_id, key) doubles as the by-session index (prefix).
    cache:create_index('primary', {parts = {'session_id', 'key'}, if_not_exists = true})
    cache:create_index('by_deadline', {parts = {'expires_at', 'session_id', 'key'}, if_not_exists = true})

    local device = space('device')
    device:create_index('primary', {parts = {'device_id'}, if_not_exists = true})
    device:create_index('by_client', {parts = {'client_id', 'device_id'}, if_not_exists = true})

    local prewarm = space('prewarm')
    prewarm:create_index('primary', {parts = {'client_id', 'data_type'}, if_not_exists = true})
    prewarm:create_index('by_deadline', {parts = {'expires_at', 'client_id', 'data_type'}, if_not_exists = true})
end

-- Version 2: idempotency keys (safe retries of writes).
migrations[2] = function()
    local idem = space('idempotency')
    idem:create_index('primary', {parts = {'key'}, if_not_exists = true})
    idem:create_index('by_deadline', {parts = {'expires_at', 'key'}, if_not_exists = true})
end

-- Version 3: coordination primitives (counters, registers, sequences, semaphores, latches, queues).
migrations[3] = function()
    for _, name in ipairs({'counters', 'registers', 'latches'}) do
        local s = space(name)
        s:create_index('primary', {parts = {'name'}, if_not_exists = true})
        s:create_index('by_deadline', {parts = {'expires_at', 'name'}, if_not_exists = true})
    end
    space('sequences'):create_index('primary', {parts = {'name'}, if_not_exists = true})

    local holders = space('semaphore_holders')
    -- Primary (name, holder) doubles as the holders-of-a-name index (prefix).
    holders:create_index('primary', {parts = {'name', 'holder'}, if_not_exists = true})
    holders:create_index('by_deadline', {parts = {'lease_until', 'name', 'holder'}, if_not_exists = true})

    local tasks = space('queue_tasks')
    tasks:create_index('primary', {parts = {'id'}, if_not_exists = true})
    tasks:create_index('ready', {parts = {'queue', 'state', 'priority', 'id'}, if_not_exists = true})
    tasks:create_index('watch', {parts = {'state', 'next_event', 'id'}, if_not_exists = true})
    tasks:create_index('by_taken_key', {parts = {'taken_key', 'id'}, if_not_exists = true})

    box.schema.sequence.create('sc_fence', {if_not_exists = true})
    box.schema.sequence.create('sc_task_id', {if_not_exists = true})
end

-- Version 4: sc_quorum, the always-empty synchronous space that makes the
-- writes of the data spaces synchronous (smartcache.quorum).
migrations[4] = function()
    quorum.create_space()
end

-- Version 5: sessions keep their creation time and device (nullable: tuples of
-- version 4 have neither, and read as created at their last refresh, no device).
migrations[5] = function()
    box.space.sessions:format(M.FORMAT.sessions)
end

-- Version 6: the bucket table of a sharded cluster (empty until the cluster is sharded).
migrations[6] = function()
    space('sc_buckets'):create_index('primary', {parts = {'id'}, if_not_exists = true})
end

-- Version 7: every row of a sharded space records its bucket (nullable: rows of
-- a cluster that is not sharded have none), with an index (smartcache.sharding.buckets).
migrations[7] = function()
    for _, name in ipairs(M.SHARDED) do
        -- (a space of a later version, rotations of 9, is created with its by_bucket index)
        if box.space[name] ~= nil then
            box.space[name]:format(M.FORMAT[name])
            box.space[name]:create_index('by_bucket', {parts = {{'bucket', 'unsigned', is_nullable = true}},
                                                       unique = false, if_not_exists = true})
        end
    end
end

-- Version 8: a bucket's row records since when it is in its status (smartcache.sharding.moves).
migrations[8] = function()
    box.space.sc_buckets:format(M.FORMAT.sc_buckets)
end

-- Version 9 (issue 37, sessions as credentials): sessions gain an absolute deadline, a binding's
-- hash and the stored-id mark (nullable: nothing is rewritten, a session of before gets its absolute
-- deadline at its next write); the rotations of the grace window; the operators' audit log.
migrations[9] = function()
    box.space.sessions:format(M.FORMAT.sessions)
    local rotations = space('rotations')
    rotations:create_index('primary', {parts = {'old_id'}, if_not_exists = true})
    rotations:create_index('by_new', {parts = {'new_id', 'old_id'}, if_not_exists = true})
    rotations:create_index('by_deadline', {parts = {'expires_at', 'old_id'}, if_not_exists = true})
    rotations:create_index('by_bucket', {parts = {{'bucket', 'unsigned', is_nullable = true}}, unique = false,
                                         if_not_exists = true})
    local audit = space('audit')
    audit:create_index('primary', {parts = {'seq'}, if_not_exists = true})
    audit:create_index('by_time', {parts = {'time_ms', 'seq'}, if_not_exists = true})
end

function M.current_version()
    if box.space.sc_meta == nil then
        return 0
    end
    local t = box.space.sc_meta:get('schema_version')
    return t and t[2] or 0
end

-- Apply every migration newer than the stored version, each in order.
function M.upgrade()
    local from = M.current_version()
    for v = from + 1, M.VERSION do
        log.info('smartcache schema: upgrading to version %d', v)
        migrations[v]()
        box.space.sc_meta:replace({'schema_version', v})
    end
    return M.current_version()
end

return M
