"""The handlers: one module per family of message types, a body in, stored procedure calls, a result out.

Each handler gets a validated :class:`Request` (body fields checked against the
registry) and the :class:`Context` of its worker, and returns the result map,
whose ``status`` is a status name (and ``error`` when the body is an error
object); the worker turns it into the reply (service/smartcache/server/work/execute.py).
The families: :mod:`.sessions`, :mod:`.cache`, :mod:`.devices`, :mod:`.info`,
:mod:`.prewarm` (the smart part), :mod:`.coordination`, :mod:`.events`;
:mod:`.routes` joins their tables. Handlers use storage and the core backend,
never the broker or the workers (``make lint`` checks the direction).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from smartcache.server.config import Settings
from smartcache.server.corebackend import CoreBackend
from smartcache.server.job import Job
from smartcache.server.metrics import Metrics
from smartcache.server.sessionids import SessionIds
from smartcache.server.storage import AnyStorage
from smartcache.wire import Header


@dataclass(slots=True)
class Request:
    """A validated message for its handler: the decoded header and body, and the job they came in."""

    header: Header
    body: dict[str, Any]
    #: the message in its worker slot: pass it to every storage call (its deadline, what reached storage)
    job: Job
    #: the stored id (UUID text) of the header's session, derived before any storage call ('' for none): what
    #: storage, routing and everything past the handler know a session by. The header's raw id goes nowhere.
    session: str = ""
    #: set by a handler to answer with a session id it made (SESSION_CREATE, SESSION_ROTATE): a raw id
    reply_session: bytes | None = field(default=None)

    @property
    def deadline(self) -> float:
        """Loop time (monotonic seconds) at which the message's lifetime ends (the job's)."""
        return self.job.deadline

    @property
    def idempotency_key(self) -> str | None:
        key: str | None = self.body.get("idempotency_key")
        return key


@dataclass(slots=True)
class Context:
    """What a handler may use: its worker's storage connection and backend client, settings, metrics,
    and ``enqueue`` to put an internal message into the broker's queue."""

    storage: AnyStorage
    backend: CoreBackend
    settings: Settings
    metrics: Metrics
    enqueue: Callable[[str, dict[str, Any], bytes], None]
    #: unique per worker slot use: prewarm lease owner ids are built from it
    owner_prefix: str
    #: the service's own state for INFO (version, settings, queue, workers, counts)
    introspect: Callable[[], dict[str, Any]] = field(default=dict)
    #: the session key: stored ids, new raw ids, whether the cluster agrees on the key
    sessions: SessionIds = field(default_factory=lambda: SessionIds(Settings()))


Handler = Callable[[Request, Context], Awaitable[dict[str, Any]]]


def plain(value: Any) -> Any:
    """A value the wire can carry in a body: map keys as strings, tuples as lists."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value
