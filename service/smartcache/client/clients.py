"""Client library for front servers, operators and our own tests.

Two clients over one ZeroMQ DEALER socket each, with many requests in flight,
correlated by request id:

* :class:`Client` — blocking; ``call`` one request, or ``send`` many and
  ``wait`` for each.
* :class:`AsyncClient` — asyncio; ``await call(...)`` from many tasks at once.

Both have the same typed helpers (``session_get``, ``cache_put``...). A reply
with a data-level status (NOT_FOUND, CONFLICT...) is returned; a transport
error (QUEUE_FULL, EXPIRED...) raises :class:`RequestError`; no reply in time
raises :class:`RequestTimeout`. A socket belongs to the thread (or event loop)
that created the client.

Retries (``retries=N``, default 0): see :mod:`smartcache.client.base`.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import zmq
import zmq.asyncio

from smartcache.client.base import (
    DEFAULT_TIMEOUT_S,
    Reply,
    SessionId,
    backoff_s,
    decode_reply,
    request_frames,
    request_id_of,
    retryable,
    with_key,
    with_return,
)
from smartcache.client.coordination import CoordinationHelpers
from smartcache.client.interface import BlockingClient
from smartcache.client.locks import DEFAULT_LEASE_MS, DEFAULT_WAIT_MS, AsyncLock
from smartcache.client.nearcache import NearCache
from smartcache.client.nearfollow import NEAR_TYPES, Follower, attach, through, through_async
from smartcache.client.objects import DEFAULT_BLOCK, AsyncIdGenerator, CoordinationObjects
from smartcache.client.subscriber import Subscription
from smartcache.client.typed import TypedCalls
from smartcache.wire.errors import RequestError, RequestTimeout
from smartcache.wire.keys import CurveKeys

#: how long a subscription's reads of the log retry a service that does not answer
SUBSCRIBE_RETRY_S = 30.0
#: how long close() waits for a near cache's follower thread (a catch-up read in flight ends at its timeout)
FOLLOWER_JOIN_S = 6.0


def _connect(sock: zmq.Socket[Any], endpoint: str, curve: CurveKeys | None) -> None:
    """Both clients' DEALER socket made ready: unsent requests dropped at close (LINGER 0), a CURVE client of the
    server when keys are given (before connecting), connected to each of endpoint's comma-separated endpoints."""
    sock.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        curve.apply(sock)
    for e in endpoint.split(","):
        sock.connect(e.strip())


