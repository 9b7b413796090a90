"""Locks and semaphores for clients: a permit held for a lease that renews itself.

::

    with client.lock("pay:" + client_id) as lock:             # one payment submission per client
        core.submit(payment, fencing_token=lock.token)

    with client.semaphore("core:" + client_id, permits=4):    # at most 4 core calls per client
        core.call(...)

The lease is renewed in the background every third of the lease (a thread
with a socket of its own for the blocking client, a task for the asyncio
one). The holder counts its lease from when a renewal was *sent*, not
answered, so it never believes in a lease storage has already ended
(:attr:`Lock.valid`). If the lease passes anyway (renewals failed, the
process stalled), leaving the ``with`` block raises
:class:`~smartcache.wire.errors.LeaseLost`: give resources the fencing token
(:attr:`Lock.token`) so that they can refuse a holder that lost it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
import uuid

from smartcache.client.base import Reply
from smartcache.client.coordination import ok_reply
from smartcache.client.interface import AsyncCalls, BlockingClient
from smartcache.wire.errors import LeaseLost, NotAcquired, RequestError

DEFAULT_LEASE_MS = 10_000
DEFAULT_WAIT_MS = 5_000
#: renewed every lease / RENEW_FRACTION
RENEW_FRACTION = 3
#: a failed renewal is tried again after this long (while the lease lasts)
RENEW_RETRY_S = 0.05


def default_holder() -> str:
    """A holder id unique to this acquirer: host, process and a random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


class _Lease:
    """What a holder knows about its lease, on the monotonic clock."""

    def __init__(self, lease_ms: int) -> None:
        self.lease_s = lease_ms / 1000
        self.valid_until = 0.0
        self.lost = False

    def granted(self, sent_at: float) -> None:
        """A grant or renewal sent at sent_at was answered OK: valid until sent_at + lease."""
        self.valid_until = max(self.valid_until, sent_at + self.lease_s)

    @property
    def valid(self) -> bool:
        return not self.lost and time.monotonic() < self.valid_until


class _Held:
    """What both locks hold: the semaphore's name and terms, the fencing token, the lease."""

    def __init__(self, name: str, *, permits: int, lease_ms: int, wait_ms: int, holder: str | None) -> None:
        self.name, self.permits = name, permits
        self.lease_ms, self.wait_ms = lease_ms, wait_ms
        self.holder = holder or default_holder()
        self.token: int | None = None
        self._lease = _Lease(lease_ms)

    @property
    def valid(self) -> bool:
        """Held, and the lease provably not over (counted from when its last renewal was sent)."""
        return self.token is not None and self._lease.valid

    def check(self) -> None:
        """Raise LeaseLost unless the lease is provably valid (call before a step that needs the lock)."""
        if not self.valid:
            raise LeaseLost("LEASE_LOST", f"{self.name}: the lease is over or was lost")

    # What the replies mean, the same for both faces (they differ in how they wait, not in what they decide).

    def _granted(self, reply: Reply, sent: float) -> int:
        """An acquire's reply: the fencing token, the lease counted from when the acquire was sent; NotAcquired
        when no permit came within wait_ms, the reply's error when it is not OK."""
        if reply.status == "TIMEOUT":
            raise NotAcquired("TIMEOUT", f"{self.name}: no permit within {self.wait_ms} ms", reply.body)
        ok_reply(reply)
        self.token = int(reply.body["token"])
        self._lease = _Lease(self.lease_ms)
        self._lease.granted(sent)
        return self.token

    def _renewed(self, reply: Reply, sent: float) -> bool:
        """A renewal's reply: the lease counted again from when it was sent; False, the lease lost, when it was
        not OK (NOT_FOUND: the lease had passed)."""
        if not reply.ok:
            self._lease.lost = True
            return False
        self._lease.granted(sent)
        return True

    def _given_back(self, reply: Reply) -> None:
        """A release's reply: LeaseLost when the lease had passed before it (the permit was gone already)."""
        if reply.status == "NOT_FOUND" or self._lease.lost:
            raise LeaseLost("LEASE_LOST", f"{self.name}: the lease had passed before the release", reply.body)
        ok_reply(reply)


