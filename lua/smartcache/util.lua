-- Small shared helpers: Tarantool's own clock, status results, argument checks, ids.
local fiber = require('fiber')
local ffi = require('ffi')
local digest = require('digest')
local msgpack = require('msgpack')
local buffer = require('buffer')

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
-- The largest integer every Lua number holds exactly (PROTOCOL.md 10: integers within +-(2^53 - 1)).
M.MAX_SAFE = 2 ^ 53 - 1
local INT64, UINT64 = ffi.typeof('int64_t'), ffi.typeof('uint64_t')

-- msgpack decodes an integer of 10^14 or more into 64-bit cdata (exact); within
-- +-(2^53 - 1) a Lua number is exact too, so it becomes one: the procedures then
-- check and compute with plain numbers. Larger ones stay cdata (and fail the checks).
function M.plain(value)
    if type(value) == 'cdata' and (ffi.istype(INT64, value) or ffi.istype(UINT64, value)) then
        local n = tonumber(value)
        if n <= M.MAX_SAFE and n >= -M.MAX_SAFE then
            return n
        end
    end
    return value
end

function M.opt(value, default)
    if value == nil then  -- true for both nil and box.NULL
        return default
    end
    return M.plain(value)
end

-- A msgpack map: decoded ones say so in their metatable; a plain Lua table is one
-- when it has no array part (an empty table counts as an empty map).
function M.is_map(v)
    if type(v) ~= 'table' then
        return false
    end
    local mt = getmetatable(v)
    if mt ~= nil and mt.__serialize ~= nil then
        return mt.__serialize == 'map' or mt.__serialize == 'mapping'
    end
    return #v == 0
end

-- Equal msgpack values: maps by their keys, numbers by value (64-bit cdata included). A register's
-- compare-and-set (coordination/atomics.lua) and two vclocks (digest.lua) are compared by it.
local function same(a, b)
    local ta, tb = type(a), type(b)
    if ta == 'table' and tb == 'table' then
        for k, v in pairs(a) do
            if not same(v, b[k]) then
                return false
            end
        end
        for k in pairs(b) do
            if a[k] == nil then
                return false
            end
        end
        return true
    end
    if ta ~= tb and not ((ta == 'number' or ta == 'cdata') and (tb == 'number' or tb == 'cdata')) then
        return false
    end
    return a == b
end
M.same = same

-- A random (version 4) UUID as canonical text. The random bytes come from
-- /dev/urandom, read 4 KiB at a time: Tarantool 2.6's uuid.str() reads
-- /dev/urandom for every UUID and formats it with snprintf (measured: 0.52 us
-- against 0.12, and a read syscall per session created;
-- compat.UUID_STR_READS_URANDOM).
local POOL_BYTES = 4096
local pool = ffi.new('uint8_t[?]', POOL_BYTES)
local pool_used = POOL_BYTES
local HEX_DIGITS = ffi.new('uint8_t[16]', {string.byte('0123456789abcdef', 1, 16)})
local uuid_text = ffi.new('uint8_t[36]')
local band, bor, rshift = bit.band, bit.bor, bit.rshift

function M.uuid()
    if pool_used >= POOL_BYTES then
        ffi.copy(pool, digest.urandom(POOL_BYTES), POOL_BYTES)
        pool_used = 0
    end
    local b = pool + pool_used
    pool_used = pool_used + 16
    b[6] = bor(band(b[6], 0x0f), 0x40)  -- version 4
    b[8] = bor(band(b[8], 0x3f), 0x80)  -- variant RFC 4122
    return M.uuid_text(b)
end

-- The canonical UUID text of 16 bytes (b: a uint8_t array indexed 0..15).
function M.uuid_text(b)
    local o = 0
    for i = 0, 15 do
        if i == 4 or i == 6 or i == 8 or i == 10 then
            uuid_text[o] = 45  -- '-'
            o = o + 1
        end
        uuid_text[o] = HEX_DIGITS[rshift(b[i], 4)]
        uuid_text[o + 1] = HEX_DIGITS[band(b[i], 15)]
        o = o + 2
    end
    return ffi.string(uuid_text, 36)
end

