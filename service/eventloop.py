"""The event loop the broker and workers run on: asyncio's, with coalesced TCP writes.

asynctnt writes each request to its socket at once: one send(2) per stored
procedure call. With many calls started in one loop turn that is many
syscalls for what could be one. :class:`CoalescingLoop` gives every TCP
transport a write buffer that is flushed once per loop turn (``call_soon``),
so a turn's requests leave in one send. Latency is unchanged: the flush runs
in the same turn's ready queue, before the loop next waits.

This reaches into asyncio's selector transport (a private class); it is
pinned to CPython 3.11 with the rest of the project and covered by every
integration test.
"""

from __future__ import annotations

import asyncio
from asyncio import selector_events
from typing import Any


class _CoalescingTransport(selector_events._SelectorSocketTransport):  # type: ignore[name-defined,misc]
    _pending: list[bytes] | None = None

    def write(self, data: Any) -> None:
        if self._pending is None:
            self._pending = [bytes(data)]
            self._loop.call_soon(self._flush_pending)
        else:
            self._pending.append(bytes(data))

    def _flush_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending and not self.is_closing():
            super().write(pending[0] if len(pending) == 1 else b"".join(pending))

    def write_eof(self) -> None:
        self._flush_pending()
        super().write_eof()

    def close(self) -> None:
        self._flush_pending()
        super().close()


class CoalescingLoop(asyncio.SelectorEventLoop):
    def _make_socket_transport(
        self, sock: Any, protocol: Any, waiter: Any = None, *, extra: Any = None, server: Any = None
    ) -> Any:
        return _CoalescingTransport(self, sock, protocol, waiter, extra, server)


def run(coro: Any) -> Any:
    """asyncio.run on a CoalescingLoop."""
    with asyncio.Runner(loop_factory=CoalescingLoop) as runner:
        return runner.run(coro)
