-- Small shared helpers: Tarantool's own clock, status results, argument checks.
local fiber = require('fiber')

local M = {}

-- Milliseconds since the epoch, from this instance's clock (cached per event
-- loop turn, so cheap). Service instances need no clock agreement.
function M.now_ms()
    return math.floor(fiber.time() * 1000)
end

-- A procedure result: one map with the status name and the reply fields.
function M.result(status, fields)
    local r = fields or {}
    r.status = status
    return r
end

function M.bad_request(message)
    return M.result('BAD_REQUEST', {message = message})
end

-- Check an argument's Lua type; returns an error message or nil.
function M.check(value, lua_type, name, optional)
    if value == nil and optional then
        return nil
    end
    if type(value) ~= lua_type then
        return string.format('%s must be %s', name, lua_type)
    end
    return nil
end

-- A positive integer (seconds or milliseconds) with an upper bound.
function M.check_positive(value, name, max, optional)
    if value == nil and optional then
        return nil
    end
    if type(value) ~= 'number' or value ~= math.floor(value) or value <= 0 or value > max then
        return string.format('%s must be an integer in 1..%d', name, max)
    end
    return nil
end

-- An optional argument: msgpack nil arrives as box.NULL, which is truthy in
-- Lua, so `x or default` is wrong for it; use opt(x, default).
function M.opt(value, default)
    if value == nil then  -- true for both nil and box.NULL
        return default
    end
    return value
end

-- Environment settings with defaults.
function M.env_number(name, default)
    local v = os.getenv(name)
    if v == nil or v == '' then
        return default
    end
    local n = tonumber(v)
    if n == nil then
        error(string.format('%s must be a number, got %q', name, v))
    end
    return n
end

-- A secret: NAME, or the content of the file named by NAME_FILE (Docker secrets); never both.
function M.env_secret(name, default)
    local path, value = os.getenv(name .. '_FILE'), os.getenv(name)
    if path ~= nil and path ~= '' then
        if value ~= nil and value ~= '' then
            error(string.format('%s and %s_FILE are both set: set one', name, name))
        end
        local f, err = io.open(path, 'r')
        if f == nil then
            error(string.format('%s_FILE=%s: %s', name, path, tostring(err)))
        end
        local text = f:read('*a'):gsub('%s+$', '')
        f:close()
        return text
    end
    return M.env_string(name, default)
end

function M.env_string(name, default)
    local v = os.getenv(name)
    if v == nil or v == '' then
        return default
    end
    return v
end

function M.is_writable()
    return box.info.ro == false
end

-- May this instance write now? Call it as util.writable() every time: the
-- failover module replaces it in HA mode with one compare against the lease
-- deadline.
M.writable = M.is_writable

-- Transactions opened by M.atomic report their end to smartcache.events from
-- the fiber that committed them, with no commit or rollback trigger: running a
-- Lua trigger costs Tarantool 2.6 a coroutine per transaction (measured: 0.6 us
-- and 500 bytes of garbage each, a sixth of a session write's CPU with the Lua
-- GC's share). A memtx transaction never yields before its commit, so one
-- transaction at a time is being built: M.building is true from M.atomic's
-- begin until its commit.
M.building = false
-- Set by smartcache.events: take() returns what the transaction being built
-- wrote (nil when nothing; called before the commit yields), settle(first,
-- last, committed) runs once that transaction has ended.
M.txn_end = nil

local function finish(ok, ...)
    M.building = false
    local hook = M.txn_end
    local first, last
    if hook ~= nil then
        first, last = hook.take()
    end
    if not ok then
        box.rollback()
        if first ~= nil then
            hook.settle(first, last, false)
        end
        error((...), 0)
    end
    if first == nil then
        box.commit()
        return ...
    end
    local committed, err = pcall(box.commit)
    hook.settle(first, last, committed)
    if not committed then
        error(err, 0)
    end
    return ...
end

-- box.atomic that joins a transaction already open (a procedure's
-- util.atomic around a helper that opens one too), and reports the end of the
-- transactions it opens (M.building).
function M.atomic(fn, ...)
    if box.is_in_txn() then
        return fn(...)
    end
    box.begin()
    M.building = true
    return finish(pcall(fn, ...))
end

return M
