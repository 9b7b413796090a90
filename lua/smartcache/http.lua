-- Read-only operator HTTP endpoint on the socket module (2.6 has no http.server).
--
--   GET /health                 role, failover state, replication, memtx, WAL (503 when unhealthy)
--   GET /metrics                Prometheus text format
--   GET /sessions/<handle>      one live session, named by its handle (never its id: a session id
--                               is a credential, issue 37); 400 for what is not a handle; 421 when
--                               its bucket is not active here
--   GET /clients/<id>/sessions  a client's live sessions, each named by its handle; in a sharded
--                               cluster those of a bucket not active here apart, as "copies" with
--                               the bucket's state
local socket = require('socket')
local json = require('json')
local log = require('log')
local digest = require('digest')
local msgpack = require('msgpack')
local stats = require('smartcache.stats')
local expiry = require('smartcache.expiry')
local util = require('smartcache.util')
local schema = require('smartcache.schema')
local sessions = require('smartcache.sessions')
local runtime = require('smartcache.runtime')
local failover = require('smartcache.failover')
local config = require('smartcache.config')
local disk = require('smartcache.disk')
local sharding = require('smartcache.sharding')

local M = {}

local MAX_REQUEST_BYTES = 8192
local READ_TIMEOUT_S = 5
local MAX_CONNECTIONS = 64  -- more at once get 503: an operator endpoint must not eat the instance
local active = 0
local F = schema.F.sessions
local FB = schema.F.sc_buckets  -- a bucket's row: id, status, generation, peer, since

local function respond(s, code, content_type, body)
    local reason = ({[200] = 'OK', [400] = 'Bad Request', [401] = 'Unauthorized', [404] = 'Not Found',
                     [405] = 'Method Not Allowed', [421] = 'Misdirected Request', [503] = 'Service Unavailable',
                     [500] = 'Internal Server Error'})[code] or 'OK'
    s:write(string.format('HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s',
        code, reason, content_type, #body, body))
end

-- JSON that survives binary data: strings json cannot carry go as base64.
local function to_json(value)
    local ok, text = pcall(json.encode, value)
    if ok then
        return text
    end
    if type(value) == 'table' then
        local copy = {}
        for k, v in pairs(value) do
            copy[k] = v
        end
        copy.data, copy.data_msgpack_base64 = nil, digest.base64_encode(msgpack.encode(value.data))
        return json.encode(copy)
    end
    return json.encode({error = 'unencodable'})
end

-- A session as the operator sees it: named by its handle, its binding only as whether it has one.
local function session_view(t, now)
    return sessions.expiry_fields(t, now, {
        handle = sessions.name(t), client_id = t[F.client_id], version = t[F.version], rev = t[F.rev],
        created_at_ms = sessions.created_at(t), updated_at_ms = t[F.updated_at],
        device = t[F.device], bound = t[F.binding] ~= nil, data = t[F.data]})
end

-- nil when this shard serves the session row's bucket (the cluster is not sharded, or the bucket
-- is active here: what buckets.refusal lets a call through for). Else where the row stands: its
-- bucket, the bucket's state here (receiving, sending, sent, garbage, aborting: a copy moving in
-- or out, the garbage of a move, a given-up copy being deleted; null: a bucket this shard does not
-- hold, rows from before sharding) and the other shard of the move (peer), when there is one.
-- Such a row may be partial or stale: the operator view must not pass it for the session.
local function not_served(t)
    local count = sharding.count()
    if count == nil then
        return nil
    end
    local b = t[F.bucket]
    if b == nil then  -- (nil or box.NULL: a row written before sharding)
        b = sharding.of_row('sessions', t, count)
    end
    local row = box.space.sc_buckets:get(b)
    if row ~= nil and row[FB.status] == sharding.BUCKET.ACTIVE then
        return nil
    end
    return {bucket = b, state = row and row[FB.status] or box.NULL, peer = row and row[FB.peer] or box.NULL}
end

local function not_served_message(where)
    return string.format('not served here: bucket %d is %s on this shard', where.bucket,
        where.state ~= nil and where.state or 'not held')
end

