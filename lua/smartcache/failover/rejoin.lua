-- Rebuilding a DIVERGED instance from the leader: the proof that lets it do
-- so by itself (SC_AUTO_REJOIN), the request (a marker in the data dir, then
-- exit REJOIN_EXIT_CODE so the supervisor starts it again: sc.rejoin calls the
-- same), and the files set aside at the next start (init.lua), a bounded count.
--
-- The proof (lua/README.md, Divergence and rejoin, says it at length). Every
-- acknowledged write is synchronous, so it was on a quorum of at least a
-- majority of the configured members when it was acknowledged. The current
-- leader was elected as the best of a majority of members that had stopped
-- replicating first (their vclocks were final), and the best is at least every
-- one of them in every component. Two majorities share a member. So a row of
-- the diverged instance's *own* component beyond what the key's vclock says of
-- that component, written while this instance led (a term it recorded, with
-- its own LSN at the start), was on no member of that majority, never reached
-- a quorum, and was never acknowledged: setting it aside loses nothing anyone
-- was told had happened. Where that chain breaks, the instance stays DIVERGED
-- and alerts, for a person:
--   * rows beyond the key in another instance's component (we cannot tell who
--     acknowledged them);
--   * own rows from before the term it recorded leading (standalone rows, a
--     lost state file), or no such record;
--   * a key whose vclock cannot be read, or whose term is not after ours;
--   * a DCS that went back since it led (the key's election may have compared
--     vclocks of an etcd that had forgotten a later term);
--   * another replica set.
local fio = require('fio')
local fiber = require('fiber')
local json = require('json')
local terms = require('smartcache.failover.terms')

local M = {}
local methods = {}
M.methods = methods  -- mixed into the instance (smartcache.failover.instance)

M.MARKER = 'sc_rejoin'
M.EXIT_CODE = 75  -- EX_TEMPFAIL: "restart me"
M.ASIDE_KEEP = 3  -- set-aside directories kept (SC_ASIDE_KEEP); the oldest go first

-- May an instance with vclock mine (its id own_id) that diverged from leader
-- ({term, id, vclock, replicaset}) rebuild itself? true, or false and why.
-- led: {term, from_lsn} of the last term it led; regressed_term: the highest
-- term known when it last saw the DCS go back (nil: never); replicaset: its own.
function M.proof(a)
    local leader = a.leader
    if a.replicaset ~= nil and leader.replicaset ~= nil and a.replicaset ~= leader.replicaset then
        return false, 'another replica set'
    end
    local key = leader.vclock
    if type(key) ~= 'table' or leader.vclock_unreadable then
        return false, "the leader key's vclock cannot be read"
    end
    for id, lsn in pairs(a.mine) do
        if id ~= a.own_id and id ~= leader.id and lsn > (key[id] or 0) then
            return false, string.format('rows of instance %d beyond the key (%d > %d): another instance wrote them',
                id, lsn, key[id] or 0)
        end
    end
    local own, base = a.mine[a.own_id] or 0, key[a.own_id] or 0
    if own <= base then
        return false, 'no rows of our own beyond the key'
    end
    local led = a.led
    if type(led) ~= 'table' or tonumber(led.term) == nil or tonumber(led.from_lsn) == nil then
        return false, 'no record of a term this instance led'
    end
    if base < led.from_lsn then
        return false, string.format('own rows %d..%d include rows from before term %d, which it led from lsn %d',
            base + 1, own, led.term, led.from_lsn)
    end
    if leader.term <= led.term then
        return false, string.format("the key's term %d is not after term %d, which it led", leader.term, led.term)
    end
    if a.regressed_term ~= nil and a.regressed_term >= led.term then
        return false, string.format('the DCS went back since it led term %d', led.term)
    end
    return true, string.format('own rows %d..%d were written while it led term %d and are on no member of the '
        .. 'majority that elected term %d: never acknowledged', base + 1, own, led.term, leader.term)
end

