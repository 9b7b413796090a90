#!/usr/bin/env tarantool
-- The event log (smartcache.events, smartcache.events.partitions): same-transaction
-- events, the gap-free sequence, committed-only reads, day partitions with an
-- injected clock, retention, the cond wake-up.
local tap = require('tap')
local fiber = require('fiber')
local helper = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'helper.lua')
helper.start()
local util = require('smartcache.util')
local events = require('smartcache.events.log')
local partitions = require('smartcache.events.partitions')
local expiry = require('smartcache.expiry')

local test = tap.test('events')
test:plan(18)

local DAY_MS = partitions.DAY_MS
local real_clock = partitions.clock

-- Every event after `after` (all topics), read at once.
local function read_all(after, topics)
    local r = sc.events_read(nil, after, topics, 1000, 0)
    assert(r.status == 'OK', r.status)
    return r.events, r
end

local function head()
    return sc.events_read(nil, nil).head_seq
end

-- Topics and keys of events, as strings, for is_deeply.
local function summary(list)
    local out = {}
    for _, e in ipairs(list) do
        table.insert(out, e.topic .. ' ' .. e.key)
    end
    return out
end

local function read_async(after, topics, wait_ms)
    local ch = fiber.channel(1)
    fiber.create(function()
        local started = fiber.clock()
        local r = sc.events_read(nil, after, topics, 100, wait_ms)
        ch:put({r, fiber.clock() - started})
    end)
    return ch
end

test:test('each change of state writes its event, numbered without gaps', function(t)
    t:plan(7)
    local h = head()
    local sid = helper.session('client-ev1')
    sc.session_update(nil, sid, {n = 1})
    sc.session_touch(nil, sid)
    sc.session_get(nil, sid)
    sc.session_delete(nil, sid)
    sc.device_bind(nil, 'dev-ev1', 'client-ev1')
    sc.device_bind(nil, 'dev-ev1', 'client-ev1')  -- the same binding again: nothing to report
    sc.device_bind(nil, 'dev-ev1', 'client-ev1b')
    sc.prewarm_acquire(nil, 'client-ev1', 1, 'owner-1', 10000, 0)
    sc.prewarm_complete(nil, 'client-ev1', 1, 'owner-1', {accounts = {}})
    local got = read_all(h)
    local handle = helper.handle(sid)  -- a session's events are keyed by its handle, never its id
    t:is_deeply(summary(got), {
        'session.created ' .. handle, 'session.updated ' .. handle, 'session.deleted ' .. handle,
        'device.bound dev-ev1', 'device.bound dev-ev1', 'products.stored client-ev1',
    }, 'created, updated, deleted (touch and get write none), bound twice, products stored')
    local gap_free = true
    for i, e in ipairs(got) do
        gap_free = gap_free and e.seq == h + i
    end
    t:ok(gap_free, 'sequences h+1, h+2, ... without gaps')
    t:is_deeply(got[1].payload, {client_id = 'client-ev1'}, 'created: the client')
    t:is_deeply(got[2].payload, {client_id = 'client-ev1', rev = 2}, 'updated: the client and the revision')
    t:is_deeply(got[5].payload, {client_id = 'client-ev1b', previous_client_id = 'client-ev1'}, 'rebound')
    t:is_deeply(got[6].payload, {data_type = 1}, 'products: the data type')
    t:ok(math.abs(got[1].time_ms - util.now_ms()) < 5000, 'time on the instance clock')
end)

