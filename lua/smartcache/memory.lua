-- memtx memory: what it holds, the budget of the lossy spaces, and the refusals.
--
-- Why a budget and not a ratio of box.slab.info(): memtx (2.6) hands memory to
-- its size classes in slabs of 16 MiB. A 256 KiB tuple lives in a class whose
-- slab holds 62 of them; once every slab of the quota is mapped
-- (quota_used = quota_size, 4 slabs at 64 MiB) and that class's slabs are
-- full, the allocation fails although the other slabs are mostly free:
-- measured at 64 MiB, items_used and arena_used were 52-56 % of the quota at
-- the first failure, and quota_used was 100 % already long before it (and stays
-- there after the entries expire). No ratio of box.slab.info() says "a 256 KiB
-- allocation will fail". What we can bound is what the large, lossy values
-- take: the cache and prewarm spaces together may hold at most
-- SC_CACHE_MEMORY_SHARE of memtx_memory (space:bsize(), exact at once, freed
-- at once by a delete). A write past it is refused with ER_MEMORY_ISSUE before
-- anything is written (the service answers STORAGE_UNAVAILABLE, out of
-- memory), so the sessions, events and the rest keep their room, and the
-- followers, which replicate the same rows into the same memtx_memory, are
-- not the first to run out (an applier that fails to allocate a row retries it
-- every second and never gets past it to the deletes that would free memory).
-- That needs slabs to spare: at 64 MiB (4 slabs) a follower's small size class
-- found no free slab while the leader's still had room (the fault suite's
-- memtx-full, 1 full run in 3), so below MIN_MEMTX_MEMORY start warns.
local fiber = require('fiber')
local log = require('log')
local config = require('smartcache.config')

local M = {}

M.LOSSY_SPACES = {'cache', 'prewarm'}
M.lossy_share = config.cache_memory_share  -- checked in smartcache.config
-- /health is unhealthy this long after a write was refused or failed for memory.
M.ERROR_WINDOW_S = 10

-- refused: lossy writes refused by the budget; errors: writes failed by the
-- allocator itself (ER_MEMORY_ISSUE from memtx); last_at: fiber.time() of the last of either.
M.counters = {refused = 0, errors = 0}
M.last_at = nil

function M.lossy_bytes()
    local n = 0
    for _, name in ipairs(M.LOSSY_SPACES) do
        local s = box.space[name]
        if s ~= nil then
            n = n + tonumber(s:bsize())
        end
    end
    return n
end

function M.lossy_budget()
    local quota = type(box.cfg) == 'table' and box.cfg.memtx_memory or 0
    return math.floor(M.lossy_share * quota)
end

-- Inside the writer's transaction, after its write of a lossy space: raise
-- ER_MEMORY_ISSUE (the transaction rolls back, nothing is written) when the
-- lossy spaces now hold more than their budget.
function M.check_lossy(what)
    local used, budget = M.lossy_bytes(), M.lossy_budget()
    if budget > 0 and used > budget then
        M.counters.refused = M.counters.refused + 1
        M.last_at = fiber.time()
        box.error(box.error.MEMORY_ISSUE, used - budget, 'memtx',
            string.format('%s: cache and prewarm hold their SC_CACHE_MEMORY_SHARE (%g) of memtx_memory', what,
                M.lossy_share))
    end
end

-- A procedure failed with ER_MEMORY_ISSUE (smartcache.api): count it.
function M.failed(err)
    if type(err) == 'cdata' and err.code == box.error.MEMORY_ISSUE then
        if not tostring(err.message):find('SC_CACHE_MEMORY_SHARE', 1, true) then
            M.counters.errors = M.counters.errors + 1
        end
        M.last_at = fiber.time()
    end
end

-- Tuples that left their space stay allocated while Lua holds them (a delete's
-- return value, the old tuple an on_replace trigger was given) until Lua's
-- garbage collector runs, and it runs by Lua's own allocations, not by memtx's:
-- a follower, which runs little Lua but calls the guard trigger of every space
-- (smartcache.quorum) for each replicated row, kept the expired 256 KiB values
-- of the memtx-full scenario allocated (items_used 46 % of the quota against
-- the leader's 19 %), and a follower that cannot allocate a row never gets past
-- it to the deletes that would free memory. So: when memtx holds clearly more
-- than the spaces do, collect.
M.reclaims = 0

-- What memtx holds beyond the spaces' bytes: tuple headers, size-class rounding,
-- and tuples no space holds any more (only that part changes quickly).
function M.unaccounted_bytes()
    local live = 0
    for _, s in box.space._space:pairs({512}, {iterator = 'GE'}) do
        local space = box.space[s[1]]
        if space ~= nil and space.engine == 'memtx' then
            live = live + tonumber(space:bsize())
        end
    end
    local s = box.slab.info()
    return s.items_used - live, s.quota_size
end

-- Collect when the unaccounted bytes grew past their level after the last
-- collection (headers and rounding) by max(1 MiB, 2 % of memtx_memory).
local function reclaim_loop()
    fiber.name('memtx_reclaim')
    local baseline = nil
    while true do
        local ok, extra, quota = pcall(M.unaccounted_bytes)
        if ok then
            if baseline == nil or extra - baseline > math.max(1024 * 1024, 0.02 * quota) then
                collectgarbage('collect')
                M.reclaims = M.reclaims + 1
                ok, extra = pcall(M.unaccounted_bytes)
                baseline = ok and extra or nil
            elseif extra < baseline then
                baseline = extra
            end
        end
        fiber.sleep(config.RECLAIM_INTERVAL_S)
    end
end

M.MIN_MEMTX_MEMORY = 256 * 1024 * 1024

function M.start()
    local quota = type(box.cfg) == 'table' and box.cfg.memtx_memory or 0
    if quota < M.MIN_MEMTX_MEMORY then
        log.warn('memtx_memory is %d MiB: below %d MiB (16 MiB slabs) a follower may run out of memory ' ..
            'before the cache budget refuses a write, and its replication stops (SC_MEMTX_MEMORY)',
            math.floor(quota / 1048576), M.MIN_MEMTX_MEMORY / 1048576)
    end
    if M.reclaim_fiber == nil then
        M.reclaim_fiber = fiber.create(reclaim_loop)
    end
end

-- For /health and /metrics.
function M.info()
    local s = box.slab.info()
    local quota = s.quota_size > 0 and s.quota_size or 1
    local lossy, budget = M.lossy_bytes(), M.lossy_budget()
    return {
        used_ratio = s.arena_used / quota,  -- what the 90 % rule has always looked at
        arena_used_bytes = s.arena_used, items_used_bytes = s.items_used, quota_bytes = s.quota_size,
        quota_used_bytes = s.quota_used, quota_used_ratio = s.quota_used / quota,
        lossy_bytes = lossy, lossy_budget_bytes = budget, lossy_used_ratio = budget > 0 and lossy / budget or 0,
        refused = M.counters.refused, errors = M.counters.errors,
        last_error_age_s = M.last_at and fiber.time() - M.last_at or nil,
    }
end

return M
