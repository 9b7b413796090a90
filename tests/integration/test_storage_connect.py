"""A connect attempt that does not complete leaves no socket open (service/smartcache/server/storage/instances.py,
Connection): against a real TCP listener that accepts and never sends Tarantool's greeting, as a
loading or frozen Tarantool does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

from asynctnt.exceptions import TarantoolError

from smartcache.server.storage.instances import Connection

#: how long the test waits for the client's side of a connection to close (a bound, not a measurement)
EOF_WITHIN_S = 5.0


@asynccontextmanager
async def silent_listener() -> AsyncIterator[tuple[int, list[asyncio.StreamReader], asyncio.Event]]:
    """A server on 127.0.0.1 that accepts every connection and never writes a byte."""
    readers: list[asyncio.StreamReader] = []
    accepted = asyncio.Event()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        readers.append(reader)
        accepted.set()
        try:
            await reader.read()  # until the client closes its side
        finally:
            writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], readers, accepted
    finally:
        server.close()
        await server.wait_closed()


async def closed_by_client(readers: list[asyncio.StreamReader]) -> bool:
    """Whether every accepted connection has seen the client close it (EOF)."""

    async def eof(reader: asyncio.StreamReader) -> bool:
        while not reader.at_eof():
            await asyncio.sleep(0.01)
        return True

    results = await asyncio.wait_for(asyncio.gather(*(eof(r) for r in readers)), EOF_WITHIN_S)
    return all(results)


def connection(port: int, timeout_s: float) -> Connection:
    return Connection(
        host="127.0.0.1",
        port=port,
        fetch_schema=False,
        auto_refetch_schema=False,
        connect_timeout=timeout_s,
        reconnect_timeout=0,
        ping_timeout=0,
    )


def test_a_connect_that_times_out_waiting_for_the_greeting_closes_every_socket_it_opened() -> None:
    async def scene() -> None:
        async with silent_listener() as (port, readers, _):
            conn = connection(port, 0.4)
            try:
                await conn.connect()
            except (TimeoutError, TarantoolError, OSError):
                pass
            else:
                raise AssertionError("a server that never greets cannot be connected to")
            # asynctnt retries within its timeout: the attempt cut by the outer timeout is the one it leaked
            assert len(readers) >= 2
            assert await closed_by_client(readers)
            assert not conn.is_connected

    asyncio.run(scene())


def test_a_connect_cancelled_while_waiting_for_the_greeting_closes_its_socket() -> None:
    async def scene() -> None:
        async with silent_listener() as (port, readers, accepted):
            conn = connection(port, 30)
            attempt = asyncio.get_running_loop().create_task(conn.connect())
            await asyncio.wait_for(accepted.wait(), EOF_WITHIN_S)
            attempt.cancel()
            with suppress(asyncio.CancelledError):
                await attempt
            assert readers
            assert await closed_by_client(readers)

    asyncio.run(scene())