-- 503 with the reasons in "problems" when not running, after a recent WAL
-- failure, above 90 % of memtx memory, DIVERGED, or stepped down for its WAL.
-- role: master/replica (standalone), or the failover role in HA mode.
local function health()
    local doc = runtime.health()
    return doc.healthy and 200 or 503, 'application/json', json.encode(doc)
end

local function metric(out, name, kind, help, samples)
    table.insert(out, string.format('# HELP %s %s', name, help))
    table.insert(out, string.format('# TYPE %s %s', name, kind))
    for _, s in ipairs(samples) do
        table.insert(out, string.format('%s%s %s', name, s[1], tostring(s[2])))
    end
end

local function metrics()
    local out = {}
    local tuples, expired = {}, {}
    for _, name in ipairs(stats.SPACES) do
        table.insert(tuples, {string.format('{space="%s"}', name), box.space[name] and box.space[name]:len() or 0})
        if expiry.expired[name] ~= nil then
            table.insert(expired, {string.format('{space="%s"}', name), expiry.expired[name]})
        end
    end
    metric(out, 'smartcache_tarantool_tuples', 'gauge', 'Tuples per space.', tuples)
    metric(out, 'smartcache_tarantool_expired_total', 'counter', 'Tuples removed by the expiry fibers.', expired)
    metric(out, 'smartcache_tarantool_expiry_errors_total', 'counter', 'Errors in expiry fibers.',
        {{'', expiry.errors}})
    metric(out, 'smartcache_tarantool_wal_errors_total', 'counter', 'Procedure calls failed by WAL write errors.',
        {{'', disk.wal_errors}})
    metric(out, 'smartcache_tarantool_read_only', 'gauge', '1 when this instance is read-only.',
        {{'', box.info.ro and 1 or 0}})
    metric(out, 'smartcache_tarantool_schema_version', 'gauge', 'Schema version.', {{'', schema.current_version()}})
    -- Upstream (we replicate from the peer) and downstream (the peer replicates from us) apart:
    -- a leader has no upstream, and must not report its followers as broken upstreams.
    local lag, up, down = {}, {}, {}
    for _, r in ipairs(failover.replication()) do
        local label = string.format('{peer_id="%d"}', r.id)
        if r.upstream_status ~= nil then
            table.insert(up, {label, r.upstream_status == 'follow' and 1 or 0})
            if r.upstream_lag_s ~= nil then
                table.insert(lag, {label, r.upstream_lag_s})
            end
        end
        if r.downstream_status ~= nil then
            table.insert(down, {label, r.downstream_status == 'follow' and 1 or 0})
        end
    end
    metric(out, 'smartcache_tarantool_replication_lag_seconds', 'gauge', 'Lag behind an upstream we replicate from.',
        lag)
    metric(out, 'smartcache_tarantool_replication_upstream_up', 'gauge',
        '1 when replication from this upstream peer follows (only peers we replicate from).', up)
    metric(out, 'smartcache_tarantool_replication_downstream_up', 'gauge',
        '1 when this downstream peer follows us (only peers that replicate from us).', down)
    local memtx = runtime.memtx()
    -- (named quota_used for the alert rules of earlier versions; it is arena_used)
    metric(out, 'smartcache_tarantool_memtx_quota_used_bytes', 'gauge', 'memtx arena in use (box.slab.info).',
        {{'', memtx.arena_used_bytes}})
    metric(out, 'smartcache_tarantool_memtx_quota_mapped_ratio', 'gauge',
        'memtx quota mapped into 16 MiB slabs (box.slab.info quota_used / quota_size): at 1 a size class whose '
        .. 'slabs are full cannot grow, however much room the other classes have.', {{'', memtx.quota_used_ratio}})
    metric(out, 'smartcache_tarantool_memtx_cache_bytes', 'gauge', 'Bytes of the cache and prewarm spaces.',
        {{'', memtx.lossy_bytes}})
    metric(out, 'smartcache_tarantool_memtx_cache_budget_bytes', 'gauge',
        'What the cache and prewarm spaces may hold (SC_CACHE_MEMORY_SHARE of memtx_memory).',
        {{'', memtx.lossy_budget_bytes}})
    metric(out, 'smartcache_tarantool_memtx_cache_used_ratio', 'gauge',
        'cache and prewarm bytes / their budget: at 1 their writes are refused (out of memory).',
        {{'', memtx.lossy_used_ratio}})
    metric(out, 'smartcache_tarantool_memory_refused_total', 'counter',
        'Writes refused for memory, by reason (cache_budget: the lossy spaces\' share is full; allocation: '
        .. 'memtx could not allocate).',
        {{'{reason="cache_budget"}', memtx.refused}, {'{reason="allocation"}', memtx.errors}})
    metric(out, 'smartcache_tarantool_memtx_quota_size_bytes', 'gauge', 'memtx memory quota (SC_MEMTX_MEMORY).',
        {{'', memtx.quota_bytes}})
    metric(out, 'smartcache_tarantool_memtx_items_used_bytes', 'gauge', 'Bytes of tuples stored.',
        {{'', memtx.items_used_bytes}})
    local h = runtime.health()
    metric(out, 'smartcache_tarantool_healthy', 'gauge', '1 when /health answers 200.', {{'', h.healthy and 1 or 0}})
    metric(out, 'smartcache_tarantool_memtx_used_ratio', 'gauge', 'memtx arena in use / memtx_memory.',
        {{'', h.memtx.used_ratio}})
    local st = failover.instance and failover.instance:status()
    local roles = {}
    local current = st and st.role or (config.ha and 'starting' or 'standalone')
    for _, r in ipairs(failover.ROLES) do
        table.insert(roles, {string.format('{role="%s"}', r), current == r and 1 or 0})
    end
    metric(out, 'smartcache_tarantool_failover_role', 'gauge', 'This instance\'s failover role (1 for the current).',
        roles)
    metric(out, 'smartcache_tarantool_failover_writable', 'gauge', '1 while this instance may write.',
        {{'', failover.writable() and 1 or 0}})
    if st ~= nil then
        metric(out, 'smartcache_tarantool_failover_term', 'gauge', 'Term led or followed (counted in the leader key).',
            {{'', st.term}})
        metric(out, 'smartcache_tarantool_failover_max_term', 'gauge', 'The highest term seen, kept durably.',
            {{'', st.max_term}})
        metric(out, 'smartcache_tarantool_failover_dcs_regressed', 'gauge',
            '1 while etcd went back (a stale key, a lower revision, a forgotten replica set) and no leader since.',
            {{'', st.dcs_regressed ~= nil and 1 or 0}})
        metric(out, 'smartcache_tarantool_failover_lease_left_seconds', 'gauge',
            'How long this leader may still write without a renewal.', {{'', st.lease_left_ms / 1000}})
        metric(out, 'smartcache_tarantool_failover_fenced', 'gauge',
            '1 when fenced (a leader whose lease is unproven).', {{'', st.fenced and 1 or 0}})
        metric(out, 'smartcache_tarantool_failover_diverged', 'gauge',
            '1 when this instance holds rows the leader does not (rebuild it: cluster rejoin).',
            {{'', st.diverged ~= nil and 1 or 0}})
        metric(out, 'smartcache_tarantool_failover_topology_version', 'gauge',
            'The version of the topology (the members in etcd) this instance acts on; 0: none.',
            {{'', type(st.topology_version) == 'number' and st.topology_version or 0}})
        metric(out, 'smartcache_tarantool_failover_topology_problem', 'gauge',
            '1 while etcd has no topology, or an older one, than this instance saw (it acts on its own).',
            {{'', st.topology_problem ~= nil and 1 or 0}})
        local events = {}
        for _, e in ipairs({'elections_won', 'promotions', 'fences', 'step_downs', 'etcd_errors', 'divergences',
                            'switchovers', 'join_holds', 'reconnects', 'quorum_raises', 'quorum_lowerings',
                            'dcs_regressions', 'auto_rejoins', 'conflict_rebuilds', 'set_asides',
                            'set_asides_removed'}) do
            table.insert(events, {string.format('{event="%s"}', e), st.counters[e]})
        end
        metric(out, 'smartcache_tarantool_failover_events_total', 'counter', 'Failover events on this instance.',
            events)
    end
    table.insert(out, '')
    return 200, 'text/plain; version=0.0.4', table.concat(out, '\n')
