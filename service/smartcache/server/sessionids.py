"""Session ids on the way in: the stored id storage knows a session by, made from the raw id a client holds.

A session id is a bearer credential (issue 37, PROTOCOL.md 4): it exists only in the client's request
header and in the header of a SESSION_CREATE or SESSION_ROTATE ``OK`` reply. Every message that names a
session has its stored id derived here before any storage call (HMAC-SHA256 under the cluster's key,
:mod:`smartcache.wire.sessionkeys`, the routing bits kept), and only the stored id goes on: to storage,
into routing (a version 8 id's bucket is the raw one's), nowhere else. The service makes new raw ids
itself (a create with a zero header id, every rotation): under an idempotency key the same on every
repeat (storage's stored answer names the stored id only, and the raw one must be answered again).

One key for the whole cluster: :class:`KeyCheck` gives storage the key's id at start
(``sc.session_key_check``; storage keeps the first one each replica set is given) and again every
:data:`KEY_CHECK_EVERY_S`. Until a check has passed the service is not ready; on ``MISMATCH`` it logs
``session_key_mismatch`` with both ids and answers every call that names a session
``STORAGE_UNAVAILABLE`` with the reason: a session created under another key would be lost to the
others (each would derive another stored id).

Cost: one derivation per message that names a session (1.6-2 us here: two SHA-256 blocks, the
key's pads hashed once), against 50-57 us of the service's CPU per request (docs/performance.md,
"What the stored ids cost").
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import structlog

from smartcache.server.config import Settings
from smartcache.wire import NO_SESSION, buckets
from smartcache.wire.errors import StorageError
from smartcache.wire.sessionkeys import SessionKey, handle, keyed_raw_id, new_raw_id

log = structlog.get_logger("sessions")

#: the key is checked again this often once it passed (a new shard, a storage set up again)
KEY_CHECK_EVERY_S = 30.0
#: and this often while no check has an answer yet (no leader, storage older than the procedure)
KEY_CHECK_RETRY_S = 1.0


def uuid_text(sid: bytes) -> str:
    """16 bytes as canonical UUID text, what storage keys sessions by."""
    h = sid.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def bytes_of(text: str) -> bytes:
    """UUID text (as storage gives it) -> its 16 bytes."""
    return bytes.fromhex(text.replace("-", ""))


class SessionIds:
    """The service's session key, what it derives, and whether storage agrees it is the cluster's.

    Built once at start and shared by every worker (its check state is written by one task and read by
    every thread: plain attribute assignments)."""

    def __init__(self, settings: Settings) -> None:
        self._key_bytes = settings.derive_key
        self._key = SessionKey(settings.derive_key)
        #: SMARTCACHE_SESSION_REKEY=lazy: a NOT_FOUND is asked again by the raw id (sc.session_rekey)
        self.lazy_rekey = settings.session_rekey == "lazy"
        #: the key's name, given to storage and logged (never the key)
        self.key_id = self._key.id
        #: whether every replica set agreed at the last check
        self.checked = False
        #: why calls that name a session are refused (a MISMATCH), or None
        self.refusal: str | None = None

    def stored(self, raw: bytes) -> str:
        """The stored id (UUID text) of a raw session id from a header ('' for no session)."""
        if raw == NO_SESSION:
            return ""
        return uuid_text(self._key.derive(raw))

    def new_raw(self, bucket: int | None, type_name: str, scope: bytes | str, idempotency_key: str | None) -> bytes:
        """A new raw id (version 8 carrying ``bucket``, or version 4 for None): random, or under an idempotency
        key made from it (so a repeat passes storage the same stored id and is answered the same raw id)."""
        if idempotency_key is None:
            return new_raw_id(bucket)
        return keyed_raw_id(self._key_bytes, bucket, type_name, scope, idempotency_key)

    def made(self, raw: bytes) -> tuple[str, str]:
        """A raw id the service made: (its stored id, its handle)."""
        stored = self._key.derive(raw)
        return uuid_text(stored), handle(stored)

    @staticmethod
    def bucket_of_raw(raw: bytes) -> int | None:
        """The bucket a raw id carries (version 8), or None."""
        return buckets.session_bucket(raw)


class KeyCheck:
    """Asks every replica set whether the service's key is the cluster's (``sc.session_key_check``), at start
    and every KEY_CHECK_EVERY_S; runs on one worker's loop with that worker's storage."""

    def __init__(self, ids: SessionIds) -> None:
        self._ids = ids
        self._said: str | None = None
        self._lock = threading.Lock()

    async def run(self, storage: Any) -> None:
        """Until cancelled (the worker's stop)."""
        while True:
            try:
                done = await self.check(storage)
            except StorageError as e:
                self._say("session_key_unchecked", error=str(e))
                done = False
            await asyncio.sleep(KEY_CHECK_EVERY_S if done else KEY_CHECK_RETRY_S)

    async def check(self, storage: Any) -> bool:
        """One pass over the replica sets; True when each answered (OK or MISMATCH)."""
        ids = self._ids
        for shard in storage.shard_names or ("",):
            result = await storage.call_on(shard, "session_key_check", [ids.key_id], job=None)
            status = result.get("status")
            if status == "MISMATCH":
                expected = result.get("expected")
                where = f" (shard {shard})" if shard else ""
                ids.refusal = (
                    f"this service's session key (key id {ids.key_id}) is not the cluster's{where} (key id {expected}):"
                    " set SMARTCACHE_SESSION_KEY to the cluster's key (docs/operations.md, 'The session key')"
                )
                ids.checked = False
                self._say("session_key_mismatch", level="error", key_id=ids.key_id, expected=expected, shard=shard)
                return True
            if status != "OK":
                self._say("session_key_unchecked", status=status, message=result.get("message"), shard=shard)
                return False
        if not ids.checked:
            log.info("session_key_checked", key_id=ids.key_id, shards=list(storage.shard_names or ()))
        ids.checked, ids.refusal, self._said = True, None, None
        return True

    def _say(self, event: str, *, level: str = "warning", **fields: Any) -> None:
        """Each state once, not once a second while it lasts."""
        with self._lock:
            said = f"{event}:{fields.get('status')}:{fields.get('expected')}"
            if said == self._said:
                return
            self._said = said
        getattr(log, level)(event, **fields)
