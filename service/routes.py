"""Which handler serves which message type: one table, checked against the registry by a test.

Each family of message types keeps its handlers in its own module and exports
them as ``HANDLERS``; this module joins them. PING is answered by the broker
and has no handler.
"""

from __future__ import annotations

from service import coordination, event_handlers, handlers, prewarm
from service.handlers import Handler

ALL_HANDLERS: dict[str, Handler] = {
    **handlers.HANDLERS,
    **prewarm.HANDLERS,
    **coordination.HANDLERS,
    **event_handlers.HANDLERS,
}
