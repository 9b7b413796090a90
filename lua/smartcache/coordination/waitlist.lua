-- Fibers waiting for something, per key, in arrival order (FIFO).
--
-- A waiter is woken by a signal (push, no polling). A signal is remembered
-- until the waiter next waits: a waiter busy committing a transaction when
-- the signal comes (a WAL write yields) does not miss it.
--
--   local w = list:join(key)        -- at the tail
--   list:wait(w, timeout_s)         -- true: signalled; false: timed out
--   list:is_head(w)
--   list:wake_head(key)             -- the first waiter (FIFO hand-over)
--   list:wake_all(key)              -- everyone (a latch reached zero)
--   list:head(key), list:wake(w)    -- the first waiter; wake one
--   list:leave(w)                   -- when done, always; wakes the next head
--   list:in_line(key, fn, ...)      -- fn(w, ...) between a join and its leave, however fn ends
local fiber = require('fiber')
local sharding = require('smartcache.sharding')

local M = {}

local List = {}
List.__index = List

-- Every list made (weak: a list nobody holds goes), for wake_keys.
local made = setmetatable({}, {__mode = 'k'})

function M.new()
    local list = setmetatable({lists = {}, waiting = 0}, List)
    made[list] = true
    return list
end

-- Wake every waiter, of every list, of the keys for which match(key) is true (a
-- bucket that begins to move: its waiters answer BUCKET_MOVING instead of waiting on).
function M.wake_keys(match)
    for list in pairs(made) do
        for key in pairs(list.lists) do
            if match(key) then
                list:wake_all(key)
            end
        end
    end
end
sharding.on_moving(M.wake_keys)

function List:join(key)
    local l = self.lists[key]
    if l == nil then
        l = {n = 0}
        self.lists[key] = l
    end
    local w = {key = key, cond = fiber.cond(), signalled = false}
    if l.tail == nil then
        l.head, l.tail = w, w
    else
        l.tail.next, w.prev, l.tail = w, l.tail, w
    end
    l.n = l.n + 1
    self.waiting = self.waiting + 1
    return w
end

local function signal(w)
    w.signalled = true
    w.cond:signal()
end

-- Remove w; if it was first, the new first one is woken (it may proceed now).
function List:leave(w)
    local l = self.lists[w.key]
    if l == nil or w.left then
        return
    end
    w.left = true
    local was_head = l.head == w
    if w.prev ~= nil then w.prev.next = w.next else l.head = w.next end
    if w.next ~= nil then w.next.prev = w.prev else l.tail = w.prev end
    l.n = l.n - 1
    self.waiting = self.waiting - 1
    if l.n == 0 then
        self.lists[w.key] = nil
    elseif was_head then
        signal(l.head)
    end
end

-- fn(w, ...) run as a waiter of key, joined at the tail: w leaves the list however fn ends (its error
-- raised again once it has), so a waiting procedure never leaves a waiter in line behind it.
function List:in_line(key, fn, ...)
    local w = self:join(key)
    local ok, res = pcall(fn, w, ...)
    self:leave(w)
    if not ok then
        error(res, 2)
    end
    return res
end

-- Wait for a signal (one that came since the last wait counts at once).
function List.wait(_, w, timeout_s)
    if not w.signalled then
        w.cond:wait(math.max(timeout_s, 0))
    end
    local got = w.signalled
    w.signalled = false
    return got
end

function List:is_head(w)
    local l = self.lists[w.key]
    return l ~= nil and l.head == w
end

-- The first waiter of key, or nil.
function List:head(key)
    local l = self.lists[key]
    return l and l.head
end

-- Wake one waiter (whatever its place).
function List.wake(_, w)
    signal(w)
end

function List:wake_head(key)
    local l = self.lists[key]
    if l ~= nil then
        signal(l.head)
    end
end

function List:wake_all(key)
    local l = self.lists[key]
    if l == nil then
        return
    end
    local w = l.head
    while w ~= nil do
        signal(w)
        w = w.next
    end
end

function List:count(key)
    local l = self.lists[key]
    return l and l.n or 0
end

function List:total()
    return self.waiting
end

return M