class Lock(_Held):
    """A permit of a semaphore (a lock when ``permits`` = 1), held for a lease that renews itself.

    ``with client.lock(name):`` acquires (waiting up to ``wait_ms``; NotAcquired
    if none came), renews every third of the lease from a thread of its own,
    and releases when the block ends. ``token`` is the fencing token.
    """

    def __init__(
        self,
        client: BlockingClient,
        name: str,
        *,
        permits: int = 1,
        lease_ms: int = DEFAULT_LEASE_MS,
        wait_ms: int = DEFAULT_WAIT_MS,
        holder: str | None = None,
    ) -> None:
        super().__init__(name, permits=permits, lease_ms=lease_ms, wait_ms=wait_ms, holder=holder)
        self.client = client
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def acquire(self) -> int:
        """Take the permit (waiting up to wait_ms); returns the fencing token. NotAcquired if none came."""
        sent = time.monotonic()
        reply = self.client.semaphore_acquire(
            self.name, self.holder, self.lease_ms, permits=self.permits, wait_ms=self.wait_ms
        )
        token = self._granted(reply, sent)
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew, name=f"lock-renew-{self.name}", daemon=True)
        self._renewer.start()
        return token

    def release(self) -> None:
        """Give the permit back; LeaseLost if the lease had passed before (the permit was gone already)."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        if self.token is None:
            return
        self.token = None
        self._given_back(self.client.semaphore_release(self.name, self.holder))

    def _renew(self) -> None:
        """Renew every lease / RENEW_FRACTION on a socket of its own, until stopped or the lease is lost."""
        interval = self._lease.lease_s / RENEW_FRACTION
        with self.client.twin(timeout_s=interval) as own:
            while not self._stop.wait(interval) and self._renew_once(own):
                pass

    def _renew_once(self, own: BlockingClient) -> bool:
        """Renew, trying again while the lease lasts; False when it is lost (or we were stopped)."""
        while not self._stop.is_set():
            sent = time.monotonic()
            if sent >= self._lease.valid_until:
                self._lease.lost = True
                return False
            try:
                reply = own.semaphore_renew(self.name, self.holder, self.lease_ms)
            except RequestError:
                self._stop.wait(RENEW_RETRY_S)
                continue
            return self._renewed(reply, sent)
        return False

    def __enter__(self) -> Lock:
        self.acquire()
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        try:
            self.release()
        except LeaseLost:
            if exc_type is None:  # never hide the block's own exception
                raise


class AsyncLock(_Held):
    """:class:`Lock` for the asyncio client: ``async with client.lock(name) as lock:``; renewed by a task."""

    def __init__(
        self,
        client: AsyncCalls,
        name: str,
        *,
        permits: int = 1,
        lease_ms: int = DEFAULT_LEASE_MS,
        wait_ms: int = DEFAULT_WAIT_MS,
        holder: str | None = None,
    ) -> None:
        super().__init__(name, permits=permits, lease_ms=lease_ms, wait_ms=wait_ms, holder=holder)
        self.client = client
        self._renewer: asyncio.Task[None] | None = None

    async def acquire(self) -> int:
        sent = time.monotonic()
        reply = await self.client.semaphore_acquire(
            self.name, self.holder, self.lease_ms, permits=self.permits, wait_ms=self.wait_ms
        )
        token = self._granted(reply, sent)
        self._renewer = asyncio.get_running_loop().create_task(self._renew())
        return token

    async def release(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
            self._renewer = None
        if self.token is None:
            return
        self.token = None
        self._given_back(await self.client.semaphore_release(self.name, self.holder))

    async def _renew(self) -> None:
        interval = self._lease.lease_s / RENEW_FRACTION
        while True:
            await asyncio.sleep(interval)
            while True:
                sent = time.monotonic()
                if sent >= self._lease.valid_until:
                    self._lease.lost = True
                    return
                try:
                    reply = await self.client.semaphore_renew(self.name, self.holder, self.lease_ms)
                except RequestError:
                    await asyncio.sleep(RENEW_RETRY_S)
                    continue
                if not self._renewed(reply, sent):
                    return
                break

    async def __aenter__(self) -> AsyncLock:
        await self.acquire()
        return self

    async def __aexit__(self, exc_type: object, *_: object) -> None:
        try:
            await self.release()
        except LeaseLost:
            if exc_type is None:
                raise
