"""A TCP proxy on 127.0.0.1 whose link a test can delay, black-hole or cut: real network faults.

Sits between a client (the service) and a server (Tarantool). Each accepted
connection is piped to the target in both directions by an asyncio loop in
a thread of its own. Modes, changed at any time from the test's thread:

* ``PASS``: bytes flow;
* ``DELAY_REPLIES``: server-to-client bytes are held back for ``delay_s``
  (the server executed the request; its answer arrives late);
* ``BLACKHOLE``: bytes in both directions are held back until the mode
  changes (a partition that keeps the TCP connection up);
* ``cut()``: every connection is closed and new ones are refused until
  ``restore()`` (a partition the peers notice).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from smartcache.devstack.stack import free_port

PASS, DELAY_REPLIES, BLACKHOLE = "pass", "delay_replies", "blackhole"
CHUNK = 65536


class TcpProxy:
    """``TcpProxy(target_port).start()``; connect to ``proxy.address``; ``stop()`` at the end."""

    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.mode = PASS
        self.delay_s = 0.0
        self._cut = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"tcpproxy-{self.port}", daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._changed: asyncio.Event | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> TcpProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(5)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def set_mode(self, mode: str, delay_s: float = 0.0) -> None:
        def apply() -> None:
            self.mode, self.delay_s = mode, delay_s
            assert self._changed is not None
            self._changed.set()
            self._changed = asyncio.Event()

        self._loop.call_soon_threadsafe(apply)

    def cut(self) -> None:
        """Close every connection and refuse new ones until restore()."""
        asyncio.run_coroutine_threadsafe(self._cut_all(), self._loop).result(5)

    def restore(self) -> None:
        self._cut = False
        self.set_mode(PASS)

    async def _listen(self) -> None:
        self._changed = asyncio.Event()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def _close(self) -> None:
        await self._cut_all()
        if self._server is not None:
            self._server.close()

    async def _cut_all(self) -> None:
        self._cut = True
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(
            self._pipe(reader, up_writer, replies=False),
            self._pipe(up_reader, writer, replies=True),
            return_exceptions=True,
        )
        for w in (writer, up_writer):
            self._writers.discard(w)
            w.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, replies: bool) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                await self._hold(replies)
                writer.write(data)
                await writer.drain()
        writer.transport.abort()

    async def _hold(self, replies: bool) -> None:
        """Wait as the current mode says before passing bytes on."""
        while self.mode == BLACKHOLE:
            assert self._changed is not None
            await self._changed.wait()
        if self.mode == DELAY_REPLIES and replies:
            await asyncio.sleep(self.delay_s)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
