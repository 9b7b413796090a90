"""Typed client calls for the coordination primitives (issue 17), one per message type.

:class:`CoordinationHelpers` is mixed into both clients' helpers (service/smartcache/client/clients.py), so
``client.counter_add(...)`` or ``await aclient.queue_take(...)`` return the reply like every
other helper. The objects that feel native (``with client.lock(...)``, ``client.counter(...)``,
``next(client.ids(...))``) live in service/smartcache/client/objects.py and
service/smartcache/client/locks.py.

A waiting call (acquire, latch await, queue take) is sent with a lifetime of its wait plus
:data:`WAIT_SLACK_MS`, and the client waits that long plus a second: the wait, not the
message's lifetime, ends it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from smartcache.client.base import sends
from smartcache.wire import REGISTRY
from smartcache.wire.errors import CoordinationError

if TYPE_CHECKING:
    from smartcache.client.base import Reply, SessionId

R = TypeVar("R")

#: a waiting call's message lives this much longer than its wait, so the wait, not the lifetime, ends it
WAIT_SLACK_MS = 1_000


def wait_lifetime_ms(wait_ms: int) -> int:
    """The lifetime a waiting message needs: the wait plus slack, within the protocol's maximum."""
    return min(REGISTRY.max_lifetime_ms, max(wait_ms, 0) + WAIT_SLACK_MS)


def ok_reply(reply: Reply, *also: str) -> Reply:
    """The reply if its status is OK (or one of ``also``), else CoordinationError."""
    if reply.status != "OK" and reply.status not in also:
        raise CoordinationError(reply.status, str(reply.body.get("message", reply.status)), reply.body)
    return reply