end

local function route(path)
    if path == '/health' then
        return health()
    elseif path == '/metrics' then
        return metrics()
    end
    local now = util.now_ms()
    local handle = path:match('^/sessions/([^/]+)$')
    if handle ~= nil then
        local id, why = sessions.parse_handle(handle)
        if id == nil then
            return 400, 'application/json', json.encode({error = 'BAD_REQUEST', message = why})
        end
        local t = sessions.live(id, now)
        if t == nil or not sessions.is_stored(t) then  -- a raw-keyed row of before has no handle
            return 404, 'application/json', json.encode({error = 'NOT_FOUND'})
        end
        local where = not_served(t)
        if where ~= nil then
            return 421, 'application/json', json.encode({error = 'NOT_SERVED_HERE', message = not_served_message(where),
                bucket = where.bucket, bucket_state = where.state, peer = where.peer})
        end
        return 200, 'application/json', to_json(session_view(t, now))
    end
    local client = path:match('^/clients/([^/]+)/sessions$')
    if client ~= nil then
        local list, copies = {}, {}
        for _, t in box.space.sessions.index.by_client:pairs({client}, {iterator = 'EQ'}) do
            if sessions.alive(t, now) then
                local where = not_served(t)
                if where == nil then
                    table.insert(list, session_view(t, now))
                else
                    local view = session_view(t, now)
                    view.bucket, view.bucket_state, view.peer = where.bucket, where.state, where.peer
                    table.insert(copies, view)
                end
            end
        end
        -- copies: only in a sharded cluster (not sharded, the answer is what it always was)
        return 200, 'application/json', to_json({client_id = client, sessions = list,
            copies = sharding.count() ~= nil and copies or nil})
    end
    return 404, 'application/json', json.encode({error = 'NOT_FOUND', message = 'no such route'})
