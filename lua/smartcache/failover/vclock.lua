-- Vector clocks as failover compares them: {instance id = lsn}, component 0
-- (local rows, never replicated) left out. Pure functions, no box.
local json = require('json')

local M = {}

-- box.info.vclock (or a decoded JSON one) without component 0, as a plain {id = lsn} table.
function M.clean(vc)
    local out = {}
    for id, lsn in pairs(vc or {}) do
        id = tonumber(id)
        if id ~= nil and id ~= 0 then
            out[id] = lsn
        end
    end
    return out
end

-- JSON cannot carry a sparse integer-keyed table: keys become strings.
function M.to_json(vc)
    local out = setmetatable({}, {__serialize = 'map'})
    for id, lsn in pairs(M.clean(vc)) do
        out[tostring(id)] = lsn
    end
    return out
end

function M.sum(vc)
    local s = 0
    for _, lsn in pairs(vc) do
        s = s + lsn
    end
    return s
end

-- a >= b in every component.
function M.ge(a, b)
    for id, lsn in pairs(b) do
        if (a[id] or 0) < lsn then
            return false
        end
    end
    return true
end

-- The first component, other than the leader's own, in which mine is ahead of
-- the vclock the leader was elected with; nil when there is none.
function M.ahead_of(mine, elected, leader_id)
    for id, lsn in pairs(mine) do
        if id ~= leader_id and lsn > (elected[id] or 0) then
            return id
        end
    end
    return nil
end

-- elected, raised to mine in every component but own_id's (a leader's new baseline: rebase).
function M.raised(elected, mine, own_id)
    local vc = {}
    for id, lsn in pairs(elected) do
        vc[id] = lsn
    end
    for id, lsn in pairs(mine) do
        if id ~= own_id and lsn > (vc[id] or 0) then
            vc[id] = lsn
        end
    end
    return vc
end

-- a == b in every component.
function M.equal(a, b)
    return M.ge(a, b) and M.ge(b, a)
end

-- Election order: the newer data_term first (the term of the newest leader whose
-- rows a member has all: a member that has every row of term 5's baseline beats
-- one with more rows of term 3, which can only be rows nobody acknowledged), then
-- more rows, then the smaller uuid. Within one data_term the members' histories
-- are prefixes of one leader's stream, so more rows means every row the other has.
function M.better(a, b)
    local ta, tb = tonumber(a.data_term) or 0, tonumber(b.data_term) or 0
    if ta ~= tb then
        return ta > tb
    end
    local sa, sb = M.sum(a.vclock), M.sum(b.vclock)
    if sa ~= sb then
        return sa > sb
    end
    return a.uuid < b.uuid
end

-- A member or leader record read from etcd, with a clean vclock; nil when it is not one.
function M.decode(value)
    local ok, doc = pcall(json.decode, value)
    if not ok or type(doc) ~= 'table' then
        return nil
    end
    doc.vclock = M.clean(doc.vclock)
    return doc
end

return M
