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

Retries (``retries=N``, default 0): a request refused without being executed
(QUEUE_FULL, EXPIRED, STORAGE_UNAVAILABLE, SHUTTING_DOWN) is sent again, after
a short backoff, up to N times. One whose outcome is unknown (OUTCOME_UNKNOWN,
INTERNAL, no reply in time) is sent again only when repeating it is safe: the
type is idempotent, or the request carries an ``idempotency_key``. With
retries on, every write without a key gets one (a random UUID, the same for
all its attempts), so storage applies it once however often it is sent.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import zmq
import zmq.asyncio
import zmq.auth

from service.coordination_client import CoordinationHelpers
from service.coordination_locks import DEFAULT_LEASE_MS, DEFAULT_WAIT_MS, AsyncLock
from service.coordination_objects import DEFAULT_BLOCK, AsyncIdGenerator, CoordinationObjects
from service.errors import ProtocolError, RequestError, RequestTimeout
from service.protocol import (
    FLAG_DATA_ERROR,
    FLAG_NO_REPLY,
    HEADER_STRUCT,
    NO_SESSION,
    REGISTRY,
    Header,
    decode_body,
    decode_header,
    encode_body,
    encode_header,
    frame_request_id,
)
from service.subscriber import Subscription

DEFAULT_TIMEOUT_S = 5.0
RETRY_BACKOFF_FIRST_S = 0.02
RETRY_BACKOFF_MAX_S = 0.5
#: transport errors that say the request was not executed (and was not malformed): always safe to send again
RETRY_ALWAYS = frozenset(e for e, done in REGISTRY.executed.items() if done == "no") - REGISTRY.final_errors
#: outcomes that may have been executed: safe to send again only for idempotent requests
RETRY_IF_IDEMPOTENT = frozenset(e for e, done in REGISTRY.executed.items() if done == "unknown") | {"TIMEOUT"}

SessionId = bytes | uuid.UUID | str


def session_bytes(sid: SessionId | None) -> bytes:
    """Accept a UUID, its string form, or 16 raw bytes; None is 'no session'."""
    if sid is None:
        return NO_SESSION
    if isinstance(sid, uuid.UUID):
        return sid.bytes
    if isinstance(sid, str):
        return uuid.UUID(sid).bytes
    if len(sid) != 16:
        raise ValueError(f"session id must be 16 bytes, got {len(sid)}")
    return sid


@dataclass(frozen=True, slots=True)
class CurveKeys:
    """A CURVE client's keys (z85): the server's public key and our own pair (SECURITY.md)."""

    server_public: bytes
    public: bytes
    secret: bytes

    @classmethod
    def from_files(cls, server_key_file: str | Path, key_file: str | Path) -> CurveKeys:
        """From ZeroMQ certificate files: the server's public one and our secret one (smartcache-cli keys generate)."""
        server_public, _ = zmq.auth.load_certificate(server_key_file)
        public, secret = zmq.auth.load_certificate(key_file)
        if secret is None:
            raise ValueError(f"{key_file} holds no secret key (use the *.key_secret file)")
        return cls(server_public, public, secret)

    def apply(self, sock: zmq.Socket[Any]) -> None:
        """Make sock (before connect) a CURVE client of the server."""
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret


@dataclass(frozen=True, slots=True)
class Reply:
    """A decoded reply: the header and the body map."""

    header: Header
    body: dict[str, Any]

    @property
    def status(self) -> str:
        """The reply status name (``OK``, ``NOT_FOUND``...)."""
        return REGISTRY.status_names.get(self.body.get("status", -1), "UNKNOWN")

    @property
    def ok(self) -> bool:
        return self.status == "OK"

    @property
    def data_error(self) -> bool:
        return bool(self.header.flags & FLAG_DATA_ERROR)

    @property
    def session_id(self) -> uuid.UUID | None:
        sid = self.header.session_id
        return None if sid == NO_SESSION else uuid.UUID(bytes=sid)


