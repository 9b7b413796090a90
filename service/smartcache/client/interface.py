"""What the coordination objects use of a client: the piece both sides share, below both.

The clients make the objects (``client.lock(...)``, ``client.ids(...)``: :mod:`.locks`,
:mod:`.objects`) and the objects call back into their client. Each naming the other's
class made :mod:`.clients`, :mod:`.locks` and :mod:`.objects` an import circle; now the
objects name these faces and the clients implement them, so the imports run one way:
``interface`` <- ``locks`` <- ``objects`` <- ``clients``.

* :class:`BlockingClient`: the typed calls answering a :class:`~smartcache.client.base.Reply`,
  and a request kept in flight (``send``, ``arrived``, ``wait``: an id generator's prefetch)
  or on a socket of another thread (``twin``: a lock's renewals).
  :class:`~smartcache.client.clients.Client` is the one implementation.
* :data:`AsyncCalls`: the typed calls answering a future of one
  (:class:`~smartcache.client.clients.AsyncClient`'s).
"""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, TypeAlias

from smartcache.client.base import Reply, SessionId
from smartcache.client.coordination import CoordinationHelpers
from smartcache.client.typed import TypedCalls


class BlockingClient(TypedCalls[Reply]):
    """A blocking client as the objects built on it see it (the typed calls are :class:`TypedCalls`')."""

    @abstractmethod
    def send(
        self,
        type_name: str,
        body: Mapping[str, Any] | None = None,
        *,
        session_id: SessionId | None = None,
        lifetime_ms: int = 0,
        no_reply: bool = False,
    ) -> int:
        """Send one request without waiting; returns its request id for ``wait``."""

    @abstractmethod
    def wait(self, request_id: int, timeout_s: float | None = None) -> Reply:
        """The reply to an earlier ``send``."""

    @abstractmethod
    def arrived(self, request_id: int) -> bool:
        """Whether the reply to an earlier ``send`` is here, without waiting."""

    @abstractmethod
    def twin(self, timeout_s: float | None = None) -> BlockingClient:
        """Another client of the same service: a socket for another thread."""

    @abstractmethod
    def close(self, linger_ms: int = 200) -> None:
        """Close the socket."""

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: what the asyncio objects (AsyncLock, AsyncIdGenerator) use of their client: the calls, each a future
AsyncCalls: TypeAlias = CoordinationHelpers["asyncio.Future[Reply]"]