class Client(BlockingClient, CoordinationObjects):
    """A blocking client: one DEALER socket, used from one thread. ``lock``, ``counter``, ``ids``... make the
    coordination objects (service/smartcache/client/objects.py)."""

    def __init__(
        self,
        endpoint: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retries: int = 0,
        curve: CurveKeys | None = None,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        near_cache: NearCache | None = None,
    ) -> None:
        """timeout_s: per attempt; retries: see the module docstring; curve: keys for a CURVE server;
        near_cache: session reads and device lookups answered from this process's memory while the event
        stream shows them current (service/smartcache/client/nearcache.py, docs/client.md *Near cache*).

        endpoint may list several endpoints, comma-separated: the socket connects to each, and
        ZeroMQ spreads requests over them (several service instances).
        """
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.retries = retries
        self._curve = curve
        self._ctx = context or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        _connect(self._sock, endpoint, curve)
        self._ids = itertools.count(1)
        #: request id -> type name, for the requests sent and not yet waited for
        self._outstanding: dict[int, str] = {}
        self._arrived: dict[int, Reply | RequestError] = {}
        #: the near cache (None: every read goes to the service); its follower thread, if it follows a stream
        self.near_cache = near_cache
        self._follower: Follower | None = None
        if near_cache is not None:
            self._follower = attach(near_cache, self)

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
        rid = next(self._ids)
        self._sock.send_multipart(
            request_frames(
                type_name, body, request_id=rid, session_id=session_id, lifetime_ms=lifetime_ms, no_reply=no_reply
            )
        )
        if not no_reply:
            self._outstanding[rid] = type_name
        return rid

    def wait(self, request_id: int, timeout_s: float | None = None) -> Reply:
        """The reply to an earlier ``send``; replies to other requests are kept for their ``wait``."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        while request_id not in self._arrived:
            left_ms = (deadline - time.monotonic()) * 1000
            if left_ms <= 0 or not self._sock.poll(max(1, int(left_ms))):
                type_name = self._outstanding.pop(request_id, None)
                raise RequestTimeout(
                    f"no reply within {timeout:g} s", type_name=type_name, request_id=request_id, endpoint=self.endpoint
                )
            self._receive_one()
        type_name = self._outstanding.pop(request_id, None)
        result = self._arrived.pop(request_id)
        if isinstance(result, RequestError):
            raise result.located(type_name, request_id, self.endpoint)
        return result

    def twin(self, timeout_s: float | None = None) -> Client:
        """Another client of the same service, with the same keys, retries and near cache: a socket for another
        thread (a front server's request threads share one near cache this way)."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        return Client(
            self.endpoint,
            timeout_s=timeout,
            retries=self.retries,
            curve=self._curve,
            context=self._ctx,
            near_cache=self.near_cache,
        )

    def arrived(self, request_id: int) -> bool:
        """Whether the reply to an earlier ``send`` is here; reads what the socket holds, never waits."""
        while request_id not in self._arrived and self._sock.poll(0):
            self._receive_one()
        return request_id in self._arrived

    def _receive_one(self) -> None:
        frames = self._sock.recv_multipart()
        try:
            reply: Reply | RequestError = decode_reply(frames)
            rid = reply.header.request_id  # type: ignore[union-attr]
        except RequestError as e:
            rid = request_id_of(frames)
            reply = e
        if rid in self._outstanding:  # late replies to timed-out requests are dropped
            self._arrived[rid] = reply

    def call(
        self,
        type_name: str,
        body: Mapping[str, Any] | None = None,
        *,
        session_id: SessionId | None = None,
        lifetime_ms: int = 0,
        timeout_s: float | None = None,
    ) -> Reply:
        if self.near_cache is not None and type_name in NEAR_TYPES:
            return through(
                self.near_cache, self._call, type_name, body, session_id, lifetime_ms=lifetime_ms, timeout_s=timeout_s
            )
        return self._call(type_name, body, session_id=session_id, lifetime_ms=lifetime_ms, timeout_s=timeout_s)

    def _call(
        self,
        type_name: str,
        body: Mapping[str, Any] | None = None,
        *,
        session_id: SessionId | None = None,
        lifetime_ms: int = 0,
        timeout_s: float | None = None,
    ) -> Reply:
        body = with_key(type_name, body, self.retries)
        attempt = 0
        while True:
            try:
                return self.wait(self.send(type_name, body, session_id=session_id, lifetime_ms=lifetime_ms), timeout_s)
            except RequestError as e:
                if attempt >= self.retries or not retryable(e, type_name, body):
                    raise
            time.sleep(backoff_s(attempt))
            attempt += 1

    def subscribe(
        self,
        topics: Sequence[str] = (),
        from_seq: int | Mapping[str, int] | None = None,
        *,
        publishers: str,
        retry_s: float = SUBSCRIBE_RETRY_S,
    ) -> Subscription:
        """The event log as an iterator: events whose topic starts with one of ``topics`` (none: all), from
        sequence ``from_seq`` (None: from now on; a sharded cluster's as ``{shard: seq}``, each shard's log
        with its own sequence: ``Subscription.cursors``), each once and in order, gaps recovered by itself
        (service/smartcache/client/subscriber.py). ``publishers``: the services' events endpoints
        (SMARTCACHE_EVENTS_LISTEN), comma-separated. It catches up through a client of its own (``twin``,
        with this client's timeout, at most ``retry_s`` per attempt); ``retry_s``: how long a read of the log
        retries a service that does not answer (the first one, to find the head, included) before its error is
        raised."""
        twin = self.twin(timeout_s=min(self.timeout_s, retry_s))
        return Subscription(twin, publishers, topics, from_seq, curve=self._curve, context=self._ctx, retry_s=retry_s)

    def event_publish(
        self, topic: str, payload: Any = None, *, key: str | None = None, idempotency_key: str | None = None
    ) -> Reply:
        """Append an application event (topic ``app.<name>``); the reply's ``seq`` is its sequence."""
        body = {"topic": topic, "key": key, "payload": payload, "idempotency_key": idempotency_key}
        return self.call("EVENT_PUBLISH", body)

    def app_start(self, device_id: str, *, session_id: SessionId | None = None, version: str | None = None) -> None:
        """Tell the service the app started on this device; never answered."""
        self.send("APP_START", {"device_id": device_id, "version": version}, session_id=session_id, no_reply=True)

    def close(self, linger_ms: int = 200) -> None:
        """Close the socket, giving unsent messages (say, an APP_START) up to linger_ms to leave; a near cache's
        follower stops first (its own sockets closed in its thread)."""
        if self._follower is not None:
            self._follower.stop()
            self._follower.join(FOLLOWER_JOIN_S)
            self._follower = None
        self._sock.close(linger=linger_ms)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _retrying(
    attempt_once: Callable[[], Awaitable[Reply]], type_name: str, body: Mapping[str, Any] | None, retries: int
) -> Reply:
    attempt = 0
    while True:
        try:
            return await attempt_once()
        except RequestError as e:
            if attempt >= retries or not retryable(e, type_name, body):
                raise
        await asyncio.sleep(backoff_s(attempt))
        attempt += 1


