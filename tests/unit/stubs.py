"""Test doubles for the broker and worker unit tests: no socket, no Tarantool, no network.

:class:`StubStorage` answers what a test tells it and counts ``job.sent`` and
``job.returned`` as :class:`smartcache.server.storage.Storage` does;
:class:`RecordingReplies` is the broker's door out with the socket replaced by
a list; :class:`StubKeyRing` is the part of ``KeyRing`` the intake asks. The
frame builders use the real codec. Each :class:`Metrics` has a registry of its
own, so every test makes its own (:func:`sample` reads one series of it).
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from prometheus_client.metrics import MetricWrapperBase

from smartcache.server.broker.queue import PriorityQueue
from smartcache.server.broker.replies import Replies
from smartcache.server.config import Settings
from smartcache.server.job import Job
from smartcache.wire import (
    NO_SESSION,
    REGISTRY,
    Header,
    decode_body,
    decode_header,
    encode_body,
    encode_header,
)
from smartcache.wire.errors import StorageUnavailable

T = TypeVar("T")

#: a session id that is not zero
SESSION = bytes(range(1, 17))
PEER = b"peer-1"


# -- frames ---------------------------------------------------------------------


def type_id(name: str) -> int:
    return REGISTRY.types[name].id


def header(
    type_name: str,
    *,
    request_id: int = 1,
    session_id: bytes = NO_SESSION,
    lifetime_ms: int = 0,
    flags: int = 0,
) -> bytes:
    """A client's request header frame (the real codec)."""
    h = Header.request(
        type_id(type_name), request_id=request_id, session_id=session_id, lifetime_ms=lifetime_ms, flags=flags
    )
    return encode_header(h)


def body(fields: Mapping[str, Any] | None = None) -> bytes:
    return encode_body(fields or {})


#: a valid body per type used in these tests
BODIES: dict[str, dict[str, Any]] = {
    "PING": {},
    "INFO": {},
    "DEVICE_LOOKUP": {"device_id": "d-1"},
    "DEVICE_BIND": {"device_id": "d-1", "client_id": "c-1"},
    "SESSION_CREATE": {"client_id": "c-1"},
    "SESSION_GET": {},
    "SESSION_LIST": {"client_id": "c-1"},
    "CACHE_GET": {"key": "k-1"},
    "APP_START": {"device_id": "d-1"},
    "PREWARM_FETCH": {"client_id": "c-1", "data_type": 1},
}
#: the session id a type's session rule accepts
SESSIONS = {name: SESSION if spec.session == "required" else NO_SESSION for name, spec in REGISTRY.types.items()}


def frames(
    type_name: str,
    fields: Mapping[str, Any] | None = None,
    *,
    identity: bytes = PEER,
    req: bool = False,
    **header_fields: Any,
) -> list[bytes]:
    """A message as the client ROUTER receives it: identity, (the REQ delimiter), header, body.

    Without ``fields``, the type's valid body; without ``session_id``, one its session rule accepts.
    """
    header_fields.setdefault("session_id", SESSIONS[type_name])
    envelope = [identity, b""] if req else [identity]
    return [*envelope, header(type_name, **header_fields), body(BODIES[type_name] if fields is None else fields)]


# -- metrics --------------------------------------------------------------------


def sample(metric: MetricWrapperBase, suffix: str = "_total", **labels: str) -> float:
    """The sum of a metric's samples named ``<name><suffix>`` whose labels include ``labels``.

    Read from the collector itself (``metric.collect()``): the registry's other collectors
    (the process collector reads /proc) are not asked.
    """
    total = 0.0
    for family in metric.collect():
        for s in family.samples:
            if s.name == family.name + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


# -- the broker's parts ---------------------------------------------------------


def make_queue(settings: Settings) -> PriorityQueue:
    """The queue the broker makes (service/smartcache/server/broker/broker.py): registry priorities, bulkheads."""
    return PriorityQueue(
        capacity=settings.queue_capacity,
        priorities={t.id: t.priority for t in REGISTRY.types.values()},
        limits={t.id: settings.bulkheads.get(t.name, settings.workers) for t in REGISTRY.types.values()},
    )


class Sent(NamedTuple):
    """One answer that left the door out, decoded."""

    envelope: list[bytes]
    header: Header
    body: dict[str, Any]
    #: the frames as sent
    header_frame: bytes
    body_frame: bytes


