-- Storage-side settings, from environment variables once at load time.
local util = require('smartcache.util')

return {
    session_ttl_ms = util.env_number('SC_SESSION_TTL_S', 1800) * 1000,
    refresh_granularity_ms = util.env_number('SC_REFRESH_GRANULARITY_MS', 1000),
    max_ttl_ms = util.env_number('SC_MAX_TTL_S', 30 * 86400) * 1000,
    cache_ttl_ms = util.env_number('SC_CACHE_TTL_S', 1800) * 1000,
    prewarm_retention_ms = util.env_number('SC_PREWARM_RETENTION_S', 86400) * 1000,
    max_wait_ms = util.env_number('SC_MAX_WAIT_S', 60) * 1000,
    idempotency_ttl_ms = util.env_number('SC_IDEMPOTENCY_TTL_S', 600) * 1000,
    sweep_batch = util.env_number('SC_SWEEP_BATCH', 500),
    sweep_max_sleep_s = util.env_number('SC_SWEEP_MAX_SLEEP_S', 1),
}