def _decode_reply(frames: list[bytes]) -> Reply:
    if frames and frames[0] == b"":  # REQ-style empty delimiter
        frames = frames[1:]
    if len(frames) != 2:
        raise RequestError("BAD_FRAMES", f"reply has {len(frames)} frames, expected 2")
    try:
        reply = Reply(decode_header(frames[0], check_type=False), decode_body(frames[1]))
    except ProtocolError as e:
        raise RequestError(e.transport_error, f"undecodable reply: {e}") from e
    if reply.header.transport_error:
        name = REGISTRY.transport_error_names[reply.header.transport_error]
        raise RequestError(name, str(reply.body.get("message", "")), reply.body)
    return reply


def is_write(type_name: str) -> bool:
    """A type that changes data: it takes an idempotency_key (registry)."""
    return any(f.name == "idempotency_key" for f in REGISTRY.types[type_name].request)


def _retryable(error: RequestError, type_name: str, body: Mapping[str, Any] | None) -> bool:
    if error.transport_error in RETRY_ALWAYS:
        return True
    if error.transport_error not in RETRY_IF_IDEMPOTENT:
        return False
    return REGISTRY.types[type_name].idempotent or bool(body and body.get("idempotency_key"))


def _with_key(type_name: str, body: Mapping[str, Any] | None, retries: int) -> Mapping[str, Any] | None:
    """With retries on, a write gets an idempotency key for all its attempts."""
    if retries and is_write(type_name) and not (body and body.get("idempotency_key")):
        return {**(body or {}), "idempotency_key": uuid.uuid4().hex}
    return body


def _backoff_s(attempt: int) -> float:
    return float(min(RETRY_BACKOFF_MAX_S, RETRY_BACKOFF_FIRST_S * 2**attempt))


def _frames(
    type_name: str,
    body: Mapping[str, Any] | None,
    *,
    request_id: int,
    session_id: SessionId | None,
    lifetime_ms: int,
    no_reply: bool,
) -> list[bytes]:
    spec = REGISTRY.types[type_name]
    header = Header.request(
        spec.id,
        request_id=request_id,
        session_id=session_bytes(session_id),
        lifetime_ms=lifetime_ms,
        flags=FLAG_NO_REPLY if no_reply else 0,
    )
    clean = {k: v for k, v in (body or {}).items() if v is not None}
    return [encode_header(header), encode_body(clean)]


R = TypeVar("R")