end

-- Routes that serve customer data need the token (when one is set); /health and /metrics do not.
local OPEN = {['/health'] = true, ['/metrics'] = true}
local token = nil

local function authorized(request, path)
    if token == nil or OPEN[path] then
        return true
    end
    local given = request:match('\r\n[Aa]uthorization: *Bearer +([^\r]+)\r\n')
    return given ~= nil and digest.sha256(given) == digest.sha256(token)
end

local function serve(s)
    local request = s:read({delimiter = '\r\n\r\n', chunk = MAX_REQUEST_BYTES}, READ_TIMEOUT_S)
    if request == nil or request == '' then
        return
    end
    local method, path = request:match('^(%u+) (%S+) HTTP/1%.[01]\r\n')
    if method == nil then
        respond(s, 400, 'text/plain', 'bad request\n')
    elseif method ~= 'GET' then
        respond(s, 405, 'text/plain', 'read-only endpoint: GET only\n')
    elseif not authorized(request, (path:gsub('%?.*$', ''))) then
        respond(s, 401, 'text/plain', 'a bearer token is required (SC_HTTP_TOKEN)\n')
    else
        local ok, code, ctype, body = pcall(route, (path:gsub('%?.*$', '')))
        if ok then
            respond(s, code, ctype, body)
        else
            log.error('http %s: %s', path, tostring(code))
            respond(s, 500, 'application/json', json.encode({error = 'INTERNAL'}))
        end
    end
end

local function handle(s)
    if active >= MAX_CONNECTIONS then
        respond(s, 503, 'text/plain', 'too many operator connections\n')
        return
    end
    active = active + 1
    local ok, err = pcall(serve, s)
    active = active - 1
    if not ok then
        log.error('http: %s', tostring(err))
    end
end

local function is_local(host)
    return host == 'localhost' or host == '::1' or host:match('^127%.') ~= nil
end

-- Start serving on host:port; returns the server socket (port 0 picks a free one).
-- bearer: the token the data routes require; mandatory when host is not local.
function M.start(host, port, bearer)
    if bearer == '' then
        bearer = nil
    end
    if bearer == nil and not is_local(host) then
        error(string.format('operator http on %s:%s serves session data: set SC_HTTP_TOKEN (or SC_HTTP_TOKEN_FILE)'
            .. ' to listen beyond localhost', host, port))
    end
    token = bearer
    local server, err = socket.tcp_server(host, port, {handler = handle, name = 'operator_http'})
    if server == nil then
        error(string.format('operator http on %s:%s: %s', host, port, err))
    end
    log.info('operator http listening on %s:%d', host, server:name().port)
    return server
end

return M
