-- The operators' audit log (issue 37): who did what, when, to what and why, kept where the data
-- is, replicated and synchronous like it (the space `audit` is guarded: smartcache.quorum).
--
-- Append-only: sc.audit_write adds an entry and nothing changes or deletes one but the retention,
-- which drops entries older than SC_AUDIT_RETENTION_DAYS (never the newest: the sequence goes on
-- from it). Operators only (api.lua's OPERATOR_ONLY): smartcache.ops writes one entry before a
-- command acts and one with its outcome; the console one per reveal of session data (a reason is
-- required there), log-out-everywhere, switchover and rejoin. The service never writes one.
--
-- seq is the newest entry's + 1, read in the inserting transaction (as the event log numbers its
-- events): gap-free on the replica set, ordered as the entries committed; a reader keeps the last
-- seq it saw (sc.audit_read(after_seq)).
local fiber = require('fiber')
local log = require('log')
local msgpack = require('msgpack')
local util = require('smartcache.util')
local config = require('smartcache.config')
local schema = require('smartcache.schema')

local F = schema.F.audit

local M = {}

M.MAX_WHO_BYTES = 256
M.MAX_ACTION_BYTES = 64
M.MAX_TARGET_BYTES = 512
M.MAX_REASON_BYTES = 1024
M.MAX_DETAILS_BYTES = 16 * 1024
M.READ_LIMIT, M.READ_MAX = 100, 1000
-- The retention fiber: entries deleted per transaction, and its longest sleep (it sleeps until the
-- oldest entry is due, so a day at most between looks: "swept by day").
M.SWEEP_BATCH = 500
M.SWEEP_MAX_SLEEP_S = 86400
M.retention_days = config.audit_retention_days
M.swept = 0   -- entries the retention deleted (sc.stats)
M.errors = 0  -- retention rounds that failed

local function text(value, name, min, max)
    if type(value) ~= 'string' or #value < min or #value > max then
        return string.format('%s must be a string of %d..%d bytes', name, min, max)
    end
    return nil
end

local is_map = util.is_map

local function entry(t)
    return {seq = t[F.seq], time_ms = t[F.time_ms], who = t[F.who], action = t[F.action], target = t[F.target],
            reason = t[F.reason], details = t[F.details]}
end

-- The newest entry's seq (0: none ever, or none kept).
function M.head()
    local last = box.space.audit.index.primary:max()
    return last and last[F.seq] or 0
end

-- sc.audit_write(who, action, target?, reason?, details?): OK {seq, time_ms} · NOT_LEADER · BAD_REQUEST.
-- action: letters, digits and . _ - (e.g. console.reveal, cluster.switchover, cluster.move.done).
function M.write(who, action, target, reason, details)
    target, reason, details = util.opt(target, ''), util.opt(reason, ''), util.opt(details, nil)
    local err = text(who, 'who', 1, M.MAX_WHO_BYTES) or text(action, 'action', 1, M.MAX_ACTION_BYTES)
        or text(target, 'target', 0, M.MAX_TARGET_BYTES) or text(reason, 'reason', 0, M.MAX_REASON_BYTES)
    if err == nil and not action:match('^[%w._%-]+$') then
        err = 'action must be letters, digits and . _ - (e.g. cluster.switchover)'
    end
    if err == nil and details ~= nil and (not is_map(details) or #msgpack.encode(details) > M.MAX_DETAILS_BYTES) then
        err = string.format('details must be a map of at most %d bytes of msgpack', M.MAX_DETAILS_BYTES)
    end
    if err ~= nil then
        return util.bad_request(err)
    end
    if not util.writable() then
        return util.result('NOT_LEADER')
    end
    return util.atomic(function()
        local seq, now = M.head() + 1, util.now_ms()
        box.space.audit:insert({seq, now, who, action, target, reason, details or box.NULL})
        return util.result('OK', {seq = seq, time_ms = now})
    end)
end

-- sc.audit_read(after_seq?, limit?): the entries after after_seq (0: from the oldest kept), oldest
-- first, at most limit (100; 1..1000): OK {entries: [{seq, time_ms, who, action, target, reason,
-- details}], last_seq (the last one's seq; after_seq when none), head_seq (the newest entry's)}.
function M.read(after_seq, limit)
    after_seq, limit = util.opt(after_seq, 0), util.opt(limit, M.READ_LIMIT)
    if type(after_seq) ~= 'number' or after_seq < 0 or after_seq ~= math.floor(after_seq) then
        return util.bad_request('after_seq must be an integer of 0 or more')
    end
    local err = util.check_positive(limit, 'limit', M.READ_MAX)
    if err ~= nil then
        return util.bad_request(err)
    end
    local out = setmetatable({}, {__serialize = 'array'})
    local last = after_seq
    for _, t in box.space.audit.index.primary:pairs({after_seq}, {iterator = 'GT'}) do
        if #out >= limit then
            break
        end
        table.insert(out, entry(t))
        last = t[F.seq]
    end
    return util.result('OK', {entries = out, last_seq = last, head_seq = M.head()})
end

-- Delete up to one batch of entries older than the retention (never the newest); returns (deleted,
-- seconds until the oldest entry left is due).
function M.sweep_once(now)
    now = now or util.now_ms()
    local keep_after = now - M.retention_days * 86400 * 1000
    local head = M.head()
    local due = {}
    for _, t in box.space.audit.index.by_time:pairs({}, {iterator = 'GE'}) do
        if t[F.time_ms] >= keep_after or #due >= M.SWEEP_BATCH then
            break
        end
        if t[F.seq] ~= head then
            table.insert(due, t[F.seq])
        end
    end
    if #due > 0 then
        util.atomic(function()
            for _, seq in ipairs(due) do
                box.space.audit:delete(seq)
            end
        end)
        M.swept = M.swept + #due
    end
    local oldest = box.space.audit.index.by_time:min()
    local next_in = M.SWEEP_MAX_SLEEP_S
    if #due >= M.SWEEP_BATCH then
        next_in = 0
    elseif oldest ~= nil and oldest[F.seq] ~= M.head() then
        local due_in = (oldest[F.time_ms] + M.retention_days * 86400 * 1000 - util.now_ms()) / 1000
        next_in = math.min(next_in, math.max(due_in, 0))
    end
    return #due, next_in
end

local function loop()
    fiber.name('audit_retention')
    while true do
        if not util.writable() or box.space.audit == nil then
            fiber.sleep(config.sweep_max_sleep_s)
        else
            local ok, n, next_in = pcall(M.sweep_once)
            if not ok then
                M.errors = M.errors + 1
                log.error('audit retention: %s', tostring(n))
                fiber.sleep(config.ERROR_PAUSE_S)
            elseif n > 0 and next_in == 0 then
                fiber.yield()
            else
                -- A writable instance that stops being one sleeps on here, then looks again; one
                -- that becomes writable meanwhile sweeps at its next look (at most the sleep).
                fiber.sleep(math.max(next_in, config.sweep_max_sleep_s))
            end
        end
    end
end

-- For sc.stats: the newest entry's seq, and what the retention did.
function M.stats()
    return {head_seq = box.space.audit and M.head() or box.NULL, swept = M.swept, errors = M.errors,
            retention_days = M.retention_days}
end

-- The retention fiber (smartcache.runtime, on every instance: it does nothing where it may not write).
function M.start()
    if M.fiber == nil or M.fiber:status() == 'dead' then
        M.fiber = fiber.create(loop)
    end
end

return M