class CoordinationHelpers(ABC, Generic[R]):
    """One typed method per coordination message type; all go through ``call``."""

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

    def _wait(self, type_name: str, body: Mapping[str, Any], wait_ms: int) -> R:
        lifetime = wait_lifetime_ms(wait_ms)
        return self.call(type_name, body, lifetime_ms=lifetime, timeout_s=lifetime / 1000 + 1)

    @sends("COUNTER_GET")
    def counter_get(self, name: str) -> R:
        return self.call("COUNTER_GET", {"name": name})

    @sends("COUNTER_ADD")
    def counter_add(
        self,
        name: str,
        delta: int = 1,
        *,
        min: int | None = None,
        max: int | None = None,
        ttl_ms: int | None = None,
        idempotency_key: str | None = None,
    ) -> R:
        body = {"name": name, "delta": delta, "min": min, "max": max, "ttl_ms": ttl_ms}
        return self.call("COUNTER_ADD", {**body, "idempotency_key": idempotency_key})

    @sends("COUNTER_CAS")
    def counter_cas(
        self, name: str, expected: int, value: int, *, ttl_ms: int | None = None, idempotency_key: str | None = None
    ) -> R:
        body = {"name": name, "expected": expected, "value": value, "ttl_ms": ttl_ms}
        return self.call("COUNTER_CAS", {**body, "idempotency_key": idempotency_key})

    @sends("REGISTER_GET")
    def register_get(self, name: str) -> R:
        return self.call("REGISTER_GET", {"name": name})

    @sends("REGISTER_CAS")
    def register_cas(
        self,
        name: str,
        value: Any,
        *,
        expected_rev: int | None = None,
        expected_value: Any = None,
        ttl_ms: int | None = None,
        idempotency_key: str | None = None,
    ) -> R:
        body = {"name": name, "value": value, "expected_rev": expected_rev, "expected_value": expected_value}
        return self.call("REGISTER_CAS", {**body, "ttl_ms": ttl_ms, "idempotency_key": idempotency_key})

    @sends("SEQUENCE_RESERVE")
    def sequence_reserve(
        self, name: str, count: int, *, start: int | None = None, idempotency_key: str | None = None
    ) -> R:
        body = {"name": name, "count": count, "start": start, "idempotency_key": idempotency_key}
        return self.call("SEQUENCE_RESERVE", body)

    @sends("SEQUENCE_GET")
    def sequence_get(self, name: str) -> R:
        return self.call("SEQUENCE_GET", {"name": name})

    @sends("SEMAPHORE_ACQUIRE")
    def semaphore_acquire(self, name: str, holder: str, lease_ms: int, *, permits: int = 1, wait_ms: int = 0) -> R:
        body = {"name": name, "holder": holder, "lease_ms": lease_ms, "permits": permits, "wait_ms": wait_ms}
        return self._wait("SEMAPHORE_ACQUIRE", body, wait_ms)

    @sends("SEMAPHORE_RELEASE")
    def semaphore_release(self, name: str, holder: str, *, idempotency_key: str | None = None) -> R:
        return self.call("SEMAPHORE_RELEASE", {"name": name, "holder": holder, "idempotency_key": idempotency_key})

    @sends("SEMAPHORE_RENEW")
    def semaphore_renew(self, name: str, holder: str, lease_ms: int, *, idempotency_key: str | None = None) -> R:
        body = {"name": name, "holder": holder, "lease_ms": lease_ms, "idempotency_key": idempotency_key}
        return self.call("SEMAPHORE_RENEW", body)

    @sends("SEMAPHORE_GET")
    def semaphore_get(self, name: str) -> R:
        return self.call("SEMAPHORE_GET", {"name": name})

    @sends("LATCH_CREATE")
    def latch_create(
        self, name: str, count: int, *, ttl_ms: int | None = None, idempotency_key: str | None = None
    ) -> R:
        body = {"name": name, "count": count, "ttl_ms": ttl_ms, "idempotency_key": idempotency_key}
        return self.call("LATCH_CREATE", body)

    @sends("LATCH_COUNT_DOWN")
    def latch_count_down(self, name: str, n: int = 1, *, idempotency_key: str | None = None) -> R:
        return self.call("LATCH_COUNT_DOWN", {"name": name, "n": n, "idempotency_key": idempotency_key})

    @sends("LATCH_AWAIT")
    def latch_await(self, name: str, wait_ms: int = 0) -> R:
        return self._wait("LATCH_AWAIT", {"name": name, "wait_ms": wait_ms}, wait_ms)

    @sends("LATCH_GET")
    def latch_get(self, name: str) -> R:
        return self.call("LATCH_GET", {"name": name})

    @sends("QUEUE_PUT")
    def queue_put(
        self,
        name: str,
        payload: Any,
        *,
        priority: int | None = None,
        delay_ms: int | None = None,
        ttl_ms: int | None = None,
        idempotency_key: str | None = None,
    ) -> R:
        body = {"name": name, "payload": payload, "priority": priority, "delay_ms": delay_ms, "ttl_ms": ttl_ms}
        return self.call("QUEUE_PUT", {**body, "idempotency_key": idempotency_key})

    @sends("QUEUE_TAKE")
    def queue_take(
        self, name: str, *, wait_ms: int = 0, ttr_ms: int | None = None, idempotency_key: str | None = None
    ) -> R:
        body = {"name": name, "wait_ms": wait_ms, "ttr_ms": ttr_ms, "idempotency_key": idempotency_key}
        return self._wait("QUEUE_TAKE", body, wait_ms)

    @sends("QUEUE_ACK")
    def queue_ack(
        self, name: str, task_id: int, attempt: int | None = None, *, idempotency_key: str | None = None
    ) -> R:
        body = {"name": name, "task_id": task_id, "attempt": attempt, "idempotency_key": idempotency_key}
        return self.call("QUEUE_ACK", body)

    @sends("QUEUE_RELEASE")
    def queue_release(
        self,
        name: str,
        task_id: int,
        attempt: int | None = None,
        *,
        delay_ms: int | None = None,
        idempotency_key: str | None = None,
    ) -> R:
        body = {"name": name, "task_id": task_id, "attempt": attempt, "delay_ms": delay_ms}
        return self.call("QUEUE_RELEASE", {**body, "idempotency_key": idempotency_key})

    @sends("QUEUE_STATS")
    def queue_stats(self, name: str) -> R:
        return self.call("QUEUE_STATS", {"name": name})
