"""Storage sharded by client: which shard a call goes to, and what a refusal of storage means.

docs/design/sharding.md is the design. A call's bucket comes from its own
arguments, by the same rules storage applies, and the bucket map (etcd's
``/smartcache/<cluster>/buckets``) names the shard (:mod:`.bucketmap`); the
shard's :class:`~smartcache.server.storage.routing.Storage` sends it to that
shard's leader. Storage is authoritative: a shard that does not
hold the bucket answers ``WRONG_BUCKET`` having done nothing, and the call is sent
again after the map is read again, while the message has time. So a stale map
costs a retry, never a write in the wrong place.

The worker's storage is a :class:`ShardRouter` when the service discovers its instances
in etcd, and so is the events publisher's (a reader per shard's log).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

import structlog

from smartcache.server.deadlines import STOP_GRACE_S
from smartcache.server.job import Job
from smartcache.server.storage.bucketmap import BucketMap, bucket_of_call, session_argument
from smartcache.server.storage.discovery import Discovery, DiscoveryError
from smartcache.wire import topology
from smartcache.wire.errors import StorageUnavailable

log = structlog.get_logger("storage")

#: how many times a call refused with WRONG_BUCKET is sent again (each after the map is read again)
WRONG_BUCKET_RETRIES = 3
#: version 4 session ids whose shard is remembered (they end with their sessions: ids made since carry a bucket)
LOCATED_KEPT = 100_000
#: how often the bucket map is read again from etcd (a refusal reads it at once)
MAP_POLL_S = 1.0
#: a call answered BUCKET_MOVING (its bucket paused while it moves) is sent again after this, doubling up to
#: MOVING_BACKOFF_MAX_S, while the message has time
MOVING_BACKOFF_S = 0.01
MOVING_BACKOFF_MAX_S = 0.2
#: a call with no deadline (the service's own, e.g. a prewarm's) asked again this many times at most (about 20 s)
MOVING_RETRIES = 100
#: how long a shard new in the map may take to find its leader before calls are routed to it
NEW_SHARD_WAIT_S = 5.0
#: buckets whose new owner a refusal named, routed there before the map says so (a move's map swap follows)
MOVED_KEPT = 4096
#: reads whose OK answer names the shard that gave it (PROTOCOL.md rev. 12): the answer's ``seq`` is a position
#: in that shard's log, which a client's near cache follows to drop its copy
LOCATED_READS = frozenset({"session_get", "device_lookup"})


class ShardError(StorageUnavailable):
    """No shard can take the call: the map names none for its bucket, or refusals went on past the retries.
    Not executed (a WRONG_BUCKET refusal did nothing): answered STORAGE_UNAVAILABLE, safe to retry."""


class ShardStorage(Protocol):
    """What a shard's storage offers (routing.Storage does)."""

    async def call(
        self, procedure: str, args: list[Any], *, job: Job | None, idempotency_key: str | None = None
    ) -> dict[str, Any]: ...