-- Leave the marker and exit REJOIN_EXIT_CODE 0.2 s later (after an answer went out).
-- Returns the marker's path, or nil and an error.
function M.request(data_dir, reason, uuid, log)
    local marker = fio.pathjoin(data_dir, M.MARKER)
    local fh = fio.open(marker, {'O_WRONLY', 'O_CREAT', 'O_TRUNC'}, tonumber('644', 8))
    if fh == nil then
        return nil, 'cannot write ' .. marker
    end
    fh:write(json.encode({at = os.time(), reason = reason, uuid = uuid}))
    fh:fsync()
    fh:close()
    log.warn('failover: rejoin requested (%s): exiting with code %d to be restarted empty', reason, M.EXIT_CODE)
    fiber.create(function()
        fiber.name('rejoin_exit')
        fiber.sleep(0.2)  -- let the answer go out
        os.exit(M.EXIT_CODE)
    end)
    return marker
end

-- At start, with the marker present: the WAL, snapshots and the marker go to
-- <data dir>/aside-<UTC time>-<n>/, and only the newest keep of those
-- directories stay. Returns nil (no marker) or {dir, moved, removed}.
function M.set_aside(data_dir, keep, log)
    local marker = fio.pathjoin(data_dir, M.MARKER)
    if not fio.path.exists(marker) then
        return nil
    end
    local aside = fio.pathjoin(data_dir, 'aside-' .. os.date('!%Y%m%dT%H%M%S') .. '-' .. tostring(os.time() % 1000))
    assert(fio.mktree(aside), 'cannot create ' .. aside)
    local moved = 0
    for _, pattern in ipairs({'*.snap', '*.xlog', '*.vylog', '*.inprogress'}) do
        for _, f in ipairs(fio.glob(fio.pathjoin(data_dir, pattern)) or {}) do
            assert(fio.rename(f, fio.pathjoin(aside, fio.basename(f))), 'cannot move ' .. f)
            moved = moved + 1
        end
    end
    fio.rename(marker, fio.pathjoin(aside, M.MARKER))
    -- The terms stay (a rebuilt instance still knows which terms were), but not what
    -- described the data set aside: an empty instance has no rows of any term, and led
    -- nothing it still holds (else its data_term would win an election it cannot).
    local store = terms.file_store(data_dir)
    local state = store.load()
    state.data_term, state.led = 0, nil
    assert(store.save(state))
    -- The names sort by time (UTC, to the second); the oldest beyond keep go.
    local dirs = fio.glob(fio.pathjoin(data_dir, 'aside-*')) or {}
    table.sort(dirs)
    local removed = 0
    keep = math.max(1, keep or M.ASIDE_KEEP)
    for i = 1, #dirs - keep do
        if dirs[i] ~= aside and fio.rmtree(dirs[i]) then
            removed = removed + 1
        end
    end
    log.warn('rejoin: %d files set aside in %s (%d older set-aside directories removed, %d kept); ' ..
             'joining the leader empty', moved, aside, removed, math.min(#dirs, keep))
    return {dir = aside, moved = moved, removed = removed}
end

-- A DIVERGED follower: rebuild by itself when the proof holds and SC_AUTO_REJOIN
-- allows it; a sentence for the decision.
function methods:maybe_auto_rejoin(leader)
    if not self.auto_rejoin then
        return 'auto-rejoin off (SC_AUTO_REJOIN=false): cluster rejoin rebuilds it'
    end
    if self.rejoin_requested then
        return 'rebuilding: restart pending'
    end
    if self:dcs_hold_left() > 0 or self.dcs_regressed ~= nil then
        return 'not rebuilding by itself: the DCS went back'
    end
    local ok, why = M.proof({mine = self.box.vclock(), own_id = self.box.id(), leader = leader, led = self.led,
                             regressed_term = self.regressed_term, replicaset = self.box.replicaset()})
    if not ok then
        if self.rejoin_refused ~= why then
            self.rejoin_refused = why
            self.log.error('failover: DIVERGED and not rebuilding by itself: %s (smartcache-cli cluster rejoin)', why)
        end
        return 'not rebuilding by itself: ' .. why
    end
    self.rejoin_refused = nil
    self.log.warn('failover: DIVERGED: rebuilding from the leader by itself: %s', why)
    local marker, err = self.request_rejoin('auto: ' .. self.diverged)
    if marker == nil then
        return 'cannot rebuild: ' .. tostring(err)
    end
    self.rejoin_requested = true
    self.counters.auto_rejoins = self.counters.auto_rejoins + 1
    return 'rebuilding by itself: ' .. why
end

return M
