"""Storage access: stored procedure calls over one pipelined asynctnt connection.

One :class:`Storage` per worker event loop. Calls are pipelined: many worker
slots share the connection. Only procedures are called (``sc.<name>``), never
spaces. Connector exceptions are translated here into StorageUnavailable (no
connection, timeout) or ProcedureError (the procedure raised).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, NoReturn

import asynctnt
import structlog
from asynctnt.exceptions import TarantoolDatabaseError, TarantoolError

from service.config import Settings
from service.errors import ProcedureError, StorageUnavailable
from service.metrics import Metrics

log = structlog.get_logger("storage")

RECONNECT_DELAY_S = 0.5


def translate(procedure: str, e: Exception) -> NoReturn:
    """Re-raise a connector, socket or timeout error as ours; anything else unchanged."""
    if isinstance(e, TarantoolDatabaseError):
        if e.code == asynctnt.exceptions.ErrorCode.ER_READONLY:
            raise StorageUnavailable(f"{procedure}: instance is read-only") from e
        if e.code == asynctnt.exceptions.ErrorCode.ER_MEMORY_ISSUE:  # memtx full: expiry frees room, retry later
            raise StorageUnavailable(f"{procedure}: storage out of memory: {e}") from e
        raise ProcedureError(f"{procedure}: {e}") from e
    if isinstance(e, TarantoolError | OSError | asyncio.TimeoutError):
        raise StorageUnavailable(f"{procedure}: {type(e).__name__}: {e}") from e
    raise e


class Storage:
    """One connection to the Tarantool master, kept alive by a reconnect task."""

    def __init__(self, *, settings: Settings, metrics: Metrics) -> None:
        self.address = settings.tarantool[0]
        host, _, port = self.address.rpartition(":")
        self._conn = asynctnt.Connection(
            host=host,
            port=int(port),
            username=settings.tarantool_user,
            password=settings.tarantool_password,
            fetch_schema=False,
            auto_refetch_schema=False,
            connect_timeout=settings.storage_connect_timeout_s,
            reconnect_timeout=RECONNECT_DELAY_S,
            ping_timeout=0,
        )
        self._metrics = metrics
        self._connected_gauge = metrics.storage_connected.labels(self.address)
        self._calls: dict[tuple[str, str], Any] = {}
        self._latency: dict[str, Any] = {}
        self._keeper: asyncio.Task[None] | None = None

    @property
    def connected(self) -> bool:
        return bool(self._conn.is_connected)

    async def start(self) -> None:
        """Try to connect once, then keep reconnecting in the background."""
        with contextlib.suppress(StorageUnavailable):
            await self._connect()
        self._keeper = asyncio.get_running_loop().create_task(self._keep_connected())

    async def _connect(self) -> None:
        try:
            await self._conn.connect()
        except Exception as e:
            translate("connect", e)
        log.info("storage_connected", address=self.address)

    async def _keep_connected(self) -> None:
        was = self.connected
        while True:
            if not self._conn.is_connected and self._conn.state == asynctnt.connection.ConnectionState.DISCONNECTED:
                try:
                    await self._connect()
                except StorageUnavailable as e:
                    if was:
                        log.warning("storage_disconnected", address=self.address, error=str(e))
            was = self.connected
            self._connected_gauge.set(1 if was else 0)
            await asyncio.sleep(RECONNECT_DELAY_S)

    async def call(self, procedure: str, args: list[Any]) -> dict[str, Any]:
        """Call sc.<procedure>(*args); returns its result map (status still a name).

        No timeout here: the worker cancels a call when its message's lifetime
        ends (one sweep timer per loop is cheaper than one timer per call).
        """
        started = time.perf_counter()
        outcome = "error"
        try:
            if not self._conn.is_connected:
                raise StorageUnavailable(f"{procedure}: not connected to {self.address}")
            try:
                resp = await self._conn.call("sc." + procedure, [None, *args])
            except Exception as e:
                translate(procedure, e)
            result: dict[str, Any] = resp.body[0]
            outcome = result.get("status", "error")
            if outcome == "NOT_LEADER":
                raise StorageUnavailable(f"{procedure}: {self.address} may not write (not the leader)")
            return result
        except StorageUnavailable:
            outcome = "unavailable"
            raise
        except asyncio.CancelledError:
            outcome = "timeout"
            raise
        finally:
            self._observe(procedure, outcome, time.perf_counter() - started)

    def _observe(self, procedure: str, outcome: str, seconds: float) -> None:
        key = (procedure, outcome)
        counter = self._calls.get(key)
        if counter is None:
            counter = self._calls[key] = self._metrics.storage_calls.labels(procedure, outcome)
        counter.inc()
        hist = self._latency.get(procedure)
        if hist is None:
            hist = self._latency[procedure] = self._metrics.storage_latency.labels(procedure)
        hist.observe(seconds)

    async def close(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
        with contextlib.suppress(TarantoolError, OSError):
            await self._conn.disconnect()
        self._connected_gauge.set(0)