class _Helpers(CoordinationHelpers[R]):
    """Typed helpers, one per message type; all go through ``call`` (coordination's in CoordinationHelpers)."""

    @abstractmethod
    def call(
        self,
        type_name: str,
        body: Mapping[str, Any] | None = None,
        *,
        session_id: SessionId | None = None,
        lifetime_ms: int = 0,
        timeout_s: float | None = None,
    ) -> R: ...

    def ping(self) -> R:
        return self.call("PING")

    def info(self) -> R:
        return self.call("INFO")

    def session_create(
        self,
        client_id: str,
        *,
        data: Any = None,
        ttl_s: int | None = None,
        version: str | None = None,
        session_id: SessionId | None = None,
        idempotency_key: str | None = None,
    ) -> R:
        body = {
            "client_id": client_id,
            "data": data,
            "ttl_s": ttl_s,
            "version": version,
            "idempotency_key": idempotency_key,
        }
        return self.call("SESSION_CREATE", body, session_id=session_id)

    def session_get(self, session_id: SessionId) -> R:
        return self.call("SESSION_GET", session_id=session_id)

    def session_touch(self, session_id: SessionId, *, idempotency_key: str | None = None) -> R:
        return self.call("SESSION_TOUCH", {"idempotency_key": idempotency_key}, session_id=session_id)

    def session_update(
        self,
        session_id: SessionId,
        data: Any,
        *,
        expected_rev: int | None = None,
        version: str | None = None,
        idempotency_key: str | None = None,
    ) -> R:
        body = {"data": data, "expected_rev": expected_rev, "version": version, "idempotency_key": idempotency_key}
        return self.call("SESSION_UPDATE", body, session_id=session_id)

    def session_delete(self, session_id: SessionId, *, idempotency_key: str | None = None) -> R:
        return self.call("SESSION_DELETE", {"idempotency_key": idempotency_key}, session_id=session_id)

    def session_list(self, client_id: str) -> R:
        return self.call("SESSION_LIST", {"client_id": client_id})

    def cache_put(
        self,
        key: str,
        data: Any,
        *,
        session_id: SessionId | None = None,
        data_type: int | None = None,
        ttl_s: int | None = None,
        idempotency_key: str | None = None,
    ) -> R:
        body = {"key": key, "data": data, "data_type": data_type, "ttl_s": ttl_s, "idempotency_key": idempotency_key}
        return self.call("CACHE_PUT", body, session_id=session_id)

    def cache_get(self, key: str, *, session_id: SessionId | None = None) -> R:
        return self.call("CACHE_GET", {"key": key}, session_id=session_id)

    def cache_delete(self, key: str, *, session_id: SessionId | None = None, idempotency_key: str | None = None) -> R:
        return self.call("CACHE_DELETE", {"key": key, "idempotency_key": idempotency_key}, session_id=session_id)

    def device_bind(self, device_id: str, client_id: str, *, idempotency_key: str | None = None) -> R:
        body = {"device_id": device_id, "client_id": client_id, "idempotency_key": idempotency_key}
        return self.call("DEVICE_BIND", body)

    def device_lookup(self, device_id: str) -> R:
        return self.call("DEVICE_LOOKUP", {"device_id": device_id})

    def products_get(self, client_id: str, data_type: int, *, version: str | None = None) -> R:
        return self.call("PRODUCTS_GET", {"client_id": client_id, "data_type": data_type, "version": version})


class Client(_Helpers[Reply], CoordinationObjects):
    """A blocking client: one DEALER socket, used from one thread. ``lock``, ``counter``, ``ids``... make the
    coordination objects (service/coordination_objects.py)."""

    def __init__(
        self,
        endpoint: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retries: int = 0,
        curve: CurveKeys | None = None,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        """timeout_s: per attempt; retries: see the module docstring; curve: keys for a CURVE server.

        endpoint may list several endpoints, comma-separated: the socket connects to each, and
        ZeroMQ spreads requests over them (several service instances).
        """
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.retries = retries
        self._curve = curve
        self._ctx = context or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            curve.apply(self._sock)
        for e in endpoint.split(","):
            self._sock.connect(e.strip())
        self._ids = itertools.count(1)
        self._outstanding: set[int] = set()
        self._arrived: dict[int, Reply | RequestError] = {}

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
            _frames(type_name, body, request_id=rid, session_id=session_id, lifetime_ms=lifetime_ms, no_reply=no_reply)
        )
        if not no_reply:
            self._outstanding.add(rid)
        return rid

    def wait(self, request_id: int, timeout_s: float | None = None) -> Reply:
        """The reply to an earlier ``send``; replies to other requests are kept for their ``wait``."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while request_id not in self._arrived:
            left_ms = (deadline - time.monotonic()) * 1000
            if left_ms <= 0 or not self._sock.poll(max(1, int(left_ms))):
                self._outstanding.discard(request_id)
                raise RequestTimeout(f"no reply to request {request_id} in time")
            self._receive_one()
        self._outstanding.discard(request_id)
        result = self._arrived.pop(request_id)
        if isinstance(result, RequestError):
            raise result
        return result

    def twin(self, timeout_s: float | None = None) -> Client:
        """Another client of the same service, with the same keys and retries: a socket for another thread."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        return Client(self.endpoint, timeout_s=timeout, retries=self.retries, curve=self._curve, context=self._ctx)

    def arrived(self, request_id: int) -> bool:
        """Whether the reply to an earlier ``send`` is here; reads what the socket holds, never waits."""
        while request_id not in self._arrived and self._sock.poll(0):
            self._receive_one()
        return request_id in self._arrived

    def _receive_one(self) -> None:
        frames = self._sock.recv_multipart()
        try:
            reply: Reply | RequestError = _decode_reply(frames)
            rid = reply.header.request_id  # type: ignore[union-attr]
        except RequestError as e:
            rid = _request_id_of(frames)
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
        body = _with_key(type_name, body, self.retries)
        attempt = 0
        while True:
            try:
                return self.wait(self.send(type_name, body, session_id=session_id, lifetime_ms=lifetime_ms), timeout_s)
            except RequestError as e:
                if attempt >= self.retries or not _retryable(e, type_name, body):
                    raise
            time.sleep(_backoff_s(attempt))
            attempt += 1

    def subscribe(self, topics: Sequence[str] = (), from_seq: int | None = None, *, publishers: str) -> Subscription:
        """The event log as an iterator: events whose topic starts with one of ``topics`` (none: all), from
        sequence ``from_seq`` (None: from now on), each once and in order, gaps recovered by itself
        (service/subscriber.py). ``publishers``: the services' events endpoints (SMARTCACHE_EVENTS_LISTEN),
        comma-separated. It catches up through a client of its own (``twin``)."""
        return Subscription(self.twin(), publishers, topics, from_seq, curve=self._curve, context=self._ctx)

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
        """Close the socket, giving unsent messages (say, an APP_START) up to linger_ms to leave."""
        self._sock.close(linger=linger_ms)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _request_id_of(frames: list[bytes]) -> int:
    """Best-effort request id of an undecodable reply (0 when even that fails)."""
    for f in frames:
        if len(f) == HEADER_STRUCT.size:
            return frame_request_id(f)
    return 0


