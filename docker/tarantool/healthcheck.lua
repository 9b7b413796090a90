#!/usr/bin/env tarantool
-- Docker HEALTHCHECK of a storage instance: GET /health on its operator HTTP
-- (SC_HTTP_LISTEN's port, on 127.0.0.1); exit 0 on 200, 1 otherwise. /health
-- (smartcache.runtime's health) answers 200 while box.info.status is 'running' (a
-- replica that follows counts) and 503 with a problem listed: a WAL write failed
-- recently, memtx over its limit or refusing writes for memory, replication from an
-- instance broken, the WAL disk almost full.
local http = require('http.client')

local listen = os.getenv('SC_HTTP_LISTEN') or '127.0.0.1:8301'
local port = listen:match(':(%d+)$') or '8301'
local ok, r = pcall(http.get, 'http://127.0.0.1:' .. port .. '/health', {timeout = 2})
if ok and r.status == 200 then
    os.exit(0)
end
io.stderr:write(ok and ('health: HTTP ' .. tostring(r.status) .. ' ' .. tostring(r.body) .. '\n')
                    or ('health: ' .. tostring(r) .. '\n'))
os.exit(1)
