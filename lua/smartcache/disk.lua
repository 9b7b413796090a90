-- The WAL's filesystem, asked directly (statvfs), not through the WAL: how much
-- room is left, and below how much it counts as almost full; and the WAL write
-- failures procedures met. /health (smartcache.runtime), the metrics and the
-- failover disk check (smartcache.failover.box_adapter) all ask it.
local ffi = require('ffi')
local config = require('smartcache.config')

local M = {}

-- Below this much free space the instance is unhealthy, and a leader steps down
-- before writes start failing: SC_WAL_MIN_FREE_MB when set, else 64 MiB or a
-- tenth of the filesystem, whichever is smaller (a small test disk is not
-- unhealthy when empty).
local MIN_FREE_DEFAULT_BYTES = 64 * 1024 * 1024
local MIN_FREE_SHARE = 0.1
M.min_free_setting = config.wal_min_free_mb

-- Procedure calls failed by a WAL write (disk full, read-only disk, I/O errors):
-- counted by smartcache.api (count_wal_error), reported by sc.stats and /metrics.
M.wal_errors = 0

function M.count_wal_error()
    M.wal_errors = M.wal_errors + 1
end

pcall(ffi.cdef, [[
struct sc_statvfs {
    unsigned long f_bsize, f_frsize, f_blocks, f_bfree, f_bavail, f_files, f_ffree, f_favail,
                  f_fsid, f_flag, f_namemax;
    int spare[6];
};
int statvfs(const char *path, struct sc_statvfs *buf);
]])

-- Bytes an unprivileged writer may still use on the filesystem of path, and the
-- free space below which it counts as almost full; nil if unknown.
function M.free(path)
    local buf = ffi.new('struct sc_statvfs')
    if ffi.C.statvfs(path, buf) ~= 0 then
        return nil
    end
    local size = tonumber(buf.f_blocks) * tonumber(buf.f_frsize)
    local min_free = M.min_free_setting and M.min_free_setting * 1024 * 1024
        or math.min(MIN_FREE_DEFAULT_BYTES, size * MIN_FREE_SHARE)
    return tonumber(buf.f_bavail) * tonumber(buf.f_frsize), min_free
end

return M
