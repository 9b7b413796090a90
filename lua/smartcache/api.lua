-- The one registration point: every stored procedure the service may call.
--
-- Procedures live in the global table `sc` (net.box calls them as
-- 'sc.<name>'); register() creates each function and grants execute on it,
-- and nothing else, to the role smartcache_api. Idempotent.
local log = require('log')
local sessions = require('smartcache.sessions')
local cache = require('smartcache.cache')
local device = require('smartcache.device')
local prewarm = require('smartcache.prewarm')
local stats = require('smartcache.stats')
local util = require('smartcache.util')
local fiber = require('fiber')

local M = {}

M.ROLE = 'smartcache_api'

local procedures = {
    ping = function() return util.result('OK', {time_ms = util.now_ms(), read_only = box.info.ro}) end,
    session_create = sessions.create,
    session_get = sessions.get,
    session_touch = sessions.touch,
    session_update = sessions.update,
    session_delete = sessions.delete,
    session_list = sessions.list,
    cache_put = cache.put,
    cache_get = cache.get,
    cache_delete = cache.delete,
    cache_delete_by_session = cache.delete_by_session,
    device_bind = device.bind,
    device_lookup = device.lookup,
    prewarm_acquire = prewarm.acquire,
    prewarm_complete = prewarm.complete,
    prewarm_fail = prewarm.fail,
    prewarm_wait = prewarm.wait,
    stats = stats.stats,
}

-- Only with SC_DEBUG_PROCEDURES=1 (tests): a deliberately slow procedure.
if os.getenv('SC_DEBUG_PROCEDURES') == '1' then
    procedures.debug_sleep = function(ms)
        fiber.sleep((tonumber(ms) or 0) / 1000)
        return util.result('OK', {slept_ms = ms})
    end
end

-- Count WAL write failures (disk full, read-only disk) and re-raise them.
local function counted(fn)
    return function(...)
        local ok, res = pcall(fn, ...)
        if ok then
            return res
        end
        if type(res) == 'cdata' and res.code == box.error.WAL_IO then
            stats.wal_errors = stats.wal_errors + 1
        end
        error(res)
    end
end

_G.sc = {}
for name, fn in pairs(procedures) do
    _G.sc[name] = counted(fn)
end

M.names = {}
for name in pairs(procedures) do
    table.insert(M.names, 'sc.' .. name)
end
table.sort(M.names)

-- Create functions and the role; grant the role to the service user. Master only.
function M.register(service_user, service_password)
    box.schema.role.create(M.ROLE, {if_not_exists = true})
    for _, name in ipairs(M.names) do
        -- setuid: a procedure runs with its owner's (admin's) rights, so the
        -- service user needs execute on it and no rights on any space.
        local existing = box.space._func.index.name:get(name)
        if existing ~= nil and existing[4] ~= 1 then
            box.schema.func.drop(name)
        end
        box.schema.func.create(name, {setuid = true, if_not_exists = true})
        box.schema.role.grant(M.ROLE, 'execute', 'function', name, {if_not_exists = true})
    end
    if service_user ~= nil then
        box.schema.user.create(service_user, {password = service_password, if_not_exists = true})
        box.schema.user.passwd(service_user, service_password)
        box.schema.user.grant(service_user, M.ROLE, nil, nil, {if_not_exists = true})
    end
    log.info('smartcache api: %d procedures registered', #M.names)
end

return M