class RecordingReplies(Replies):
    """The door out with a list for a socket: every answer sent is decoded and kept (counting unchanged)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sent: list[Sent] = []

    def send(self, envelope: list[bytes], header: bytes, body: bytes) -> None:
        # check_type=False: a reply to an unknown type id repeats that id
        decoded = decode_header(header, check_type=False)
        self.sent.append(Sent(list(envelope), decoded, decode_body(body), header, body))

    def only(self) -> Sent:
        """The one answer sent (fails the test if there were none or several)."""
        assert len(self.sent) == 1, f"expected one answer, got {self.sent}"
        return self.sent[0]


class StubKeyRing:
    """What the intake asks of :class:`smartcache.server.security.KeyRing`: key -> (name, type names)."""

    def __init__(self, keys: Mapping[str, tuple[str, Iterable[str]]]) -> None:
        self._keys = {k: (name, frozenset(type_id(t) for t in types)) for k, (name, types) in keys.items()}

    def allows(self, user_id: str | None, type_id: int) -> bool:
        key = self._keys.get(user_id or "")
        return key is not None and type_id in key[1]

    def name_of(self, user_id: str | None) -> str:
        key = self._keys.get(user_id or "")
        return key[0] if key else "unknown"


# -- storage --------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One stored procedure call a handler made."""

    procedure: str
    args: list[Any]
    job: Job | None
    idempotency_key: str | None


@dataclass(frozen=True)
class _Raise:
    error: BaseException
    sent: bool


_HANG = object()


@dataclass
class StubStorage:
    """A storage that answers from a script (then ``default``), and counts calls on the job as the real one.

    The real :class:`~smartcache.server.storage.Storage` counts a call as sent when it hands it to the
    connection, and as returned when the connection answers, raises or is cancelled. Here:
    ``will_answer`` and ``will_hang`` calls are sent; ``will_raise`` ones are sent unless told otherwise,
    except StorageUnavailable, which by default is raised before sending (no leader), as it mostly is.
    A hung call waits until its task is cancelled.
    """

    default: dict[str, Any] = field(default_factory=lambda: {"status": "OK"})
    connected: bool = True
    calls: list[Call] = field(default_factory=list)
    started: bool = False
    closed: bool = False
    #: calls waiting in will_hang now
    hanging: int = 0
    #: a sharded cluster's bucket count (new session ids carry their client's bucket), or None
    bucket_count: int | None = None
    #: the shards (call_on), or None: one replica set
    shard_names: tuple[str, ...] | None = None
    _script: deque[Any] = field(default_factory=deque)

    def will_answer(self, result: dict[str, Any]) -> StubStorage:
        self._script.append(result)
        return self

    def will_raise(self, error: BaseException, *, sent: bool | None = None) -> StubStorage:
        self._script.append(_Raise(error, not isinstance(error, StorageUnavailable) if sent is None else sent))
        return self

    def will_hang(self) -> StubStorage:
        self._script.append(_HANG)
        return self

    async def call(
        self, procedure: str, args: list[Any], *, job: Job | None, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        self.calls.append(Call(procedure, list(args), job, idempotency_key))
        step = self._script.popleft() if self._script else self.default
        if isinstance(step, _Raise) and not step.sent:
            raise step.error
        if job is not None:
            job.sent += 1
        try:
            if isinstance(step, _Raise):
                raise step.error
            if step is _HANG:
                self.hanging += 1
                try:
                    await asyncio.get_running_loop().create_future()
                finally:
                    self.hanging -= 1
            return copy.deepcopy(step)  # handlers change the result they are given
        finally:
            if job is not None:
                job.returned += 1

    async def call_on(self, shard: str, procedure: str, args: list[Any], *, job: Job | None) -> dict[str, Any]:
        return await self.call(procedure, args, job=job)

    def describe(self) -> list[dict[str, Any]]:
        return [{"address": "stub", "state": "up" if self.connected else "down", "leader": self.connected}]

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        self.closed = True


# -- waiting ---------------------------------------------------------------------


async def until(predicate: Callable[[], T], timeout_s: float = 5.0, what: str = "") -> T:
    """Yield to the loop until predicate() is truthy; returns its value, or fails the test at the timeout."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not (value := predicate()):
        if loop.time() >= end:
            raise AssertionError(f"not true within {timeout_s} s: {what or predicate}")
        await asyncio.sleep(0.001)
    return value
