-- Spaces, indexes and their versioned, idempotent upgrades.
--
-- Tuple positions are named constants (F.<space>.<field>) matching each
-- space's format. Run `upgrade()` on the master only: replicas receive the
-- schema through replication.
local log = require('log')

local M = {}

-- Bump when a migration is added; stored in space sc_meta under 'schema_version'.
M.VERSION = 1

M.F = {
    sessions = {id = 1, client_id = 2, version = 3, rev = 4, updated_at = 5, ttl_ms = 6, expires_at = 7, data = 8},
    cache = {session_id = 1, key = 2, data_type = 3, updated_at = 4, ttl_ms = 5, expires_at = 6, data = 7},
    device = {device_id = 1, client_id = 2, updated_at = 3},
    prewarm = {client_id = 1, data_type = 2, session_id = 3, version = 4, updated_at = 5, state = 6,
               owner = 7, lease_until = 8, expires_at = 9, data = 10},
}

local migrations = {}

-- Version 1: the four spaces of the brief plus the meta space.
migrations[1] = function()
    local meta = box.schema.space.create('sc_meta', {if_not_exists = true, format = {
        {name = 'key', type = 'string'}, {name = 'value', type = 'any'},
    }})
    meta:create_index('primary', {parts = {'key'}, if_not_exists = true})

    local sessions = box.schema.space.create('sessions', {if_not_exists = true, format = {
        {name = 'id', type = 'string'},            -- canonical UUID text
        {name = 'client_id', type = 'string'},
        {name = 'version', type = 'string'},       -- front service version, as given
        {name = 'rev', type = 'unsigned'},         -- 1, +1 per update (compare-and-set)
        {name = 'updated_at', type = 'unsigned'},  -- ms since epoch
        {name = 'ttl_ms', type = 'unsigned'},
        {name = 'expires_at', type = 'unsigned'},  -- updated_at + ttl_ms: sliding deadline
        {name = 'data', type = 'any', is_nullable = true},
    }})
    sessions:create_index('primary', {parts = {'id'}, if_not_exists = true})
    sessions:create_index('by_client', {parts = {'client_id', 'id'}, if_not_exists = true})
    sessions:create_index('by_deadline', {parts = {'expires_at', 'id'}, if_not_exists = true})

    local cache = box.schema.space.create('cache', {if_not_exists = true, format = {
        {name = 'session_id', type = 'string'},    -- '' = global namespace
        {name = 'key', type = 'string'},
        {name = 'data_type', type = 'integer'},
        {name = 'updated_at', type = 'unsigned'},
        {name = 'ttl_ms', type = 'unsigned'},
        {name = 'expires_at', type = 'unsigned'},
        {name = 'data', type = 'any', is_nullable = true},
    }})
    -- Primary (session_id, key) doubles as the by-session index (prefix).
    cache:create_index('primary', {parts = {'session_id', 'key'}, if_not_exists = true})
    cache:create_index('by_deadline', {parts = {'expires_at', 'session_id', 'key'}, if_not_exists = true})

    local device = box.schema.space.create('device', {if_not_exists = true, format = {
        {name = 'device_id', type = 'string'},
        {name = 'client_id', type = 'string'},
        {name = 'updated_at', type = 'unsigned'},
    }})
    device:create_index('primary', {parts = {'device_id'}, if_not_exists = true})
    device:create_index('by_client', {parts = {'client_id', 'device_id'}, if_not_exists = true})

    local prewarm = box.schema.space.create('prewarm', {if_not_exists = true, format = {
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
    }})
    prewarm:create_index('primary', {parts = {'client_id', 'data_type'}, if_not_exists = true})
    prewarm:create_index('by_deadline', {parts = {'expires_at', 'client_id', 'data_type'}, if_not_exists = true})
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
