-- Device bindings: which client a mobile device belongs to (set at login).
local util = require('smartcache.util')
local events = require('smartcache.events')
local F = require('smartcache.schema').F.device

local M = {}

function M.bind(device_id, client_id)
    local err = util.check(device_id, 'string', 'device_id') or util.check(client_id, 'string', 'client_id')
    if err ~= nil then
        return util.bad_request(err)
    end
    local now = util.now_ms()
    return util.atomic(function()
        local old = box.space.device:get(device_id)
        box.space.device:replace({device_id, client_id, now})
        if old == nil or old[F.client_id] ~= client_id then  -- a new binding (a repeat changes nothing to report)
            events.write('device.bound', device_id, {client_id = client_id,
                                                     previous_client_id = old and old[F.client_id] or nil})
        end
        return util.result('OK')
    end)
end

function M.lookup(device_id)
    local err = util.check(device_id, 'string', 'device_id')
    if err ~= nil then
        return util.bad_request(err)
    end
    local seq = events.enabled() and events.visible() or nil  -- the read's position (see sessions.reads get)
    local t = box.space.device:get(device_id)
    if t == nil then
        return util.result('NOT_FOUND')
    end
    return util.result('OK', {client_id = t[F.client_id], updated_at_ms = t[F.updated_at], seq = seq})
end

return M
