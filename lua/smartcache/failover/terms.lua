-- Terms that never go backward, and a DCS that goes back in time.
--
-- The term used to be the leader key's mod_revision, which an etcd restored
-- from an older snapshot, or wiped and started again, moves back (fault suite:
-- 24 -> 20, and a former leader named by a restored key took writes again:
-- 1,057 of 2,960 acknowledged sessions lost, no alarm). Now:
--
-- * the term is a counter in the leader key's value, chosen by the winner as
--   1 + the highest term it and the members it heard from have seen (each
--   member publishes its highest seen term, `seen_term`), so terms count
--   leader changes (2, 3, 4...) whatever etcd's revisions do;
-- * each instance keeps, durably, the highest term it has seen (and that
--   term's leader), the highest etcd header revision it has seen, the term of
--   the newest leader whose rows it has all (`data_term`, the election's first
--   key), the term it last led with its own LSN at the start, and the term at
--   which it last saw the DCS go back. A file in the data dir, written whole
--   (tmp file, fsync, rename, fsync of the directory), not a local space: a
--   space's rows go through the WAL, which in HA is not fsynced (wal_mode
--   write), whose disk may be full exactly when a leader steps down, and in
--   which on 2.6.0 an asynchronous row on the leader must never meet
--   synchronous ones in the limbo (compat.ASYNC_BEHIND_SYNC_ROLLS_BACK); and
--   a rebuild (sc.rejoin) sets the WAL and snapshots aside, while the file
--   stays: a rebuilt instance still knows which terms were.
--
-- A leader key whose term is below the highest seen (or equal with another
-- leader), a header revision below the highest seen, or no replica set record
-- while a replica set and terms were known: the DCS went back or forgot. Then
-- nobody acts on the stale key (no follow, no promote, its named leader
-- included), the key is removed by compare-and-swap, the instance says so
-- (status `dcs_regressed`, counter `dcs_regressions`, an error in the log),
-- and it holds elections for TTL + margin from the detection: every lease an
-- earlier leader could still believe in (t_sent of its last successful
-- keepalive + TTL - margin) has then passed, so the vclocks then compared hold
-- every row it could have had acknowledged (smartcache.failover.election).
local fiber = require('fiber')
local fio = require('fio')
local json = require('json')
local topology = require('smartcache.failover.topology')

local M = {}
local methods = {}
M.methods = methods  -- mixed into the instance (smartcache.failover.instance)

M.STATE_FILE = 'sc_failover_state.json'

-- How often a changed highest revision alone is written (a new term is written at once).
M.REV_SAVE_INTERVAL_S = 5

-- The durable state as a file in dir: load() -> table (empty when none), save(t) -> ok, err.
function M.file_store(dir)
    local path = fio.pathjoin(dir, M.STATE_FILE)
    local store = {path = path}
    function store.load()
        local fh = fio.open(path, {'O_RDONLY'})
        if fh == nil then
            return {}
        end
        local text = fh:read()
        fh:close()
        local ok, doc = pcall(json.decode, text or '')
        if not ok or type(doc) ~= 'table' then
            return {}, 'unreadable ' .. path
        end
        return doc
    end
    function store.save(t)
        local tmp = path .. '.tmp'
        local fh, err = fio.open(tmp, {'O_WRONLY', 'O_CREAT', 'O_TRUNC'}, tonumber('644', 8))
        if fh == nil then
            return false, 'cannot write ' .. tmp .. ': ' .. tostring(err)
        end
        local ok = fh:write(json.encode(t))
        ok = ok and fh:fsync()
        fh:close()
        if not ok or not fio.rename(tmp, path) then
            fio.unlink(tmp)
            return false, 'cannot write ' .. path
        end
        local dh = fio.open(dir, {'O_RDONLY'})
        if dh ~= nil then
            dh:fsync()
            dh:close()
        end
        return true
    end
    return store
end

-- An in-memory store (tests; an instance without a data dir).
function M.memory_store(initial)
    local t = initial or {}
    return {
        load = function() return t end,
        save = function(new)
            if t.fail then
                return false, 'save failed'
            end
            for k in pairs(t) do
                t[k] = nil
            end
            for k, v in pairs(new) do
                t[k] = v
            end
            return true
        end,
        data = t,
    }
end

-- At start: what the store holds.
function methods:load_terms()
    local s = self.store.load() or {}
    self.max_term = tonumber(s.term) or 0
    self.max_term_leader = s.leader_uuid
    self.max_rev = tonumber(s.rev) or 0
    self.data_term = tonumber(s.data_term) or 0
    self.led = type(s.led) == 'table' and s.led or nil
    self.regressed_term = tonumber(s.regressed_term)
    -- The newest topology seen (smartcache.failover.topology): etcd losing it changes nothing.
    self.known_topology = topology.normalize(s.topology)
    self.saved_rev = self.max_rev
    self.next_rev_save = 0
end