class AsyncClient(TypedCalls["asyncio.Future[Reply]"]):
    """An asyncio client: one DEALER socket, many concurrent ``await call(...)``.

    ``call`` returns a future; a reader task started on first use resolves it.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retries: int = 0,
        curve: CurveKeys | None = None,
        context: zmq.asyncio.Context | None = None,
        near_cache: NearCache | None = None,
    ) -> None:
        """timeout_s: per attempt; retries: see the module docstring; curve: keys for a CURVE server;
        endpoint: one or several, comma-separated; near_cache: as the blocking client's (its follower is a thread
        with blocking sockets of its own)."""
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.retries = retries
        self._ctx = context or zmq.asyncio.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        _connect(self._sock, endpoint, curve)
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        #: request id -> type name, while its future is pending (for errors that say which request)
        self._kinds: dict[int, str] = {}
        self._reader: asyncio.Task[None] | None = None
        self.near_cache = near_cache
        #: a blocking client whose twins the near cache's follower thread uses (its own socket never sends)
        self._follows: Client | None = None
        if near_cache is not None and near_cache.follower is None and near_cache.enabled:
            self._follows = Client(endpoint, timeout_s=timeout_s, retries=retries, curve=curve)
            attach(near_cache, self._follows)

    def call(
        self,
        type_name: str,
        body: Mapping[str, Any] | None = None,
        *,
        session_id: SessionId | None = None,
        lifetime_ms: int = 0,
        timeout_s: float | None = None,
    ) -> asyncio.Future[Reply]:
        if self.near_cache is not None and type_name in NEAR_TYPES:
            return through_async(
                self.near_cache, self._call, type_name, body, session_id, lifetime_ms=lifetime_ms, timeout_s=timeout_s
            )
        return self._call(type_name, body, session_id=session_id, lifetime_ms=lifetime_ms, timeout_s=timeout_s)

    def _call(
        self,
        type_name: str,
        body: Mapping[str, Any] | None = None,
        *,
        session_id: SessionId | None = None,
        lifetime_ms: int = 0,
        timeout_s: float | None = None,
    ) -> asyncio.Future[Reply]:
        if not self.retries:
            return self._attempt(type_name, body, session_id, lifetime_ms, timeout_s)
        body = with_key(type_name, body, self.retries)
        return asyncio.ensure_future(
            _retrying(
                lambda: self._attempt(type_name, body, session_id, lifetime_ms, timeout_s),
                type_name,
                body,
                self.retries,
            )
        )

    def _attempt(
        self,
        type_name: str,
        body: Mapping[str, Any] | None,
        session_id: SessionId | None,
        lifetime_ms: int,
        timeout_s: float | None,
    ) -> asyncio.Future[Reply]:
        loop = asyncio.get_running_loop()
        if self._reader is None:
            self._reader = loop.create_task(self._read())
        rid = next(self._ids)
        fut: asyncio.Future[Reply] = loop.create_future()
        self._pending[rid] = fut
        self._kinds[rid] = type_name
        frames = request_frames(
            type_name, body, request_id=rid, session_id=session_id, lifetime_ms=lifetime_ms, no_reply=False
        )
        sent: asyncio.Future[Any] = asyncio.ensure_future(self._sock.send_multipart(frames))
        sent.add_done_callback(lambda f: self._fail(rid, f.exception()) if f.exception() else None)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        handle = loop.call_later(timeout, self._expire, rid, timeout)

        def forget(_: object) -> None:
            handle.cancel()
            self._pending.pop(rid, None)
            self._kinds.pop(rid, None)

        fut.add_done_callback(forget)
        return fut

    def _fail(self, rid: int, exc: BaseException | None) -> None:
        self._settle(rid, RequestError("INTERNAL", f"send failed: {exc}"))

    def _expire(self, rid: int, timeout_s: float) -> None:
        self._settle(rid, RequestTimeout(f"no reply within {timeout_s:g} s"))

    def _settle(self, rid: int, error: RequestError) -> None:
        """Fail a pending request with an error that says which request to which service it was."""
        fut = self._pending.get(rid)
        if fut is not None and not fut.done():
            fut.set_exception(error.located(self._kinds.get(rid), rid, self.endpoint))

    async def _read(self) -> None:
        while True:
            frames = await self._sock.recv_multipart()
            try:
                reply = decode_reply(frames)
            except RequestError as e:
                self._settle(request_id_of(frames), e)
                continue
            fut = self._pending.get(reply.header.request_id)
            if fut is not None and not fut.done():
                fut.set_result(reply)

    def lock(
        self, name: str, *, lease_ms: int = DEFAULT_LEASE_MS, wait_ms: int = DEFAULT_WAIT_MS, permits: int = 1
    ) -> AsyncLock:
        """``async with client.lock(name) as lock:`` (a semaphore with permits > 1)."""
        return AsyncLock(self, name, permits=permits, lease_ms=lease_ms, wait_ms=wait_ms)

    def ids(self, name: str, *, block: int = DEFAULT_BLOCK) -> AsyncIdGenerator:
        """An id generator: ``await ids.next()``."""
        return AsyncIdGenerator(self, name, block=block)

    async def app_start(
        self, device_id: str, *, session_id: SessionId | None = None, version: str | None = None
    ) -> None:
        """Tell the service the app started on this device; never answered."""
        await self._sock.send_multipart(
            request_frames(
                "APP_START",
                {"device_id": device_id, "version": version},
                request_id=next(self._ids),
                session_id=session_id,
                lifetime_ms=0,
                no_reply=True,
            )
        )

    def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        for fut in self._pending.values():
            if not fut.done():
                fut.cancel()
        self._sock.close(linger=0)
        if self._follows is not None:  # the near cache's follower stops with it
            nc, self.near_cache = self.near_cache, None
            if nc is not None and nc.follower is not None:
                nc.follower.stop()
                nc.follower.join(FOLLOWER_JOIN_S)
            self._follows.close(linger_ms=0)
            self._follows = None


# help(Client) and help(AsyncClient) show what each typed call returns there, not a type variable.
with_return(Client, "Reply", TypedCalls, CoordinationHelpers)
with_return(AsyncClient, "asyncio.Future[Reply]", TypedCalls, CoordinationHelpers)
