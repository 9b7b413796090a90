#!/usr/bin/env tarantool
-- smartcache storage instance: `tarantool lua/init.lua`, configured only by
-- environment variables (see lua/README.md for the full list).
local fio = require('fio')
local log = require('log')

-- Find our modules next to this file, wherever we are started from.
local here = fio.dirname(fio.abspath(debug.getinfo(1, 'S').source:sub(2)))
package.path = here .. '/?.lua;' .. here .. '/?/init.lua;' .. package.path

local util = require('smartcache.util')

local function env_bool(name, default)
    local v = util.env_string(name, default and 'true' or 'false')
    return v == 'true' or v == '1' or v == 'yes'
end

local name = util.env_string('SC_INSTANCE_NAME', 'smartcache')
local data_dir = util.env_string('SC_DATA_DIR', fio.pathjoin('var', name))
local read_only = env_bool('SC_READ_ONLY', false)
local replication_password = util.env_string('SC_REPLICATION_PASSWORD', 'replicator')
local service_user = util.env_string('SC_SERVICE_USER', 'smartcache')
local service_password = util.env_string('SC_SERVICE_PASSWORD', 'smartcache')
local http_listen = util.env_string('SC_HTTP_LISTEN', '127.0.0.1:8301')

-- Peers as host:port, comma-separated; credentials of the replication user are added.
local replication = {}
for peer in util.env_string('SC_REPLICATION', ''):gmatch('[^,%s]+') do
    table.insert(replication, string.format('replicator:%s@%s', replication_password, peer))
end

if not fio.path.exists(data_dir) then
    assert(fio.mktree(data_dir), 'cannot create ' .. data_dir)
end

box.cfg({
    listen = util.env_string('SC_LISTEN', '127.0.0.1:3301'),
    instance_uuid = os.getenv('SC_INSTANCE_UUID'),
    read_only = read_only,
    replication = #replication > 0 and replication or nil,
    replication_connect_quorum = #replication > 0 and 1 or nil,
    memtx_memory = util.env_number('SC_MEMTX_MEMORY', 256 * 1024 * 1024),
    memtx_dir = data_dir,
    wal_dir = data_dir,
    work_dir = data_dir,
    wal_mode = util.env_string('SC_WAL_MODE', 'write'),
    checkpoint_interval = util.env_number('SC_CHECKPOINT_INTERVAL', 3600),
    checkpoint_count = util.env_number('SC_CHECKPOINT_COUNT', 2),
    log_format = util.env_string('SC_LOG_FORMAT', 'json'),
    log_level = util.env_number('SC_LOG_LEVEL', 5),
    custom_proc_title = name,
})

local schema = require('smartcache.schema')
local api = require('smartcache.api')

if not box.info.ro then
    box.schema.user.create('replicator', {password = replication_password, if_not_exists = true})
    box.schema.user.passwd('replicator', replication_password)
    box.schema.user.grant('replicator', 'replication', nil, nil, {if_not_exists = true})
    schema.upgrade()
    api.register(service_user, service_password)
elseif schema.current_version() < schema.VERSION then
    log.warn('read-only instance with schema %d < %d: waiting for the master to upgrade',
             schema.current_version(), schema.VERSION)
end

require('smartcache.storage').start()

if http_listen ~= '' then
    local host, port = http_listen:match('^(.*):(%d+)$')
    require('smartcache.http').start(host, tonumber(port))
end

log.info('smartcache storage %s ready (read_only=%s, schema=%d)', name, tostring(box.info.ro),
         schema.current_version())
