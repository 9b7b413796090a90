"""The event loop the broker and workers run on: asyncio's, with coalesced TCP writes.

asynctnt writes each request to its socket at once: one send(2) per stored
procedure call, which profiles put at a sixth of the service's time. Here the
first write of a loop turn still goes out at once (no added latency for a lone
request), and writes that follow it in the same turn are buffered and sent
together by one callback at the end of the turn (``call_soon``).

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
    _turn_open = False

    def write(self, data: Any) -> None:
        if self._pending is not None:
            self._pending.append(bytes(data))
        elif self._turn_open:
            self._pending = [bytes(data)]
        else:
            super().write(data)
            self._turn_open = True
            self._loop.call_soon(self._end_turn)

    def _end_turn(self) -> None:
        self._turn_open = False
        pending, self._pending = self._pending, None
        if pending and not self.is_closing():
            super().write(pending[0] if len(pending) == 1 else b"".join(pending))

    def write_eof(self) -> None:
        self._end_turn()
        super().write_eof()

    def close(self) -> None:
        self._end_turn()
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