-- Write a tuple without getting it back: space:insert and space:replace return
-- the new tuple as a cdata whose finalizer the Lua GC must run (measured: 0.35
-- us of a 1.4 us insert). The box C API through FFI does the same DML, with the
-- same errors (raised as box errors) in the same transaction, for writes whose
-- result nobody reads. Only where no Lua runs inside the C call: within a
-- transaction (an autocommit write yields for the WAL inside it) and on a space
-- with no Lua trigger (a trigger would re-enter the Lua VM from a C function
-- that JIT-compiled code called through FFI, which LuaJIT does not allow:
-- tarantool#4427, compat.FFI_NO_LUA_REENTRY). Everywhere else it is
-- space:insert / space:replace.
pcall(ffi.cdef, [[
int box_insert(uint32_t space_id, const char *tuple, const char *tuple_end, box_tuple_t **result);
int box_replace(uint32_t space_id, const char *tuple, const char *tuple_end, box_tuple_t **result);
]])  -- fails only when declared already; a missing declaration fails just below, at load
local box_insert, box_replace = ffi.C.box_insert, ffi.C.box_replace
-- Its memory is that of the largest tuple written yet.
local write_buf = buffer.ibuf()

-- Spaces with Lua triggers, by id (the space object): whoever attaches a Lua
-- trigger to a space written through M.insert / M.replace registers it with
-- M.register_lua_trigger (smartcache.quorum's guard).
local lua_triggered = {}

-- Space s has a Lua trigger now (on = true, or nil) or no longer (on = false):
-- M.insert / M.replace write it through space:insert / space:replace.
function M.register_lua_trigger(s, on)
    lua_triggered[s.id] = on ~= false and s or nil
end

function M.has_lua_trigger(s)
    return lua_triggered[s.id] == s
end

local function write(fn, space, tuple)
    write_buf:reset()
    msgpack.encode(tuple, write_buf)
    -- The tuple is copied before the call returns: the buffer is free again after it.
    if fn(space.id, write_buf.rpos, write_buf.wpos, nil) ~= 0 then
        box.error()
    end
end

-- M.insert / M.replace: c_fn where no Lua can run inside it, else the space's own method.
local function writer(c_fn, method)
    return function(space, tuple)
        if lua_triggered[space.id] ~= space and box.is_in_txn() then
            write(c_fn, space, tuple)
        else
            space[method](space, tuple)
        end
    end
end

M.insert = writer(box_insert, 'insert')
M.replace = writer(box_replace, 'replace')

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

-- The tuple of key in space unless its deadline (field deadline_field, ms) has
-- passed: what procedures see, swept or not (expired counts as absent).
function M.live(space, key, deadline_field, now)
    local t = space:get(key)
    if t == nil or t[deadline_field] <= now then
        return nil
    end
    return t
end

function M.is_writable()
    return box.info.ro == false
end

-- May this instance write now? Call it as util.writable() every time: in HA
-- mode smartcache.failover installs its lease check (one compare against the
-- lease deadline) with M.set_writable.
M.writable = M.is_writable

-- Install fn as M.writable (nil: back to M.is_writable); returns the one it replaces.
function M.set_writable(fn)
    local was = M.writable
    M.writable = fn or M.is_writable
    return was
end

-- Transactions opened by M.atomic report their end to smartcache.events from
-- the fiber that committed them, with no commit or rollback trigger: running a
-- Lua trigger costs Tarantool 2.6 a coroutine per transaction (measured: 0.6 us
-- and 500 bytes of garbage each, a sixth of a session write's CPU with the Lua
-- GC's share; compat.LUA_TRIGGER_COSTS_A_COROUTINE). A memtx transaction never yields before its commit, so one
-- transaction at a time is being built: M.building is true from M.atomic's
-- begin until its commit.
M.building = false
-- Registered by smartcache.events (M.on_txn_end): take() returns what the
-- transaction being built wrote (nil when nothing; called before the commit
-- yields), settle(first, last, committed) runs once that transaction has ended.
local txn_end = nil

function M.on_txn_end(hook)
    txn_end = hook
end

local function finish(ok, ...)
    M.building = false
    local hook = txn_end
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
