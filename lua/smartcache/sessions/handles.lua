-- Handles: how a session is named everywhere outside a client's own requests (events, SESSION_LIST,
-- the operator HTTP, SESSION_DELETE by handle, the console, logs). A session id is a bearer
-- credential (issue 37): storage keys sessions by the stored id the service derives from it with a
-- key storage never has (HMAC-SHA256, proto/PROTOCOL.md), and names them by
--
--   handle(stored) = "h" .. base32(the stored id's 16 bytes)   (RFC 4648 alphabet, lowercase, no padding)
--
-- 27 characters, non-secret: it turns back into the stored id (a lookup by primary key), never into
-- the client's raw id, and the service refuses it as an id (it would derive again: NOT_FOUND).
-- service/smartcache/wire/sessionkeys.py computes the same; both are tested against
-- proto/vectors/sessions.json (tests/lua/handles_test.lua).
--
-- A row written before revision 11 is keyed by the raw id itself (no `stored` mark): its handle would
-- be the credential in base32. It is named "r" .. base32(the first 16 bytes of SHA-256(id)) instead, a
-- name no lookup takes, until it is rekeyed (sc.session_rekey).
--
-- Encoded through FFI buffers, as util.uuid formats ids: a session write names its event by handle.
local ffi = require('ffi')
local bit = require('bit')
local digest = require('digest')
local util = require('smartcache.util')

local M = {}

M.PREFIX = 'h'
M.LEGACY_PREFIX = 'r'
M.LENGTH = 27  -- the prefix and 26 characters (128 bits, the last character's 2 low bits zero)
M.ALPHABET = 'abcdefghijklmnopqrstuvwxyz234567'

local band, bor, lshift, rshift = bit.band, bit.bor, bit.lshift, bit.rshift
local SYMBOL = ffi.new('uint8_t[32]', {M.ALPHABET:byte(1, 32)})
local VALUE = {}  -- byte of a base32 symbol -> its value
for i = 1, 32 do
    VALUE[M.ALPHABET:byte(i)] = i - 1
end
local NIBBLE = {}  -- byte of a hex digit -> its value (both cases)
for i = 0, 15 do
    NIBBLE[string.byte(string.format('%x', i))] = i
    NIBBLE[string.byte(string.format('%X', i))] = i
end
local raw = ffi.new('uint8_t[16]')
local out = ffi.new('uint8_t[36]')
local DASH = string.byte('-')
local DASH_AT = {[9] = true, [14] = true, [19] = true, [24] = true}  -- 1-based positions in UUID text

-- The 16 bytes of canonical UUID text (8-4-4-4-12 hex digits) into `raw`; false for anything else.
local function uuid_bytes(text)
    if type(text) ~= 'string' or #text ~= 36 then
        return false
    end
    local n = 0
    local i = 1
    while i <= 36 do
        if DASH_AT[i] then
            if text:byte(i) ~= DASH then
                return false
            end
            i = i + 1
        else
            local hi, lo = NIBBLE[text:byte(i)], NIBBLE[text:byte(i + 1)]
            if hi == nil or lo == nil then
                return false
            end
            raw[n] = hi * 16 + lo
            n = n + 1
            i = i + 2
        end
    end
    return true
end

-- Is text a UUID as storage keys sessions by (canonical, lowercase)?
function M.is_uuid(text)
    return uuid_bytes(text) and text:lower() == text
end

-- prefix .. base32 of the 16 bytes at p.
local function base32(prefix, p)
    out[0] = prefix
    local o, acc, bits = 1, 0, 0
    for i = 0, 15 do
        acc = bor(lshift(acc, 8), p[i])
        bits = bits + 8
        while bits >= 5 do
            bits = bits - 5
            out[o] = SYMBOL[band(rshift(acc, bits), 31)]
            o = o + 1
        end
        acc = band(acc, lshift(1, bits) - 1)
    end
    out[o] = SYMBOL[lshift(acc, 5 - bits)]  -- 128 = 25 * 5 + 3: three bits left, padded with zeros
    return ffi.string(out, M.LENGTH)
end

-- The handle of a stored id (UUID text); nil, why for anything else.
function M.handle(stored)
    if not uuid_bytes(stored) then
        return nil, 'a session id is UUID text'
    end
    return base32(string.byte(M.PREFIX), raw)
end

-- The stored id (canonical UUID text) a handle names; nil, why for anything else (BAD_REQUEST).
function M.parse(handle)
    if type(handle) ~= 'string' then
        return nil, 'handle must be a string'
    end
    if #handle ~= M.LENGTH or handle:sub(1, 1) ~= M.PREFIX then
        return nil, string.format('handle must be %d characters: "%s" and 26 of base32 (a-z, 2-7)', M.LENGTH,
            M.PREFIX)
    end
    local acc, bits, n = 0, 0, 0
    for i = 2, M.LENGTH do
        local v = VALUE[handle:byte(i)]
        if v == nil then
            return nil, string.format('handle character %d is not base32 (lowercase a-z, 2-7)', i)
        end
        acc = bor(lshift(acc, 5), v)
        bits = bits + 5
        if bits >= 8 then
            bits = bits - 8
            raw[n] = band(rshift(acc, bits), 255)
            n = n + 1
            acc = band(acc, lshift(1, bits) - 1)
        end
    end
    if acc ~= 0 then  -- the last character's two unused bits: one handle per id
        return nil, 'handle is not canonical (its last character\'s unused bits are not zero)'
    end
    return util.uuid_text(raw)
end

-- The name of a raw-keyed row (written before revision 11): a digest of its id, never the id.
function M.legacy(id)
    local d = digest.sha256(id)
    for i = 0, 15 do
        raw[i] = d:byte(i + 1)
    end
    return base32(string.byte(M.LEGACY_PREFIX), raw)
end

-- How a session row (id, and whether that id is a stored id) is named outside.
function M.name(id, stored)
    if stored == true then
        return (M.handle(id)) or M.legacy(id)
    end
    return M.legacy(id)
end

return M