class ShardedStorage:
    """Routes each call to its bucket's shard; on WRONG_BUCKET reads the map again and sends it again."""

    def __init__(
        self,
        shards: Mapping[str, ShardStorage],
        bucket_map: BucketMap,
        refresh: Callable[[], Awaitable[BucketMap]],
        metrics: Any = None,
    ) -> None:
        self.shards = dict(shards)
        self.map = bucket_map
        self._refresh = refresh
        self._metrics = metrics
        self.refreshes = 0
        self.wrong_buckets = 0
        self._located: dict[str, int | str] = {}  # version 4 session id -> its bucket (or shard), oldest first
        self._moved: dict[int, str] = {}  # bucket -> the shard a refusal named as its owner (until the map does)
        self.moving_waits = 0

    async def shard_for(self, procedure: str, args: Sequence[Any], job: Job | None) -> str:
        bucket = bucket_of_call(procedure, args, self.map.buckets)
        if bucket is not None:
            return self._moved.get(bucket) or self.map.shard_of(bucket)
        session = session_argument(procedure, args)
        if session is not None:  # a version 4 id: it carries no bucket
            found = await self._locate(session, job)
            if isinstance(found, int):  # its bucket: routed as a bucket is (it may move)
                return self._moved.get(found) or self.map.shard_of(found)
            if found is not None:
                return found
        return self.map.shards[0]  # not about one key (or a session nobody has: answered NOT_FOUND there)

    async def _locate(self, session: str, job: Job | None) -> int | str | None:
        """The bucket (else the shard) of a session id made before sharding: asked of every shard at once
        (sc.session_locate, a read that writes nothing), remembered (LOCATED_KEPT ids) until a call is refused."""
        if session in self._located:
            return self._located[session]
        names = list(self.shards)
        answers = await asyncio.gather(
            *(self.shards[n].call("session_locate", [session], job=job) for n in names), return_exceptions=True
        )
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, dict) and answer.get("status") == "OK":
                bucket = answer.get("bucket")
                where: int | str = bucket if isinstance(bucket, int) else name
                if len(self._located) >= LOCATED_KEPT:
                    self._located.pop(next(iter(self._located)))
                self._located[session] = where
                return where
        return None

    async def call(
        self, procedure: str, args: list[Any], *, job: Job | None, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        tries, backoff, waits = 0, MOVING_BACKOFF_S, 0
        while True:
            shard = await self.shard_for(procedure, args, job)
            storage = self.shards.get(shard)
            if storage is None:
                raise ShardError(f"the bucket map names shard {shard!r}, which this service does not know")
            result = await storage.call(procedure, args, job=job, idempotency_key=idempotency_key)
            status = result.get("status")
            if status == "BUCKET_MOVING":
                # Paused while its rows are copied: nothing was done. Again in a moment, while the message has time.
                self.moving_waits += 1
                if self._metrics is not None:
                    self._metrics.storage_bucket_moving.labels(shard).inc()
                waits = 0 if job is not None else waits + 1
                if (job is not None and job.deadline <= time.monotonic() + backoff) or waits > MOVING_RETRIES:
                    raise ShardError(f"{procedure}: bucket {result.get('bucket')} still moving at the deadline")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MOVING_BACKOFF_MAX_S)
                continue
            if status != "WRONG_BUCKET":
                if procedure in LOCATED_READS and status == "OK":
                    result["shard"] = shard
                return result
            # Nothing was done there: read the map again and send it where it says, while the message has time.
            self.wrong_buckets += 1
            if self._metrics is not None:
                self._metrics.storage_wrong_bucket.labels(shard).inc()
            tries += 1
            if tries > WRONG_BUCKET_RETRIES or (job is not None and job.deadline <= time.monotonic()):
                raise ShardError(
                    f"{procedure}: bucket {result.get('bucket')} refused by shard {shard} {tries} times"
                    f" (map version {self.map.version})"
                )
            bucket, owner = result.get("bucket"), result.get("owner")
            if isinstance(bucket, int) and isinstance(owner, str) and owner in self.shards and owner != shard:
                # The shard that sent the bucket names where it went: there at once (the map follows the move).
                if len(self._moved) >= MOVED_KEPT:
                    self._moved.pop(next(iter(self._moved)))
                self._moved[bucket] = owner
                continue
            if isinstance(bucket, int):
                self._moved.pop(bucket, None)
            self.use(await self._refresh())
            self.refreshes += 1
            session = session_argument(procedure, args)
            if session is not None:
                self._located.pop(session, None)

    def use(self, found: BucketMap) -> None:
        """Route by found, etcd's, from now on unless it is older (a read that raced a newer one never goes
        back); at one version etcd's map is the one (a map held here that differs from it is wrong)."""
        if found.version >= self.map.version and found != self.map:
            self.map = found
            self._moved.clear()  # the map has caught up with the moves a refusal named
            if self._metrics is not None:
                self._metrics.storage_bucket_map_version.set(found.version)


