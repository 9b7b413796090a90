-- The states of a bucket's row in sc_buckets, named in one place (vshard keeps
-- its own in vshard/consts.lua): the code says BUCKET.SENDING, never 'sending'.
-- The strings are what the row stores and what sc.bucket_state, sc.buckets_held
-- and the refusals answer (the service's move engine reads them).
--
-- smartcache.sharding.transitions draws the diagram and holds the transitions
-- between them (EDGES, STEPS).
local M = {}

M.BUCKET = {
    ACTIVE = 'active',        -- served here: the one shard whose calls of the bucket are answered
    SENDING = 'sending',      -- being copied away: calls answered BUCKET_MOVING, no write taken
    SENT = 'sent',            -- the copy is complete on the destination: calls answered WRONG_BUCKET (peer)
    GARBAGE = 'garbage',      -- a sent bucket whose rows are being deleted here
    RECEIVING = 'receiving',  -- a copy being written here, chunk by chunk
    ABORTING = 'aborting',    -- a copy (or whatever was here) being deleted before or instead of receiving
}

return M
