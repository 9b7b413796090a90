"""The typed calls, one per message type, shared by the blocking and the asyncio client.

Each builds the body from keyword arguments and goes through ``call``; a
client class fixes what ``call`` returns (a :class:`~smartcache.client.base.Reply`,
or a future of one). The coordination types' calls are in
:mod:`smartcache.client.coordination`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from smartcache.client.base import SessionId, sends
from smartcache.client.coordination import CoordinationHelpers
from smartcache.wire.sessionkeys import stored_of

R = TypeVar("R")


class TypedCalls(CoordinationHelpers[R]):
    """Typed helpers, one per message type; all go through ``call``, declared (abstract) in CoordinationHelpers,
    whose calls for the coordination types these join."""

    @sends("PING")
    def ping(self) -> R:
        return self.call("PING")

    @sends("INFO")
    def info(self) -> R:
        return self.call("INFO")

    @sends(
        "SESSION_CREATE",
        "client_id: whose session; data: any msgpack value; ttl_s: seconds of idle life (storage's default "
        "otherwise); max_lifetime_s: seconds of life in all (the cluster's default otherwise, 12 h); binding: "
        "bind the session to this value (a device id, an app instance's fingerprint): every later call on it "
        "must pass the same binding=; session_id: choose the id yourself (else the service makes one, on the "
        "reply's session_id); max_sessions, limit_policy ('refuse' or 'evict_oldest'): the client's live "
        "sessions after this one; device: a name SESSION_LIST shows. The reply's session_id is the credential "
        "(keep it in the app's requests only); reply.handle names the session in lists and events.",
    )
    def session_create(
        self,
        client_id: str,
        *,
        data: Any = None,
        ttl_s: int | None = None,
        version: str | None = None,
        session_id: SessionId | None = None,
        max_sessions: int | None = None,
        limit_policy: str | None = None,
        device: str | None = None,
        max_lifetime_s: int | None = None,
        binding: str | None = None,
        idempotency_key: str | None = None,
    ) -> R:
        body = {
            "client_id": client_id,
            "data": data,
            "ttl_s": ttl_s,
            "version": version,
            "max_sessions": max_sessions,
            "limit_policy": limit_policy,
            "device": device,
            "max_lifetime_s": max_lifetime_s,
            "binding": binding,
            "idempotency_key": idempotency_key,
        }
        return self.call("SESSION_CREATE", body, session_id=session_id)

    @sends(
        "SESSION_GET",
        "Reads refresh the session (sliding expiry). NOT_FOUND: missing or expired; the front server ends its "
        "session. binding: the session's, if it was created with one (else BINDING_MISMATCH).",
    )
    def session_get(self, session_id: SessionId, *, binding: str | None = None) -> R:
        return self.call("SESSION_GET", {"binding": binding}, session_id=session_id)

    @sends("SESSION_TOUCH", "binding: the session's, if it was created with one.")
    def session_touch(
        self, session_id: SessionId, *, binding: str | None = None, idempotency_key: str | None = None
    ) -> R:
        body = {"binding": binding, "idempotency_key": idempotency_key}
        return self.call("SESSION_TOUCH", body, session_id=session_id)

    @sends(
        "SESSION_UPDATE",
        "data replaces the whole value; or set (attribute -> value) and unset (attributes) change attributes of "
        "map data in storage's transaction; expected_rev: compare-and-set on the revision a read returned "
        "(CONFLICT carries the current one); binding: the session's, if it was created with one.",
    )
    def session_update(
        self,
        session_id: SessionId,
        data: Any = None,
        *,
        set: Mapping[str, Any] | None = None,
        unset: Sequence[str] | None = None,
        expected_rev: int | None = None,
        version: str | None = None,
        binding: str | None = None,
        idempotency_key: str | None = None,
    ) -> R:
        body = {
            "data": data,
            "set": dict(set) if set is not None else None,
            "unset": list(unset) if unset is not None else None,
            "expected_rev": expected_rev,
            "version": version,
            "binding": binding,
            "idempotency_key": idempotency_key,
        }
        return self.call("SESSION_UPDATE", body, session_id=session_id)

    @sends(
        "SESSION_ROTATE",
        "At login: the reply's session_id is the new id (reply.handle its handle); the old one still answers "
        "reads for grace_ms (the cluster's default otherwise, 5 s; 0: none), then NOT_FOUND. binding: the "
        "session's, if it was created with one (the new id keeps it).",
    )
    def session_rotate(
        self,
        session_id: SessionId,
        *,
        grace_ms: int | None = None,
        binding: str | None = None,
        idempotency_key: str | None = None,
    ) -> R:
        body = {"grace_ms": grace_ms, "binding": binding, "idempotency_key": idempotency_key}
        return self.call("SESSION_ROTATE", body, session_id=session_id)

    @sends("SESSION_DELETE_CLIENT", "keep: a session of the client that stays (the caller's own).")
    def session_delete_client(
        self, client_id: str, *, keep: SessionId | None = None, idempotency_key: str | None = None
    ) -> R:
        body = {"client_id": client_id, "except_current": True if keep is not None else None}
        return self.call("SESSION_DELETE_CLIENT", {**body, "idempotency_key": idempotency_key}, session_id=keep)

    @sends(
        "SESSION_DELETE",
        "Either session_id (log out: binding, the session's if it was created with one), or handle= and "
        "client_id= (sign out another device of the client: a handle from session_list or an event); "
        "ValueError for both, neither, or half of the pair.",
    )
    def session_delete(
        self,
        session_id: SessionId | None = None,
        *,
        handle: str | None = None,
        client_id: str | None = None,
        binding: str | None = None,
        idempotency_key: str | None = None,
    ) -> R:
        if (session_id is None) == (handle is None) or (handle is None) != (client_id is None):
            raise ValueError("session_delete takes a session_id, or handle= with client_id=")
        if handle is not None:
            stored_of(handle)  # NotAHandle (a ValueError) saying why, before anything is sent
        body = {"handle": handle, "client_id": client_id, "binding": binding, "idempotency_key": idempotency_key}
        return self.call("SESSION_DELETE", body, session_id=session_id)

    @sends(
        "SESSION_LIST",
        "Each entry's handle names the session (session_delete(handle=..., client_id=...) ends it); no entry "
        "carries a session id.",
    )
    def session_list(self, client_id: str) -> R:
        return self.call("SESSION_LIST", {"client_id": client_id})

    @sends(
        "CACHE_PUT",
        "session_id None: the global namespace; data_type: any number of yours; ttl_s: seconds; binding: the "
        "session's, if it was created with one.",
    )
    def cache_put(
        self,
        key: str,
        data: Any,
        *,
        session_id: SessionId | None = None,
        data_type: int | None = None,
        ttl_s: int | None = None,
        binding: str | None = None,
        idempotency_key: str | None = None,
    ) -> R:
        body = {
            "key": key,
            "data": data,
            "data_type": data_type,
            "ttl_s": ttl_s,
            "binding": binding,
            "idempotency_key": idempotency_key,
        }
        return self.call("CACHE_PUT", body, session_id=session_id)

    @sends("CACHE_GET", "NOT_FOUND: absent or expired. binding: the session's, if it was created with one.")
    def cache_get(self, key: str, *, session_id: SessionId | None = None, binding: str | None = None) -> R:
        return self.call("CACHE_GET", {"key": key, "binding": binding}, session_id=session_id)

    @sends("CACHE_DELETE", "binding: the session's, if it was created with one.")
    def cache_delete(
        self,
        key: str,
        *,
        session_id: SessionId | None = None,
        binding: str | None = None,
        idempotency_key: str | None = None,
    ) -> R:
        body = {"key": key, "binding": binding, "idempotency_key": idempotency_key}
        return self.call("CACHE_DELETE", body, session_id=session_id)

    @sends("DEVICE_BIND")
    def device_bind(self, device_id: str, client_id: str, *, idempotency_key: str | None = None) -> R:
        body = {"device_id": device_id, "client_id": client_id, "idempotency_key": idempotency_key}
        return self.call("DEVICE_BIND", body)

    @sends("DEVICE_LOOKUP")
    def device_lookup(self, device_id: str) -> R:
        return self.call("DEVICE_LOOKUP", {"device_id": device_id})

    @sends(
        "PRODUCTS_GET",
        "data_type: one of the service's SMARTCACHE_PREWARM_TYPES (1-4 by default: accounts, cards, deposits, loans).",
    )
    def products_get(self, client_id: str, data_type: int, *, version: str | None = None) -> R:
        return self.call("PRODUCTS_GET", {"client_id": client_id, "data_type": data_type, "version": version})