-- Write the durable state; ok (false: it is only in memory, and said). One save at a
-- time: the file store yields (fio), and two fibers saving at once (the control step
-- and a switchover) shared its temporary file, so one's rename found it gone and a
-- switchover failed with "cannot record the term durably". Under the lock, each save
-- writes the state as it is when its turn comes, so the last one written is the newest.
function methods:save_terms()
    if self.terms_lock == nil then
        self.terms_lock = fiber.channel(1)
    end
    self.terms_lock:put(true)
    local known = self.known_topology and json.decode(topology.encode(self.known_topology))
    local done, ok, err = pcall(self.store.save, {term = self.max_term, leader_uuid = self.max_term_leader,
                                                   rev = self.max_rev, data_term = self.data_term, led = self.led,
                                                   regressed_term = self.regressed_term, topology = known})
    self.terms_lock:get()
    if not done then
        ok, err = false, ok
    end
    if not ok then
        self.log.error('failover: cannot record the term durably: %s', tostring(err))
        self.last_error = 'save terms: ' .. tostring(err)
        return false
    end
    self.saved_rev = self.max_rev
    self.next_rev_save = self.clock() + M.REV_SAVE_INTERVAL_S
    return true
end

-- A term seen (in the leader key, or a member's seen_term): raise the highest; ok of the save.
function methods:see_term(term, leader_uuid)
    term = tonumber(term)
    if term ~= nil and term == self.max_term and self.max_term_leader == nil and leader_uuid ~= nil then
        self.max_term_leader = leader_uuid  -- a term we named before we knew who took it
        return self:save_terms()
    end
    if term == nil or term <= self.max_term then
        return true
    end
    self.max_term, self.max_term_leader = term, leader_uuid
    return self:save_terms()
end

-- We have every row the leader of term was elected with (or we lead it).
function methods:see_data_term(term)
    if term ~= nil and term > self.data_term then
        self.data_term = term
        self:save_terms()
    end
end

-- The DCS went back or forgot: say so, and hold elections for TTL + margin.
function methods:dcs_went_back(reason)
    local now = self.clock()
    self.counters.dcs_regressions = self.counters.dcs_regressions + 1
    self.dcs_regressed = reason
    self.dcs_hold_until = now + self.ttl + self.margin
    self.regressed_term = self.max_term
    -- Revisions of this etcd count from here; an election waits for fresh records of it.
    self.absent_since_rev, self.absent_since = nil, nil
    self.log.error('failover: the DCS went back or forgot its data (%s): acting on nothing it held, ' ..
                   'no election for %.2f s (every earlier lease has then passed)', reason, self.ttl + self.margin)
    if self.role == 'leader' or self.role == 'fenced' then
        self:fence('the DCS went back: ' .. reason)
        if self.role == 'fenced' then
            self.role = 'candidate'
        end
    end
    if self.following ~= nil then
        self:set_following(nil)  -- our vclock is final for the election that follows
    end
    self.next_publish = 0
    self:save_terms()
end

-- Seconds left of the election hold after the DCS went back (0: none).
function methods:dcs_hold_left()
    return math.max(0, (self.dcs_hold_until or 0) - self.clock())
end

-- An etcd header revision seen in an answer: lower than the highest seen means the
-- DCS went back (restored from an older snapshot, or wiped). Returns the reason, or nil.
function methods:see_rev(rev, what)
    rev = tonumber(rev)
    if rev == nil or rev <= 0 then
        return nil
    end
    if rev < self.max_rev then
        local reason = string.format('etcd revision %d at %s, %d seen before', rev, what, self.max_rev)
        self.max_rev = rev
        self:dcs_went_back(reason)
        return reason
    end
    self.max_rev = rev
    if rev ~= self.saved_rev and self.clock() >= self.next_rev_save then
        self:save_terms()
    end
    return nil
end

-- Is this leader key stale (a term we know was superseded)? The reason, or nil.
function methods:stale_key(leader)
    if leader.term < self.max_term then
        return string.format('leader key of term %d names %s, term %d was seen', leader.term,
            tostring(leader.uuid), self.max_term)
    end
    if leader.term == self.max_term and self.max_term_leader ~= nil and leader.uuid ~= self.max_term_leader then
        return string.format('leader key of term %d names %s, that term was led by %s', leader.term,
            tostring(leader.uuid), self.max_term_leader)
    end
    return nil
end

-- The term a winner takes: 1 + the highest it and the members it heard from have seen.
function methods:next_term(members)
    local t = self.max_term
    for _, m in pairs(members or {}) do
        t = math.max(t, tonumber(m.seen_term) or 0, tonumber(m.term) or 0)
    end
    return t + 1
end

-- Members' published seen terms raise ours (a member that heard of a newer term tells us).
function methods:merge_member_terms(members)
    local t, who = self.max_term, nil
    for _, m in pairs(members or {}) do
        local seen = tonumber(m.seen_term) or 0
        if seen > t then
            t, who = seen, m.seen_term_leader
        end
    end
    if t > self.max_term then
        self:see_term(t, who)
    end
end

return M
