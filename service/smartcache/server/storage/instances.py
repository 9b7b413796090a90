"""One Tarantool instance as the service sees it: a pipelined connection, kept alive and watched.

Each instance's keeper task connects, reconnects after ``RECONNECT_DELAY_S``,
and pings it (``sc.role``) every ``PING_INTERVAL_S`` (``SEARCH_INTERVAL_S``
while no leader is known): a ping unanswered within ``PING_TIMEOUT_S`` marks
it stalled (a SIGSTOPped or overloaded Tarantool keeps its socket open), and
calls then avoid it. Each state change is logged and counted. The ping's
answer is the instance's role, which :mod:`.routing` uses to find the leader,
and a sample of the offset between its clock and ours (:mod:`.clock`), which
turns a local deadline into the instance's wall-clock milliseconds.

:func:`maybe_applied` and :data:`CANNOT_WRITE` say what a Tarantool error code
means for the message (the 2.6.0 rules: lua/README.md, "Tarantool 2.6.0
workarounds").
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any

import asynctnt
import structlog
from asynctnt.exceptions import ErrorCode, TarantoolError
from asynctnt.iproto import protocol

from smartcache.server.config import Settings
from smartcache.server.metrics import Metrics
from smartcache.server.storage.clock import ClockOffset, sample

log = structlog.get_logger("storage")

RECONNECT_DELAY_S = 0.5
PING_INTERVAL_S = 0.5
#: while no leader is known (an election or a hand-over), roles are asked this often
SEARCH_INTERVAL_S = 0.05
#: a ping unanswered this long marks the instance stalled
PING_TIMEOUT_S = 1.0
#: pings of one measurement after such a refusal (a step is adopted at the second agreeing one)
RESAMPLE_PINGS = 3
#: Tarantool error code of a failed WAL write (box.error.WAL_IO)
ER_WAL_IO = 40
#: error codes that mean "rolled back, nothing done, the instance cannot write now"
CANNOT_WRITE = {
    int(ErrorCode.ER_READONLY): "read_only",
    int(ErrorCode.ER_MEMORY_ISSUE): "out_of_memory",
    ER_WAL_IO: "disk",
}
#: error codes of a synchronous write rolled back (box.error.SYNC_QUORUM_TIMEOUT = 216, SYNC_ROLLBACK =
#: 217 on 2.6.0). Not definitive there: a leader that timed out and died before its ROLLBACK reached a
#: follower may have the write confirmed by the next leader. So: OUTCOME_UNKNOWN.
_MAYBE_APPLIED = {
    int(ErrorCode.ER_SYNC_QUORUM_TIMEOUT): "sync_quorum_timeout",
    int(ErrorCode.ER_SYNC_ROLLBACK): "sync_rollback",
}


def maybe_applied(code: int, role: str | None) -> str | None:
    """The reason a failed write may still have been applied (answer OUTCOME_UNKNOWN), or None.

    A synchronous rollback is never definitive on 2.6.0 (above). Nor is ER_WAL_IO from a leader of a
    synchronous cluster: 2.6.0 fails the writes queued behind a synchronous write that was rolled back
    with ER_WAL_IO too, and those rows may be on the followers already. Standalone, ER_WAL_IO means the
    write never reached the disk: not applied."""
    reason = _MAYBE_APPLIED.get(code)
    if reason is None and code == ER_WAL_IO and role not in (None, "standalone"):
        return "disk"
    return reason


UP, STALLED, DOWN = "up", "stalled", "down"
STATES = (UP, STALLED, DOWN)


class Connection(asynctnt.Connection):  # type: ignore[misc]
    """asynctnt's connection, with the socket of a connect attempt that did not complete always closed.

    asynctnt 2.4's ``connect()`` waits for Tarantool's greeting with a ``wait_for`` that closes the
    transport on TimeoutError or an error, but not on CancelledError: when its own outer connect
    timeout fires during that wait (a Tarantool that accepts and does not greet: loading, frozen), or
    the keeper is cancelled at stop, the socket stays open until the garbage collector finds it (a
    ResourceWarning in CI once). Each attempt's protocol is remembered here, and after ``connect()``
    returns or raises, any transport it made that is not the connection's own is closed.
    """

    _attempts: list[Any]

    def protocol_factory(self, connected_fut: Any, loop: Any, cls: Any = protocol.Protocol) -> Any:
        made = super().protocol_factory(connected_fut, loop, cls)
        self._attempts.append(made)
        return made

    async def connect(self) -> Connection:
        self._attempts = []
        try:
            await super().connect()
        finally:
            attempts, self._attempts = self._attempts, []
            for made in attempts:
                transport = made.transport
                if transport is not None and transport is not self._transport and not transport.is_closing():
                    transport.close()
        return self


class Instance:
    """One Tarantool instance: its connection, kept alive and watched by a keeper task."""

    def __init__(
        self, *, address: str, settings: Settings, metrics: Metrics, on_role: Any, searching: Any = bool
    ) -> None:
        """on_role: called after each answer (or failure); searching(): True while no leader is known."""
        self.address = address
        host, _, port = address.rpartition(":")
        self.conn = Connection(
            host=host,
            port=int(port),
            username=settings.tarantool_user,
            password=settings.tarantool_password,
            fetch_schema=False,
            auto_refetch_schema=False,
            connect_timeout=settings.storage_connect_timeout_s,
            reconnect_timeout=0,  # the keeper reconnects: connect() must not loop forever
            ping_timeout=0,  # the keeper pings
        )
        self.state = DOWN
        #: the instance's last answer to sc.role() (empty until one came, and while it is not up)
        self.role: dict[str, Any] = {}
        #: its instance_uuid, kept while it is stalled or down (followers name their leader by it)
        self.uuid: str | None = None
        #: when it last answered a ping (monotonic s)
        self.answered_at = -math.inf
        #: the instance's wall clock minus ours (service/smartcache/server/storage/clock.py)
        self.clock = ClockOffset()
        self._measuring: asyncio.Task[None] | None = None
        self._on_role = on_role
        self._searching = searching
        self._wake = asyncio.Event()
        self._connected_gauge = metrics.storage_connected.labels(address)
        self._state_changes = {s: metrics.storage_state_changes.labels(address, s) for s in STATES}
        self._offset_gauge = metrics.storage_clock_offset.labels(address)
        self._keeper: asyncio.Task[None] | None = None

    @property
    def up(self) -> bool:
        """Calls may be sent: connected and answering pings."""
        return self.state == UP and bool(self.conn.is_connected)

    @property
    def writable(self) -> bool:
        """Up, and its last role answer said it may write."""
        return self.up and bool(self.role.get("writable"))

    @property
    def term(self) -> int:
        return int(self.role.get("term") or 0)

    def start(self) -> None:
        """Start the keeper; it connects in the background (never blocks the caller)."""
        self._keeper = asyncio.get_running_loop().create_task(self._keep())

    def check_now(self) -> None:
        """Ask the instance its role at once (after a refusal or a lost connection)."""
        self._wake.set()

    async def close(self) -> None:
        for task in (self._keeper, self._measuring):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        with contextlib.suppress(TarantoolError, OSError):
            await self.conn.disconnect()
        self._connected_gauge.set(0)

    @property
    def offset_ms(self) -> float:
        """The instance's wall clock minus ours, in milliseconds."""
        return self.clock.offset_ms

    def remote_ms(self, deadline: float) -> int:
        """A deadline on our monotonic clock as the instance's wall-clock milliseconds: the lifetime left,
        from the instance's time now as the best estimate of the offset has it (a jump of our own wall
        clock since the message arrived does not move it)."""
        return int((time.time() + deadline - time.monotonic()) * 1000 + self.clock.offset_ms)

    async def measure_clock(self) -> None:
        """Measure the offset again now, a few pings in a row (a step is adopted at the second agreeing
        one). One measurement at a time: every call that asks meanwhile waits for the same one."""
        if self._measuring is None or self._measuring.done():
            self._measuring = asyncio.get_running_loop().create_task(self._measure())
        await asyncio.shield(self._measuring)

    async def _measure(self) -> None:
        steps = self.clock.steps
        for _ in range(RESAMPLE_PINGS):
            sent = time.time()
            try:
                resp = await self.conn.call("sc.ping", [None], timeout=PING_TIMEOUT_S)
            except (TimeoutError, TarantoolError, OSError):
                return  # the keeper's pings will say what is wrong
            self._clock_sample(sent, time.time(), resp.body[0])
            if self.clock.steps != steps:
                return

    def _clock_sample(self, sent: float, returned: float, answer: dict[str, Any]) -> None:
        time_ms = answer.get("time_ms")
        if time_ms is None:
            return
        was, steps = self.clock.offset_ms, self.clock.steps
        if not self.clock.add(sample(sent, returned, time_ms)):
            return
        self._offset_gauge.set(self.clock.offset_ms / 1000)
        if self.clock.steps != steps:
            log.warning(
                "storage_clock_step",
                address=self.address,
                offset_ms=round(self.clock.offset_ms, 1),
                was_ms=round(was, 1),
            )

    async def _keep(self) -> None:
        while True:
            self._wake.clear()
            if not self.conn.is_connected:
                try:
                    await self.conn.connect()
                except (TimeoutError, TarantoolError, OSError) as e:
                    self._set(DOWN, error=f"{type(e).__name__}: {e}")
                    await self._pause(RECONNECT_DELAY_S)
                    continue
            await self._ping()
            await self._pause(SEARCH_INTERVAL_S if self._searching() else PING_INTERVAL_S)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    async def _ping(self) -> None:
        sent = time.time()
        try:
            resp = await self.conn.call("sc.role", [None], timeout=PING_TIMEOUT_S)
        except TimeoutError:
            self._set(STALLED, error=f"no answer to a ping within {PING_TIMEOUT_S} s")
            return
        except (TarantoolError, OSError) as e:
            self._set(DOWN, error=f"{type(e).__name__}: {e}")
            return
        role: dict[str, Any] = resp.body[0]
        self._clock_sample(sent, time.time(), role)
        self.answered_at = time.monotonic()
        self.role = role
        self.uuid = role.get("instance_uuid") or self.uuid
        self._set(UP)

    def _set(self, state: str, error: str = "") -> None:
        self._connected_gauge.set(1 if self.conn.is_connected else 0)
        if state != UP:
            self.role = {}
        if state != self.state:
            was, self.state = self.state, state
            self._state_changes[state].inc()
            if state == UP:
                log.info("storage_up", address=self.address, was=was)
            else:
                log.warning(f"storage_{state}", address=self.address, was=was, error=error)
        self._on_role()
