"""Which handler serves which message type: one table, checked against the registry by a test.

Each family of message types keeps its handlers in its own module and exports
them as ``HANDLERS``; this module joins them. PING is answered by the broker
and has no handler.
"""

from __future__ import annotations

from smartcache.server.handlers import Handler, cache, coordination, devices, events, info, prewarm, sessions

ALL_HANDLERS: dict[str, Handler] = {
    **info.HANDLERS,
    **sessions.HANDLERS,
    **cache.HANDLERS,
    **devices.HANDLERS,
    **prewarm.HANDLERS,
    **coordination.HANDLERS,
    **events.HANDLERS,
}
