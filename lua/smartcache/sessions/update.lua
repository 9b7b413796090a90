-- Changes of a live session's data: update (the whole value with compare-and-set,
-- or attribute merges inside the transaction, so two requests changing different
-- attributes both survive). An update refreshes the deadline, never past the
-- absolute one; a binding that does not match changes nothing.
local util = require('smartcache.util')
local events = require('smartcache.events')
local access = require('smartcache.sessions.access')
local F = require('smartcache.schema').F.sessions

local M = {}

local is_map = util.is_map

-- The merge of SESSION_UPDATE's set (attribute -> value) and unset (attributes)
-- into a session's map-valued data (no data yet: an empty map). nil and why for
-- data that is not a map.
local function merged(data, set, unset)
    data = util.opt(data, nil)  -- no data is stored as box.NULL
    if data ~= nil and not is_map(data) then
        return nil, 'set/unset need the session data to be a map; it is not (replace it whole with data)'
    end
    local out = setmetatable({}, {__serialize = 'map'})
    for k, v in pairs(data or {}) do
        out[k] = v
    end
    for k, v in pairs(set or {}) do
        out[k] = v
    end
    for _, k in ipairs(unset or {}) do
        out[k] = nil
    end
    return out
end

local function check_merge(data, set, unset)
    if set == nil and unset == nil then
        return data == nil and 'data, or set / unset, is required' or nil
    end
    if data ~= nil then
        return 'data replaces the whole value; set / unset change attributes: give one or the other'
    end
    if set ~= nil and not is_map(set) then
        return 'set must be a map of attribute -> value'
    end
    if unset ~= nil then
        if type(unset) ~= 'table' or is_map(unset) and next(unset) ~= nil then
            return 'unset must be a list of attribute names'
        end
        for _, k in ipairs(unset) do
            if type(k) ~= 'string' then
                return 'unset must be a list of attribute names'
            end
        end
    end
    for k in pairs(set or {}) do
        if type(k) ~= 'string' then
            return 'set must have string keys'
        end
    end
    return nil
end

-- Replace the data (data), or merge attributes into it (set, unset) inside the
-- transaction, so two requests changing different attributes both survive;
-- expected_rev makes either a compare-and-set.
function M.update(id, data, expected_rev, version, set, unset, binding)
    data, set, unset, binding = util.opt(data, nil), util.opt(set, nil), util.opt(unset, nil), util.opt(binding, nil)
    expected_rev = util.opt(expected_rev, nil)  -- 10^14 and more come as 64-bit cdata
    local err = util.check(id, 'string', 'session id')
        or util.check_positive(expected_rev, 'expected_rev', util.MAX_SAFE, true)
        or util.check(version, 'string', 'version', true) or check_merge(data, set, unset)
        or access.check_binding(binding)
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    return util.atomic(function()
        local t, refused = access.acting_on(id, binding, now)
        if t == nil then
            return refused
        end
        if expected_rev ~= nil and t[F.rev] ~= expected_rev then
            return util.result('CONFLICT', {rev = t[F.rev]})
        end
        local value = data
        if data == nil then
            local why
            value, why = merged(t[F.data], set, unset)
            if value == nil then
                return util.bad_request(why)
            end
        end
        local ops = {{'=', F.data, value}, {'+', F.rev, 1}}
        if version ~= nil then
            table.insert(ops, {'=', F.version, version})
        end
        t = box.space.sessions:update(id, access.refresh_ops(t, now, ops))
        events.write('session.updated', access.name(t), {client_id = t[F.client_id], rev = t[F.rev]})
        return util.result('OK', access.expiry_fields(t, now, {rev = t[F.rev]}))
    end)
end

return M