class ShardRouter:
    """What a worker holds as its storage when the service discovers its instances in etcd: at start it reads
    the cluster's bucket map. None there: the cluster is one replica set, and ``call`` *is* that Storage's call
    (the hot path gains no coroutine). A map: a Storage per shard (each discovering the shard's own members,
    ``<cluster>.<shard>``) behind a :class:`ShardedStorage`."""

    def __init__(self, *, settings: Any, metrics: Any, make_storage: Callable[[Any], Any]) -> None:
        self._settings = settings
        self._metrics = metrics
        self._make = make_storage
        self._discovery = Discovery(endpoints=settings.etcd, cluster=settings.cluster)
        self._reading: asyncio.Task[BucketMap] | None = None
        self._poll: asyncio.Task[None] | None = None
        self._waiting: asyncio.Task[None] | None = None
        self.sharded: ShardedStorage | None = None
        self.single: Any = None
        self.call: Callable[..., Awaitable[dict[str, Any]]] = self._not_started

    async def _not_started(self, procedure: str, *_: Any, **__: Any) -> dict[str, Any]:
        raise ShardError(f"{procedure}: storage not started")

    async def read_map(self) -> BucketMap | None:
        raw = await self._discovery.bucket_map()
        return None if raw is None else BucketMap.parse(raw)

    async def _read_again(self) -> BucketMap:
        found = await self.read_map()
        if found is None:
            raise ShardError("the bucket map is gone from etcd")
        if self.sharded is not None:
            await self._grow(found)
        return found

    async def _grow(self, found: BucketMap) -> None:
        """A shard the map names and this service has no Storage for yet (cluster shard add): one made and
        started before the map is routed by."""
        assert self.sharded is not None
        for name in found.shards:
            if name not in self.sharded.shards:
                cluster = topology.shard_cluster(self._settings.cluster, name)
                store = self._make(replace(self._settings, cluster=cluster))
                await store.start()
                # Routed to only once it knows the shard's leader (or NEW_SHARD_WAIT_S passed): the first call
                # there would else be refused at once, while discovery is a moment away from the leader.
                waited = time.monotonic() + NEW_SHARD_WAIT_S
                while not store.connected and time.monotonic() < waited:
                    await asyncio.sleep(0.05)
                self.sharded.shards.setdefault(name, store)
                log.info("storage_shard_added", shard=name, map_version=found.version)

    async def _refresh(self) -> BucketMap:
        """The map read again; calls refused at once share one read (a burst of refusals is one etcd read)."""
        if self._reading is None or self._reading.done():
            self._reading = asyncio.ensure_future(self._read_again())
        try:
            return await asyncio.shield(self._reading)
        except (DiscoveryError, ValueError) as e:
            raise ShardError(f"the bucket map cannot be read again: {e}") from e

    async def _poll_map(self) -> None:
        """Read the map every MAP_POLL_S: a newer version is routed by (a refusal reads it at once too)."""
        assert self.sharded is not None
        failing = False
        while True:
            await asyncio.sleep(MAP_POLL_S)
            try:
                self.sharded.use(await self._refresh())
            except ShardError as e:
                if not failing:
                    log.warning("bucket_map_unreadable", error=str(e), cluster=self._settings.cluster)
                failing = True
                continue
            failing = False

    async def start(self) -> None:
        try:
            found = await self.read_map()
        except (DiscoveryError, ValueError) as e:
            log.warning("bucket_map_unreadable", error=str(e), cluster=self._settings.cluster)
            found = None
        if found is None:
            self.single = self._make(self._settings)
            await self.single.start()
            self.call = self.single.call
            # A map made later (cluster init --shards after this service started, or etcd unreadable now):
            # the service routes by it from then on, with no restart.
            self._waiting = asyncio.ensure_future(self._await_map())
            return
        await self._shard(found)

    async def _shard(self, found: BucketMap) -> None:
        """Route by found from now on: a Storage per shard (each discovering the shard's members)."""
        stores = {
            s: self._make(replace(self._settings, cluster=topology.shard_cluster(self._settings.cluster, s)))
            for s in found.shards
        }
        for store in stores.values():
            await store.start()
        self.sharded = ShardedStorage(stores, found, self._refresh, self._metrics)
        self.call = self.sharded.call
        if self._metrics is not None:
            self._metrics.storage_bucket_map_version.set(found.version)
        self._poll = asyncio.ensure_future(self._poll_map())
        log.info("storage_sharded", shards=list(found.shards), buckets=found.buckets, map_version=found.version)

    async def _await_map(self) -> None:
        """Unsharded: read etcd every MAP_POLL_S for a bucket map; once there is one, shard (and keep the one
        replica set's Storage for the calls under way, closed a grace period later)."""
        while True:
            await asyncio.sleep(MAP_POLL_S)
            try:
                found = await self.read_map()
            except (DiscoveryError, ValueError):
                continue
            if found is not None:
                break
        single = self.single
        await self._shard(found)
        self.single = None
        try:
            await asyncio.sleep(STOP_GRACE_S)
        finally:
            if single is not None:
                await single.close()

    @property
    def shard_names(self) -> tuple[str, ...] | None:
        """The shards in the map's order, or None: one replica set."""
        return self.sharded.map.shards if self.sharded is not None else None

    @property
    def bucket_count(self) -> int | None:
        """The sharded cluster's bucket count (new session ids carry their client's bucket), or None."""
        return self.sharded.map.buckets if self.sharded is not None else None

    async def call_on(self, shard: str, procedure: str, args: list[Any], *, job: Job | None) -> dict[str, Any]:
        """A call about one shard as a whole (its event log): sent to that shard's leader, no bucket."""
        store = self.stores.get(shard)
        if store is None:
            raise ShardError(f"{procedure}: no shard {shard!r} here (shards: {', '.join(self.stores)})")
        result: dict[str, Any] = await store.call(procedure, args, job=job)
        return result

    @property
    def stores(self) -> dict[str, Any]:
        if self.sharded is not None:
            return self.sharded.shards
        return {"": self.single} if self.single is not None else {}

    @property
    def connected(self) -> bool:
        stores = self.stores
        return bool(stores) and all(s.connected for s in stores.values())

    @property
    def leader(self) -> Any:
        """The one replica set's leader (unsharded), else the first shard's: for what has no key."""
        stores = list(self.stores.values())
        return stores[0].leader if stores else None

    def describe(self) -> list[dict[str, Any]]:
        out = []
        for name, store in self.stores.items():
            for row in store.describe():
                out.append({**row, "shard": name} if name else row)
        return out

    async def close(self) -> None:
        for task in (self._waiting, self._poll, self._reading):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for store in self.stores.values():
            await store.close()
        await self._discovery.close()
