-- Rebuilding a DIVERGED instance from the leader: the proof that lets it do
-- so by itself (SC_AUTO_REJOIN), the request (a marker in the data dir, then
-- exit REJOIN_EXIT_CODE so the supervisor starts it again: sc.rejoin calls the
-- same), and the files set aside at the next start (init.lua), a bounded count.
--
-- The proof (docs/storage-failover.md, Divergence and rejoin, says it at length). Every
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
--
-- The quorum's proof (M.quorum_proof), tried first, needs no history of the
-- DCS at all, only what the members show now: an acknowledged write was on a
-- quorum of at least q of the N members (q the quorum's floor, a majority),
-- so a set of N - q + 1 members none of which holds our rows beyond the key,
-- and none of which can still get them, proves that no quorum ever held them.
-- The leader holds none of them (the key's vclock is its own) and replicates
-- from nobody; a member whose record says it follows the key's leader in the
-- key's term, not DIVERGED, holds none of them either (it would be DIVERGED:
-- follow() compares every component but the leader's with the key) and gets
-- rows from the leader alone. This is what lets an old leader frozen across an
-- etcd wipe rebuild itself: the wipe sends the DCS's revision back, which the
-- election proof must refuse (the fault probe: 4 of 10 such wipes waited for
-- a person), while the leader and its follower show the proof directly.
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

-- Why rows in mine beyond the key are not all this instance's own: an instance other than
-- itself and the leader wrote rows the key does not cover (nil: none did). Both proofs refuse then.
local function others_rows(a, leader, key)
    for id, lsn in pairs(a.mine) do
        if id ~= a.own_id and id ~= leader.id and lsn > (key[id] or 0) then
            return string.format('rows of instance %d beyond the key (%d > %d): another instance wrote them',
                id, lsn, key[id] or 0)
        end
    end
    return nil
end

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
    local foreign = others_rows(a, leader, key)
    if foreign ~= nil then
        return false, foreign
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

-- The quorum's proof: may an instance with vclock mine (its id own_id) set aside
-- its own rows beyond the key of leader ({uuid, id, term, vclock})? members: the
-- records of the other members (uuid -> {role, term, reason, vclock}); count: the
-- members there are (N), floor: the synchronous quorum's floor (q). true and why,
-- or false and why.
function M.quorum_proof(a)
    local leader, key = a.leader, a.leader.vclock
    if type(key) ~= 'table' or leader.vclock_unreadable then
        return false, "the leader key's vclock cannot be read"
    end
    local own, base = a.mine[a.own_id] or 0, key[a.own_id] or 0
    if own <= base then
        return false, 'no rows of our own beyond the key'
    end
    local foreign = others_rows(a, leader, key)
    if foreign ~= nil then
        return false, foreign
    end
    local without = {leader.uuid}  -- members that hold none of own rows base+1.. and cannot get them
    for uuid, m in pairs(a.members or {}) do
        if uuid ~= leader.uuid and m.role == 'follower' and tonumber(m.term) == leader.term and m.reason == nil
                and ((m.vclock or {})[a.own_id] or 0) <= base then
            table.insert(without, uuid)
        end
    end
    local need = a.count - a.floor + 1
    if #without < need then
        return false, string.format('%d of the %d members show they lack own rows %d..%d (the leader and the '
            .. 'followers of term %d that are not DIVERGED); %d must, for no quorum of %d to have held them',
            #without, a.count, base + 1, own, leader.term, need, a.floor)
    end
    table.sort(without)
    return true, string.format('own rows %d..%d are on none of %s (the leader of term %d and its followers), so '
        .. 'on fewer than the quorum of %d of %d members: never acknowledged', base + 1, own,
        table.concat(without, ', '), leader.term, a.floor, a.count)
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

-- The members there are (N) and the quorum's floor (q), for the quorum's proof.
function methods:quorum_shape()
    local count = self.topology ~= nil and #self.topology.members or self.cluster_size
    return math.max(count, self:quorum_floor()), self:quorum_floor()
end

-- A DIVERGED follower: rebuild by itself when a proof holds and SC_AUTO_REJOIN
-- allows it; a sentence for the decision. The quorum's proof first (it needs no
-- DCS history), then the election's.
function methods:maybe_auto_rejoin(leader)
    if not self.auto_rejoin then
        return 'auto-rejoin off (SC_AUTO_REJOIN=false): cluster rejoin rebuilds it'
    end
    if self.rejoin_requested then
        return 'rebuilding: restart pending'
    end
    local mine, own_id = self.box.vclock(), self.box.id()
    local count, floor = self:quorum_shape()
    local ok, why = M.quorum_proof({mine = mine, own_id = own_id, leader = leader, members = self:members(),
                                    count = count, floor = floor})
    if not ok then
        local election_ok, election_why
        if self:dcs_hold_left() > 0 or self.dcs_regressed ~= nil then
            election_ok, election_why = false, 'the DCS went back'
        else
            election_ok, election_why = M.proof({mine = mine, own_id = own_id, leader = leader, led = self.led,
                regressed_term = self.regressed_term, replicaset = self.box.replicaset()})
        end
        if not election_ok then
            why = string.format('%s; %s. Check: does any member other than the leader hold our rows (cluster '
                .. 'status: its vclock)? If none does, smartcache-cli cluster rejoin loses nothing', why, election_why)
        else
            ok, why = true, election_why
        end
    end
    if not ok then
        if self.rejoin_refused ~= why then
            self.rejoin_refused = why
            self.log.error('failover: DIVERGED and not rebuilding by itself: %s', why)
        end
        return 'not rebuilding by itself: ' .. why
    end
    self.rejoin_refused = nil
    self.log.warn('failover: DIVERGED: rebuilding from the leader by itself: %s', why)
    return self:rebuild('auto: ' .. self.diverged, why)
end

-- Ask for our rebuild from the leader (the marker, then an exit to be restarted empty).
function methods:rebuild(reason, why)
    local marker, err = self.request_rejoin(reason)
    if marker == nil then
        return 'cannot rebuild: ' .. tostring(err)
    end
    self.rejoin_requested = true
    self.counters.auto_rejoins = self.counters.auto_rejoins + 1
    return 'rebuilding by itself: ' .. why
end

return M
