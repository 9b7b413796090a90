-- Shared set-up for the tap tests: a throw-away instance in a temp dir.
-- Each *_test.lua is runnable alone: `tarantool tests/lua/sessions_test.lua`.
local fio = require('fio')

local here = fio.dirname(fio.abspath(debug.getinfo(1, 'S').source:sub(2)))
local root = fio.pathjoin(here, '..', '..', 'lua')  -- tests/lua -> lua/
package.path = root .. '/?.lua;' .. root .. '/?/init.lua;' .. package.path

local M = {}

function M.start()
    local dir = fio.tempdir()
    box.cfg({listen = '127.0.0.1:0', memtx_dir = dir, wal_dir = dir, work_dir = dir, log_level = 2,
             memtx_memory = 64 * 1024 * 1024})
    require('smartcache.schema').upgrade()
    require('smartcache.api').register('svc', 'secret')
    require('smartcache.runtime').start()
    M.dir = dir
    return dir
end

-- Pretend the clock moved: shift every deadline of a space back by ms.
function M.age(space, deadline_field, ms, extra_fields)
    for _, t in box.space[space]:pairs() do
        local ops = {{'-', deadline_field, ms}}
        for _, f in ipairs(extra_fields or {}) do
            table.insert(ops, {'-', f, ms})
        end
        local key = {}
        for _, part in ipairs(box.space[space].index.primary.parts) do
            table.insert(key, t[part.fieldno])
        end
        box.space[space]:update(key, ops)
    end
end

-- A new live session of its own for one subtest (subtests share no data), under a fresh id as the
-- service gives them (a stored id: a random UUID to storage); returns its id.
function M.session(client_id, data)
    local id = require('smartcache.util').uuid()
    local r = _G.sc.session_create(nil, id, client_id or 'client-t', nil, 60, data)
    assert(r.status == 'OK', 'helper.session: ' .. tostring(r.status) .. ' ' .. tostring(r.message))
    return id
end

-- A session's handle ("h" + base32 of its stored id): what events, lists and the operator HTTP name it by.
function M.handle(id)
    return require('smartcache.sessions').handle(id)
end

function M.finish(test)
    local ok = test:check()
    fio.rmtree(M.dir)
    os.exit(ok and 0 or 1)
end

return M
