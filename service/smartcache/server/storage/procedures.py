"""Which stored procedures write: the facts about lua/smartcache/api.lua and api/ that routing needs.

A write goes to the leader only, and waits for one while none is known; a read may fall back
to the last leader (:mod:`.leadership`). A write that succeeds again after failures is logged
as writes recovered (:mod:`.outcomes`). tests/unit/test_registry.py checks :data:`WRITES`
against the ``writes`` table of api/writes.lua, which api.lua registers.
"""

from __future__ import annotations

#: procedures that change data (lua/smartcache/api.lua `writes`): only the leader takes them
WRITES = frozenset(
    {
        "session_create",
        "session_touch",
        "session_update",
        "session_delete",
        "session_rotate",
        "session_rekey",
        "session_key_check",
        "cache_put",
        "cache_delete",
        "device_bind",
        "prewarm_acquire",
        "prewarm_complete",
        "prewarm_fail",
        "counter_add",
        "counter_cas",
        "register_cas",
        "sequence_reserve",
        "semaphore_release",
        "semaphore_renew",
        "latch_create",
        "latch_count_down",
        "queue_put",
        "queue_ack",
        "queue_release",
        "event_publish",
    }
)
#: procedures that wait, then write, or write in several transactions (api.lua `waits`, but for latch_await, a
#: read, and events_read): only the leader takes them
WAITING_WRITES = frozenset({"semaphore_acquire", "queue_take", "session_delete_client"})


def is_read(procedure: str) -> bool:
    """Whether a call may fall back to the last leader while no one leads (it changes nothing)."""
    return procedure not in WRITES and procedure not in WAITING_WRITES
