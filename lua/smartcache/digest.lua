-- sc.digest: what this instance holds, space by space, as a count and an
-- order-independent hash, so that an operator (or the fault suite) can compare
-- a follower's data with the leader's once it has caught up, as
-- pt-table-checksum does for MySQL: a replica must hold exactly the leader's
-- rows, never one the leader rolled back (issue 35: 2.6.0 once left rows on
-- every follower that the leader had rolled back in its memory only).
--
-- Each tuple's hash is murmur3 of its msgpack; a space's hash is the sum of
-- those modulo 2^32 and their xor, so the order of the rows does not matter.
-- With `keys_of` (a space name) the answer also lists that space's rows as
-- {primary key, hash} pairs, at most MAX_KEYS, to name what differs. Reads
-- only; yields every YIELD_EVERY tuples so that a big space does not stall
-- the instance (a write meanwhile changes the answer: compare when quiet).
local digest = require('digest')
local fiber = require('fiber')
local msgpack = require('msgpack')
local util = require('smartcache.util')

local M = {}

M.MAX_KEYS = 100000
M.YIELD_EVERY = 1000
-- An atomic scan (no yield: one state, asked by the fault suite) of no more rows than this.
M.MAX_ATOMIC_ROWS = 200000
-- Always empty between transactions (smartcache.quorum): nothing to compare.
local SKIP = {sc_quorum = true}

local function tuple_hash(t)
    return digest.murmur(msgpack.encode(t))
end

local function key_of(s, t)
    local parts = s.index[0].parts
    local key = {}
    for i, p in ipairs(parts) do
        key[i] = t[p.fieldno]
    end
    return key
end

-- {rows, sum, xor} of one space, and with keys its {key, hash} pairs (nil when more than MAX_KEYS).
-- atomic: no yield (the whole answer is one state of the data; the instance serves nothing meanwhile).
local function scan(s, keys, atomic)
    local rows, sum, x, out = 0, 0, 0, keys and {} or nil
    for _, t in s:pairs() do
        local h = tuple_hash(t)
        rows, sum, x = rows + 1, (sum + h) % 4294967296, bit.bxor(x, h)
        if out ~= nil then
            if #out >= M.MAX_KEYS then
                out = nil
            else
                table.insert(out, {key_of(s, t), h})
            end
        end
        if not atomic and rows % M.YIELD_EVERY == 0 then
            fiber.yield()
        end
    end
    return {rows = rows, sum = sum, xor = bit.tobit(x) % 4294967296}, out
end

local function vclock_now()
    local vclock = setmetatable({}, {__serialize = 'map'})
    for id, lsn in pairs(box.info.vclock) do
        if id ~= 0 then
            vclock[tostring(id)] = lsn
        end
    end
    return vclock
end

-- sc.digest(keys_of?, atomic?): OK {spaces = {name = {rows, sum, xor}}, vclock, consistent, keys?}. keys_of: a
-- space name, or a list of them: keys = {name = [[primary key, hash], ...]} (null past MAX_KEYS).
-- consistent: no row was written while the scan yielded (the vclock before equals the one after), so
-- the answer is this instance's data at that vclock; compare two instances only then.
function M.digest(keys_of, atomic)
    keys_of, atomic = util.opt(keys_of, nil), util.opt(atomic, false)
    if type(atomic) ~= 'boolean' then
        return util.bad_request('atomic must be a boolean')
    end
    if atomic then
        local rows = 0
        for _, def in box.space._space:pairs({512}, {iterator = 'GE'}) do
            local s = box.space[def[3]]
            rows = rows + (s ~= nil and s.index[0] ~= nil and s:len() or 0)
        end
        if rows > M.MAX_ATOMIC_ROWS then
            return util.bad_request(string.format('atomic: %d rows, more than %d (the scan would stall the '
                .. 'instance)', rows, M.MAX_ATOMIC_ROWS))
        end
    end
    if type(keys_of) == 'string' then
        keys_of = {keys_of}
    end
    local wanted = {}
    if keys_of ~= nil then
        if type(keys_of) ~= 'table' then
            return util.bad_request('keys_of must be a space name or a list of them')
        end
        for _, name in ipairs(keys_of) do
            if type(name) ~= 'string' or box.space[name] == nil then
                return util.bad_request('keys_of must be a space name or a list of them')
            end
            wanted[name] = true
        end
    end
    local before = vclock_now()
    local spaces = setmetatable({}, {__serialize = 'map'})
    local keys = keys_of ~= nil and setmetatable({}, {__serialize = 'map'}) or nil
    for _, def in box.space._space:pairs({512}, {iterator = 'GE'}) do
        local name = def[3]
        local s = box.space[name]
        if s ~= nil and not SKIP[name] and s.index[0] ~= nil then
            local listed
            spaces[name], listed = scan(s, wanted[name], atomic)
            if wanted[name] then
                keys[name] = listed or box.NULL
            end
        end
    end
    local after = vclock_now()
    return util.result('OK', {spaces = spaces, vclock = after, consistent = util.same(before, after), keys = keys})
end

return M