test:test('expired sessions get session.expired from the sweeper, in its batch transaction', function(t)
    t:plan(3)
    local h = head()
    local a, b = helper.session('client-exp'), helper.session('client-exp')
    for _, id in ipairs({a, b}) do
        box.space.sessions:update(id, {{'=', 7, util.now_ms() - 1}})
    end
    expiry.sweep_once('sessions')
    local got = read_all(h)
    t:is(#got, 4, 'two created, two expired')
    table.sort(got, function(x, y) return x.seq < y.seq end)
    local ended = {got[3].key, got[4].key}
    table.sort(ended)
    local want = {helper.handle(a), helper.handle(b)}
    table.sort(want)
    t:is_deeply({got[3].topic, got[4].topic, ended}, {'session.expired', 'session.expired', want}, 'both expired')
    t:is_deeply(got[3].payload, {client_id = 'client-exp', reason = 'idle'}, 'the idle deadline passed')
end)

test:test('a change that fails writes no event: events already written roll back with it', function(t)
    t:plan(4)
    local a, b, c = helper.session('client-fail'), helper.session('client-fail'), helper.session('client-fail')
    local h = head()
    for _, id in ipairs({a, b, c}) do
        box.space.sessions:update(id, {{'=', 7, util.now_ms() - 1}})
    end
    -- The third delete of the sweeper's batch fails: the two events written before it must go too.
    local function refuse(old, new)
        if new == nil and old ~= nil and old[1] == c then
            error('injected failure')
        end
    end
    box.space.sessions:before_replace(refuse)
    local ok = pcall(expiry.sweep_once, 'sessions')
    box.space.sessions:before_replace(nil, refuse)
    t:ok(not ok, 'the batch failed')
    t:is(head(), h, 'no event, the sequence did not move')
    t:is(#read_all(h), 0, 'nothing to read')
    -- The same with an idempotency key whose record cannot be written after the event was.
    local function refuse_key(_, new)
        if new ~= nil and new[1] == 'key-fail' then
            error('injected failure')
        end
    end
    box.space.idempotency:before_replace(refuse_key)
    pcall(sc.event_publish, {idempotency_key = 'key-fail'}, 'app.fail', 'k', {})
    box.space.idempotency:before_replace(nil, refuse_key)
    t:is(head(), h, 'a publish whose key could not be stored wrote no event')
end)

test:test('a rolled-back transaction takes its sequence back; the next event reuses it', function(t)
    t:plan(3)
    local h = head()
    box.begin()
    events.write('app.rolled-back', 'k', nil, true)
    box.rollback()
    t:is(head(), h, 'head unchanged')
    local r = sc.event_publish(nil, 'app.after', 'k', nil)
    t:is(r.seq, h + 1, 'the next event takes the number')
    t:is(events.visible(), h + 1, 'visible again once committed')
end)

-- Both ways a transaction's events settle: util.atomic reports its end from the committing fiber,
-- a transaction it did not open (box.atomic) gets a commit and a rollback trigger.
for _, way in ipairs({{'util.atomic', util.atomic}, {'box.atomic', box.atomic}}) do
    local name, atomic = way[1], way[2]
    test:test('readers never see an event whose transaction waits for its quorum, and it may roll back ('
              .. name .. ')', function(t)
        t:plan(8)
        -- A synchronous space with a quorum of 2 and no replica: its commit waits, then rolls back.
        local probe = box.schema.space.create('sync_probe', {is_sync = true, if_not_exists = true})
        probe:create_index('primary', {if_not_exists = true})
        box.cfg({replication_synchro_quorum = 2, replication_synchro_timeout = 0.5})
        local h = head()
        local reader = read_async(h, nil, 3000)
        local writer = fiber.channel(1)
        fiber.create(function()
            writer:put({pcall(atomic, function()
                probe:replace({1})
                events.write('app.unconfirmed', 'k', nil, true)
            end)})
        end)
        fiber.sleep(0.1)
        t:is(partitions.head(), h + 1, 'the event is in the space (2.6: no MVCC)')
        t:is(head(), h, 'but the head readers see has not moved')
        t:is(#read_all(h), 0, 'and a read finds nothing')
        local ok = unpack(writer:get(5))
        t:ok(not ok, 'the transaction rolled back without its quorum')
        box.cfg({replication_synchro_quorum = 1})
        local r = sc.event_publish(nil, 'app.confirmed', 'k', nil)
        t:is(r.seq, h + 1, 'its number is taken by the next event')
        local got = reader:get(5)[1]
        t:is_deeply(summary(got.events), {'app.confirmed k'}, 'the waiting reader saw only the committed event')
        t:is(events.unsettled(), 0, 'no reader asked, and the ring keeps nothing once every transaction ended')
        t:is(events.visible(), h + 1, 'nothing left unsettled: the head is the last committed event')
        probe:drop()
    end)
end

test:test('a waiting reader is woken by the commit, not by the timer', function(t)
    t:plan(4)
    local h = head()
    local ch = read_async(h, nil, 5000)
    fiber.sleep(0.05)
    t:is(events.waiters, 1, 'one reader waits')
    sc.event_publish(nil, 'app.wake', 'k', {n = 1})
    local r, waited = unpack(ch:get(5))
    t:is_deeply(summary(r.events), {'app.wake k'}, 'the event')
    t:ok(waited < 0.2, string.format('woken at once (%.1f ms after it started waiting)', waited * 1000))
    local empty, slept = unpack(read_async(head(), nil, 200):get(5))
    t:ok(#empty.events == 0 and slept >= 0.19, 'nothing committed: an empty answer at wait_ms')
end)

test:test('rows = true: the same events as the stored tuples {seq, time_ms, topic, key, payload}', function(t)
    t:plan(3)
    local h = head()
    sc.event_publish(nil, 'app.row', 'k1', {n = 1})
    sc.event_publish(nil, 'app.row', 'k2', nil)
    local maps = read_all(h)
    local r = sc.events_read(nil, h, nil, 1000, 0, true)
    local same = #r.events == #maps
    for i, row in ipairs(r.events) do
        local m = maps[i]
        same = same and row[1] == m.seq and row[2] == m.time_ms and row[3] == m.topic and row[4] == m.key
    end
    t:ok(same, 'seq, time, topic and key in this order')
    t:is_deeply(r.events[1][5], {n = 1}, 'the payload last')
    t:is(sc.events_read(nil, h, nil, 10, 0, 'yes').status, 'BAD_REQUEST', 'rows is a boolean')
end)

test:test('topic prefixes filter; the cursor moves past what does not match', function(t)
    t:plan(5)
    local h = head()
    sc.event_publish(nil, 'app.a.x', '1', nil)
    sc.event_publish(nil, 'app.b', '2', nil)
    sc.event_publish(nil, 'app.a.y', '3', nil)
    local got, r = read_all(h, {'app.a.'})
    t:is_deeply(summary(got), {'app.a.x 1', 'app.a.y 3'}, 'two of three')
    t:is(r.last_seq, h + 3, 'last_seq: the last looked at')
    r = sc.events_read(nil, h, {'app.b', 'app.a.y'}, 1, 0)
    t:is_deeply({#r.events, r.events[1].key, r.last_seq}, {1, '2', h + 2}, 'limit 1: the cursor stops there')
    r = sc.events_read(nil, h + 3, {'app.nothing'}, 10, 0)
    t:is_deeply({#r.events, r.last_seq, r.head_seq}, {0, h + 3, h + 3}, 'nothing new')
    local ch = read_async(h + 3, {'app.wanted'}, 3000)
    sc.event_publish(nil, 'app.unwanted', 'u', nil)
    sc.event_publish(nil, 'app.wanted', 'w', nil)
    t:is_deeply(summary(ch:get(5)[1].events), {'app.wanted w'}, 'a filtered wait skips what does not match')
end)

test:test('publish checks its arguments and applies once per idempotency key', function(t)
    t:plan(6)
    t:is(sc.event_publish(nil, 'session.created', 'k', nil).status, 'BAD_REQUEST', 'system topics are not for apps')
    t:is(sc.event_publish(nil, 'app.', 'k', nil).status, 'BAD_REQUEST', 'a name after app.')
    t:is(sc.event_publish(nil, 'app.x y', 'k', nil).status, 'BAD_REQUEST', 'no spaces')
    t:is(sc.event_publish(nil, 'app.big', 'k', string.rep('x', 64 * 1024)).status, 'BAD_REQUEST', 'payload <= 64 KiB')
    local first = sc.event_publish({idempotency_key = 'pub-once'}, 'app.once', 'k', {n = 1})
    local again = sc.event_publish({idempotency_key = 'pub-once'}, 'app.once', 'k', {n = 1})
    t:is_deeply({again.seq, again.replayed}, {first.seq, true}, 'a repeat answers the same sequence')
    t:is(head(), first.seq, 'and writes nothing')
end)

test:test('a topic is 5..128 bytes in all, app. counted, of ASCII letters, digits and . _ : / -', function(t)
    t:plan(7)
    local longest = 'app.' .. string.rep('a', 124)
    t:is(sc.event_publish(nil, longest, nil, nil).status, 'OK', '128 bytes, app. included')
    local r = sc.event_publish(nil, longest .. 'a', nil, nil)
    t:is(r.status, 'BAD_REQUEST', '129 bytes')
    t:like(r.message, 'topic must be app.<name>, 5..128 bytes in all', 'the message names the field and the range')
    t:is(sc.event_publish(nil, 'app.a', nil, nil).status, 'OK', '5 bytes: the shortest')
    t:is(sc.event_publish(nil, 'app.Az09._:/-', nil, nil).status, 'OK', 'every kind of character allowed')
    t:is(sc.event_publish(nil, 'app.caf\xc3\xa9', nil, nil).status, 'BAD_REQUEST', 'a letter outside ASCII')
    t:is(sc.event_publish(nil, 'app.tab\t', nil, nil).status, 'BAD_REQUEST', 'a control character')
end)

test:test('a cursor beyond the head is read from the head: last_seq never passes head_seq', function(t)
    t:plan(4)
    local h = head()
    local r = sc.events_read(nil, h + 100, nil, 10, 0)
    t:is_deeply({r.status, #r.events, r.last_seq, r.head_seq}, {'OK', 0, h, h}, 'last_seq is the head, not the cursor')
    local ch = read_async(h + 100, nil, 3000)
    sc.event_publish(nil, 'app.beyond', 'next', nil)
    r = ch:get(5)[1]
    t:is_deeply(summary(r.events), {'app.beyond next'}, 'a waiting read from beyond the head gets the next event')
    t:is(r.last_seq, h + 1, 'and its sequence as last_seq')
    t:is(sc.events_read(nil, 2 ^ 53, nil, 10, 0).message, 'after_seq must be an integer in 0..9007199254740991',
         'after 2^53 - 1: BAD_REQUEST naming the range')
end)

test:test('bad read arguments are BAD_REQUEST; a follower answers NOT_LEADER', function(t)
    t:plan(5)
    t:is(sc.events_read(nil, -1, nil, 10, 0).status, 'BAD_REQUEST', 'after_seq >= 0')
    t:is(sc.events_read(nil, 0, {1}, 10, 0).status, 'BAD_REQUEST', 'topics are strings')
    t:is(sc.events_read(nil, 0, nil, 1001, 0).status, 'BAD_REQUEST', 'limit <= 1000')
    t:is(sc.events_read(nil, 0, nil, 10, 60001).status, 'BAD_REQUEST', 'wait_ms <= SC_MAX_WAIT_S')
    local original = util.set_writable(function() return false end)
    local r = sc.events_read(nil, 0, nil, 10, 0)
    util.set_writable(original)
    t:is(r.status, 'NOT_LEADER', 'only the writable instance answers')
end)

test:test('a day boundary starts a partition; a read crosses it seamlessly', function(t)
    t:plan(5)
    local midnight = (math.floor(util.now_ms() / DAY_MS) + 5) * DAY_MS  -- five days ahead
    partitions.clock = function() return midnight - 10 end
    local h = head()
    sc.event_publish(nil, 'app.day', 'before', nil)
    partitions.clock = function() return midnight + 10 end
    sc.event_publish(nil, 'app.day', 'after', nil)
    local before_day, after_day = partitions.day_of(midnight - 10), partitions.day_of(midnight + 10)
    t:ok(box.space['events_' .. before_day]:get(h + 1) ~= nil, 'the first in its day')
    t:ok(box.space['events_' .. after_day]:get(h + 2) ~= nil, 'the second in the next')
    t:is_deeply(summary(read_all(h)), {'app.day before', 'app.day after'}, 'one read, both, in order')
    -- A clock that goes back (a new leader's) keeps writing into the newest day: sequences stay ordered by day.
    partitions.clock = function() return midnight - DAY_MS end
    local r = sc.event_publish(nil, 'app.day', 'clock-back', nil)
    t:ok(box.space['events_' .. after_day]:get(r.seq) ~= nil, 'a clock going back sticks to the newest day')
    partitions.clock = function() return midnight + DAY_MS * 0.5 end
    partitions.maintain()
    t:ok(box.space['events_' .. partitions.day_of(midnight + DAY_MS)] ~= nil, 'maintenance creates tomorrow ahead')
end)

test:test('retention drops whole days; an older cursor gets CURSOR_TOO_OLD with the oldest kept', function(t)
    t:plan(7)
    local base = (math.floor(util.now_ms() / DAY_MS) + 20) * DAY_MS
    partitions.clock = function() return base + 1000 end
    local first = sc.event_publish(nil, 'app.ret', 'd0', nil).seq
    partitions.clock = function() return base + DAY_MS + 1000 end
    local second = sc.event_publish(nil, 'app.ret', 'd1', nil).seq
    partitions.clock = function() return base + 3 * DAY_MS + 1000 end  -- day 0 is now 3 days old, day 1 two
    partitions.maintain()
    t:is(box.space['events_' .. partitions.day_of(base)], nil, 'the day past retention is gone')
    t:ok(box.space['events_' .. partitions.day_of(base + DAY_MS)] ~= nil, 'the one within retention is kept')
    local r = sc.events_read(nil, first - 1, nil, 10, 0)
    t:is_deeply({r.status, r.oldest_seq}, {'CURSOR_TOO_OLD', first + 1}, 'a cursor before the dropped day')
    r = sc.events_read(nil, first, nil, 10, 0)
    t:is_deeply({r.status, r.events[1].seq}, {'OK', second}, 'a cursor at the floor reads on, no gap')
    -- The newest event's day is never dropped, however old.
    partitions.clock = function() return base + 30 * DAY_MS end
    partitions.maintain()
    t:ok(box.space['events_' .. partitions.day_of(base + DAY_MS)] ~= nil, 'the head day stays')
    t:is(sc.events_read(nil, second - 1, nil, 10, 0).events[1].seq, second, 'and is read')
    t:is(sc.events_stats(nil).oldest_seq, first + 1, 'stats: the oldest kept')
end)

test:test('events_stats: partitions, head, counts per topic', function(t)
    t:plan(3)
    partitions.clock = real_clock
    partitions.maintain()
    local s = sc.events_stats(nil)
    t:is(s.head_seq, head(), 'head')
    t:ok(#s.partitions >= 2, 'partitions listed')
    t:ok(s.written['session.created'] >= 1 and s.written.app >= 1, 'committed events counted per topic')
end)

test:test('SC_EVENTS=false: changes of state write no events', function(t)
    t:plan(2)
    events.enabled = false
    local h = head()
    helper.session('client-off')
    t:is(head(), h, 'a session without an event')
    t:is(sc.event_publish(nil, 'app.still', 'k', nil).seq, h + 1, 'application events still work')
    events.enabled = true
end)

test:test('in HA an event write is synchronous: a partition made inside a write is guarded at once', function(t)
    t:plan(4)
    local quorum = require('smartcache.quorum')
    quorum.enable(true)
    local day = (math.floor(util.now_ms() / DAY_MS) + 100) * DAY_MS  -- a partition nobody made ahead
    partitions.clock = function() return day end
    local h = head()
    box.cfg({replication_synchro_quorum = 2, replication_synchro_timeout = 0.2})
    -- An application event touches no other guarded space: only its new partition's guard makes it wait.
    local ok = pcall(sc.event_publish, nil, 'app.sync', 'k', nil)  -- no replica: no quorum
    box.cfg({replication_synchro_quorum = 1})
    t:ok(not ok, 'the write without its quorum failed: the partition made inside it was guarded')
    t:is(head(), h, 'and took its event (and the partition) back')
    t:is(sc.event_publish(nil, 'app.sync', 'k', nil).seq, h + 1, 'with its quorum it commits')
    t:ok(quorum.is_guarded(box.space['events_' .. partitions.day_of(day)]), 'the partition is guarded')
    quorum.enable(false)
    partitions.clock = real_clock
end)

helper.finish(test)
