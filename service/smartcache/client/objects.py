"""Coordination objects that feel native in Python, for the blocking client.

::

    otp = client.counter("otp:" + client_id, ttl_ms=300_000)     # a 5-minute window
    if otp.try_add(max=5) is None:
        refuse("too many attempts")

    doc_numbers = client.ids("payment-doc")      # 1,000 ids per round trip, the next range fetched ahead
    number = next(doc_numbers)

    with client.queue("statements").take(wait_ms=5000) as task:   # acked when the block ends, released on error
        if task is not None:
            render(task.payload)

:class:`CoordinationObjects` is mixed into :class:`~smartcache.client.clients.Client`:
``client.lock``, ``semaphore``, ``counter``, ``register``, ``ids``, ``latch``,
``queue``. Unexpected statuses raise :class:`~smartcache.wire.errors.CoordinationError`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from smartcache.client.coordination import ok_reply
from smartcache.client.interface import AsyncCalls, BlockingClient
from smartcache.client.locks import DEFAULT_LEASE_MS, DEFAULT_WAIT_MS, Lock
from smartcache.wire.errors import CoordinationError, LeaseLost, RequestError

if TYPE_CHECKING:
    from smartcache.client.base import Reply

DEFAULT_BLOCK = 1_000
MAX_BLOCK = 1_000_000


class Counter:
    """A named counter: ``add``, ``try_add`` (bounded: a rate limit), ``get``, ``compare_and_set``.

    ``ttl_ms`` applies when a call creates the counter: it then lives that long (a fixed window).
    """

    def __init__(self, client: BlockingClient, name: str, *, ttl_ms: int | None = None) -> None:
        self.client, self.name, self.ttl_ms = client, name, ttl_ms

    def add(self, delta: int = 1) -> int:
        """The value after adding delta."""
        return int(ok_reply(self.client.counter_add(self.name, delta, ttl_ms=self.ttl_ms)).body["value"])

    def try_add(self, delta: int = 1, *, min: int | None = None, max: int | None = None) -> int | None:
        """The value after adding delta, or None when that would leave [min, max] (nothing changed)."""
        reply = ok_reply(self.client.counter_add(self.name, delta, min=min, max=max, ttl_ms=self.ttl_ms), "CONFLICT")
        return None if reply.status == "CONFLICT" else int(reply.body["value"])

    def get(self) -> int:
        """The value (0 when absent or expired)."""
        reply = ok_reply(self.client.counter_get(self.name), "NOT_FOUND")
        return int(reply.body.get("value", 0)) if reply.ok else 0

    def compare_and_set(self, expected: int, value: int) -> bool:
        """Set value if the counter is expected (absent counts as 0); whether it was."""
        return ok_reply(self.client.counter_cas(self.name, expected, value, ttl_ms=self.ttl_ms), "CONFLICT").ok


class Register:
    """A named msgpack value with a revision: ``get``, ``compare_and_set``."""

    def __init__(self, client: BlockingClient, name: str, *, ttl_ms: int | None = None) -> None:
        self.client, self.name, self.ttl_ms = client, name, ttl_ms

    def get(self) -> tuple[Any, int] | None:
        """(value, revision), or None when absent."""
        reply = ok_reply(self.client.register_get(self.name), "NOT_FOUND")
        return (reply.body.get("value"), int(reply.body["rev"])) if reply.ok else None

    def compare_and_set(self, value: Any, *, expected_rev: int | None = None, expected_value: Any = None) -> int | None:
        """Write value if the register is at expected_rev (0: absent) and holds expected_value (each when
        given); the new revision, or None when it was not."""
        reply = ok_reply(
            self.client.register_cas(
                self.name, value, expected_rev=expected_rev, expected_value=expected_value, ttl_ms=self.ttl_ms
            ),
            "CONFLICT",
        )
        return int(reply.body["rev"]) if reply.ok else None


class IdGenerator(Iterator[int]):
    """Unique ids from a sequence, handed out from locally held ranges: ``next(ids)``.

    Each reservation takes ``block`` ids in one round trip. The next range is
    requested once ``prefetch`` of the current one is used (sent, not waited
    for), so a steady consumer never waits for storage; when a range runs out
    before the next one arrived, the block doubles (up to ``max_block``). Ids
    are unique across clients, service instances, restarts and failover; ids
    of a range this process does not use (it stopped) are never handed out
    (gaps). A failed reservation is simply made again: a range lost in flight
    is a gap, never a duplicate, so no idempotency key is needed.
    """

    def __init__(
        self,
        client: BlockingClient,
        name: str,
        *,
        block: int = DEFAULT_BLOCK,
        prefetch: float = 0.5,
        max_block: int = MAX_BLOCK,
    ) -> None:
        if not 0 < prefetch <= 1 or block < 1 or max_block < block:
            raise ValueError("need 0 < prefetch <= 1 and 1 <= block <= max_block")
        self.client, self.name = client, name
        self.block, self.prefetch, self.max_block = block, prefetch, max_block
        self.reservations = 0
        self._next, self._last = 1, 0  # empty
        self._prefetch_at: int | None = None
        self._pending: int | None = None  # request id of the reservation in flight

    def __iter__(self) -> IdGenerator:
        return self

    def __next__(self) -> int:
        n = self._next
        if n > self._last:
            return self._refill()
        self._next = n + 1
        if n == self._prefetch_at:
            self._request()
        return n

    def _request(self) -> None:
        self._pending = self.client.send("SEQUENCE_RESERVE", {"name": self.name, "count": self.block})

    def _refill(self) -> int:
        if self._pending is None:
            self._request()
        elif not self.client.arrived(self._pending) and self.block < self.max_block:
            self.block = min(self.block * 2, self.max_block)  # we had to wait: ask for more next time
        rid, self._pending = self._pending, None
        assert rid is not None
        try:
            reply = self.client.wait(rid)
        except RequestError:
            reply = self.client.sequence_reserve(self.name, self.block)  # with the client's own retries
        body = ok_reply(reply).body
        first, last = int(body["first"]), int(body["last"])
        self.reservations += 1
        self._next, self._last = first + 1, last
        self._prefetch_at = first + max(0, min(last - first, int((last - first + 1) * self.prefetch)))
        if self._prefetch_at == first:
            self._request()
            self._prefetch_at = None
        return first


class AsyncIdGenerator:
    """:class:`IdGenerator` for the asyncio client: ``await ids.next()``."""

    def __init__(self, client: AsyncCalls, name: str, *, block: int = DEFAULT_BLOCK, prefetch: float = 0.5) -> None:
        self.client, self.name, self.block, self.prefetch = client, name, block, prefetch
        self._next, self._last = 1, 0
        self._prefetch_at: int | None = None
        self._pending: asyncio.Future[Reply] | None = None

    async def next(self) -> int:
        n = self._next
        if n > self._last:
            if self._pending is None:
                self._pending = self.client.sequence_reserve(self.name, self.block)
            pending, self._pending = self._pending, None
            try:
                reply = await pending
            except RequestError:
                reply = await self.client.sequence_reserve(self.name, self.block)
            body = ok_reply(reply).body
            n, self._last = int(body["first"]), int(body["last"])
            self._prefetch_at = n + int((self._last - n + 1) * self.prefetch)
        self._next = n + 1
        if n == self._prefetch_at and self._pending is None:
            self._pending = self.client.sequence_reserve(self.name, self.block)
        return n


class Latch:
    """A count-down latch: ``create``, ``count_down``, ``wait``, ``count``."""

    def __init__(self, client: BlockingClient, name: str) -> None:
        self.client, self.name = client, name

    def create(self, count: int, *, ttl_ms: int | None = None) -> bool:
        """Create it with count; False if a live latch of that name exists (it is left as it is)."""
        return ok_reply(self.client.latch_create(self.name, count, ttl_ms=ttl_ms), "ALREADY_EXISTS").ok

    def count_down(self, n: int = 1) -> int:
        """The count after taking n off."""
        return int(ok_reply(self.client.latch_count_down(self.name, n)).body["count"])

    def wait(self, wait_ms: int) -> bool:
        """Whether the count reached 0 within wait_ms (CoordinationError NOT_FOUND: no such latch)."""
        return ok_reply(self.client.latch_await(self.name, wait_ms), "TIMEOUT").ok

    @property
    def count(self) -> int:
        return int(ok_reply(self.client.latch_get(self.name)).body["count"])


@dataclass
class Task:
    """A taken task: ack it when done, release it to give it back (or let its time-to-run pass)."""

    queue: TaskQueue
    task_id: int
    payload: Any
    attempt: int
    priority: int

    def ack(self) -> None:
        """Done. LeaseLost if someone else took it since (this take's time-to-run had passed)."""
        self.queue._settle(self.queue.client.queue_ack(self.queue.name, self.task_id, self.attempt))

    def release(self, delay_ms: int | None = None) -> None:
        """Back to ready (after delay_ms)."""
        reply = self.queue.client.queue_release(self.queue.name, self.task_id, self.attempt, delay_ms=delay_ms)
        self.queue._settle(reply)


class TaskQueue:
    """A named task queue: ``put``, ``take`` (a context manager: ack on success, release on error), ``stats``."""

    def __init__(self, client: BlockingClient, name: str) -> None:
        self.client, self.name = client, name

    def put(
        self, payload: Any, *, priority: int | None = None, delay_ms: int | None = None, ttl_ms: int | None = None
    ) -> int:
        reply = self.client.queue_put(self.name, payload, priority=priority, delay_ms=delay_ms, ttl_ms=ttl_ms)
        return int(ok_reply(reply).body["task_id"])

    def take_task(self, *, wait_ms: int = 0, ttr_ms: int | None = None) -> Task | None:
        """The next task, or None when none was ready within wait_ms."""
        reply = ok_reply(self.client.queue_take(self.name, wait_ms=wait_ms, ttr_ms=ttr_ms), "TIMEOUT")
        if not reply.ok:
            return None
        b = reply.body
        return Task(self, int(b["task_id"]), b.get("payload"), int(b["attempt"]), int(b["priority"]))

    @contextlib.contextmanager
    def take(self, *, wait_ms: int = 0, ttr_ms: int | None = None) -> Iterator[Task | None]:
        """``with queue.take(wait_ms=...) as task:`` None, or a task acked when the block ends, released on error."""
        task = self.take_task(wait_ms=wait_ms, ttr_ms=ttr_ms)
        if task is None:
            yield None
            return
        try:
            yield task
        except BaseException:
            with contextlib.suppress(CoordinationError, RequestError):
                task.release()
            raise
        task.ack()

    def stats(self) -> dict[str, int]:
        body = ok_reply(self.client.queue_stats(self.name)).body
        return {k: int(body[k]) for k in ("ready", "taken", "delayed", "waiters")}

    def _settle(self, reply: Reply) -> None:
        if reply.status == "CONFLICT":
            raise LeaseLost("CONFLICT", f"{self.name}: the task was taken again since", reply.body)
        ok_reply(reply)


class CoordinationObjects:
    """The native objects, as methods of the blocking client."""

    def lock(
        self, name: str, *, lease_ms: int = DEFAULT_LEASE_MS, wait_ms: int = DEFAULT_WAIT_MS, holder: str | None = None
    ) -> Lock:
        """``with client.lock(name) as lock:`` — one holder at a time; ``lock.token`` fences."""
        return Lock(self._self(), name, lease_ms=lease_ms, wait_ms=wait_ms, holder=holder)

    def semaphore(
        self,
        name: str,
        permits: int,
        *,
        lease_ms: int = DEFAULT_LEASE_MS,
        wait_ms: int = DEFAULT_WAIT_MS,
        holder: str | None = None,
    ) -> Lock:
        """``with client.semaphore(name, 4):`` — at most 4 holders at a time."""
        return Lock(self._self(), name, permits=permits, lease_ms=lease_ms, wait_ms=wait_ms, holder=holder)

    def counter(self, name: str, *, ttl_ms: int | None = None) -> Counter:
        return Counter(self._self(), name, ttl_ms=ttl_ms)

    def register(self, name: str, *, ttl_ms: int | None = None) -> Register:
        return Register(self._self(), name, ttl_ms=ttl_ms)

    def ids(
        self, name: str, *, block: int = DEFAULT_BLOCK, prefetch: float = 0.5, max_block: int = MAX_BLOCK
    ) -> IdGenerator:
        """An id generator: ``next(ids)``; ``block`` ids per round trip."""
        return IdGenerator(self._self(), name, block=block, prefetch=prefetch, max_block=max_block)

    def latch(self, name: str) -> Latch:
        return Latch(self._self(), name)

    def queue(self, name: str) -> TaskQueue:
        return TaskQueue(self._self(), name)

    def _self(self) -> BlockingClient:
        return self  # type: ignore[return-value]  # mixed into Client (a BlockingClient) only
