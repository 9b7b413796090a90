-- Run-time pieces every instance needs once the schema exists: triggers and fibers.
local fiber = require('fiber')
local log = require('log')
local prewarm = require('smartcache.prewarm')
local expiry = require('smartcache.expiry')

local M = {}

local function install_triggers()
    box.space.prewarm:on_replace(prewarm.on_replace, prewarm.on_replace_installed)
    prewarm.on_replace_installed = prewarm.on_replace
end

-- Install the prewarm trigger (now, or once replication brings the space) and start expiry.
function M.start()
    if box.space.prewarm ~= nil then
        install_triggers()
    else
        fiber.create(function()
            fiber.name('wait_schema')
            while box.space.prewarm == nil do
                fiber.sleep(0.1)
            end
            install_triggers()
            log.info('prewarm trigger installed after schema arrived')
        end)
    end
    expiry.start()
end

return M