async def _retrying(
    attempt_once: Callable[[], Awaitable[Reply]], type_name: str, body: Mapping[str, Any] | None, retries: int
) -> Reply:
    attempt = 0
    while True:
        try:
            return await attempt_once()
        except RequestError as e:
            if attempt >= retries or not _retryable(e, type_name, body):
                raise
        await asyncio.sleep(_backoff_s(attempt))
        attempt += 1


class AsyncClient(_Helpers["asyncio.Future[Reply]"]):
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
    ) -> None:
        """timeout_s: per attempt; retries: see the module docstring; curve: keys for a CURVE server;
        endpoint: one or several, comma-separated."""
        self.timeout_s = timeout_s
        self.retries = retries
        self._ctx = context or zmq.asyncio.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            curve.apply(self._sock)
        for e in endpoint.split(","):
            self._sock.connect(e.strip())
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._reader: asyncio.Task[None] | None = None

    def call(
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
        body = _with_key(type_name, body, self.retries)
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
        frames = _frames(
            type_name, body, request_id=rid, session_id=session_id, lifetime_ms=lifetime_ms, no_reply=False
        )
        sent: asyncio.Future[Any] = asyncio.ensure_future(self._sock.send_multipart(frames))
        sent.add_done_callback(lambda f: self._fail(rid, f.exception()) if f.exception() else None)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        handle = loop.call_later(timeout, self._expire, rid)

        def forget(_: object) -> None:
            handle.cancel()
            self._pending.pop(rid, None)

        fut.add_done_callback(forget)
        return fut

    def _fail(self, rid: int, exc: BaseException | None) -> None:
        fut = self._pending.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_exception(RequestError("INTERNAL", f"send failed: {exc}"))

    def _expire(self, rid: int) -> None:
        fut = self._pending.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_exception(RequestTimeout(f"no reply to request {rid} in time"))

    async def _read(self) -> None:
        while True:
            frames = await self._sock.recv_multipart()
            try:
                reply = _decode_reply(frames)
            except RequestError as e:
                fut = self._pending.get(_request_id_of(frames))
                if fut is not None and not fut.done():
                    fut.set_exception(e)
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
            _frames(
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
