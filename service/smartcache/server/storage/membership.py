"""Which instances a replica set's :class:`~smartcache.server.storage.routing.Storage` knows.

``SMARTCACHE_TARANTOOL``'s or, with ``SMARTCACHE_ETCD`` and ``SMARTCACHE_CLUSTER``, the cluster's
members as etcd lists them (:mod:`.discovery`), read every second: a new address gets an
:class:`~smartcache.server.storage.instances.Instance`, one gone from the topology is closed,
each logged (``storage_instance_added``/``_removed``) and counted. Given both, the static list is
what the service starts with, until etcd first answers; etcd unreachable keeps the instances it
has. Who leads among them is :mod:`.leadership`'s to say.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from smartcache.server.config import Settings
from smartcache.server.metrics import Metrics
from smartcache.server.storage.discovery import DISCOVERY_INTERVAL_S, TOPOLOGY, Discovery, DiscoveryError
from smartcache.server.storage.instances import Instance
from smartcache.server.storage.leadership import Leadership

log = structlog.get_logger("storage")


class Membership:
    """The instances of one replica set: made, started and closed here, handed to the leadership whole."""

    def __init__(self, *, settings: Settings, metrics: Metrics, leadership: Leadership) -> None:
        self._settings = settings
        self._metrics = metrics
        self._leadership = leadership
        leadership.replace([self._new_instance(a) for a in settings.tarantool])
        self._discovery = Discovery(endpoints=settings.etcd, cluster=settings.cluster) if settings.discovery else None
        self._discovering: asyncio.Task[None] | None = None

    def _new_instance(self, address: str) -> Instance:
        return Instance(
            address=address,
            settings=self._settings,
            metrics=self._metrics,
            on_role=self._leadership.elect,
            searching=self._leadership.searching,
        )

    def start(self) -> None:
        """Start each instance's keeper, and the discovery loop when there is one; returns at once."""
        for instance in self._leadership.instances:
            instance.start()
        self._metrics.storage_instances.set(len(self._leadership.instances))
        if self._discovery is not None:
            self._discovering = asyncio.get_running_loop().create_task(self._discover())

    async def close(self) -> None:
        if self._discovering is not None:
            self._discovering.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._discovering
        if self._discovery is not None:
            await self._discovery.close()
        for instance in self._leadership.instances:
            await instance.close()

    async def _discover(self) -> None:
        """Every DISCOVERY_INTERVAL_S: the members etcd lists become our instances (:mod:`.discovery`)."""
        assert self._discovery is not None
        failing: str | None = None
        while True:
            try:
                addresses, source = await self._discovery.addresses()
            except DiscoveryError as e:
                self._metrics.storage_discovery_errors.inc()
                if failing is None:
                    keeping = [i.address for i in self._leadership.instances]
                    log.warning("storage_discovery_failed", error=str(e), keeping=keeping)
                failing = str(e)
            except Exception:
                log.exception("storage_discovery_error")
            else:
                if failing is not None:
                    log.info("storage_discovery_recovered", was=failing)
                    failing = None
                await self.apply(addresses, source)
            await asyncio.sleep(DISCOVERY_INTERVAL_S)

    async def apply(self, addresses: tuple[str, ...], source: str) -> None:
        """New addresses get an Instance; with a topology, those it no longer lists are closed. The live member
        records of a cluster without one only add (a record goes with its lease, an instance down for a while
        must still be asked when it is back)."""
        instances = self._leadership.instances
        current = {i.address for i in instances}
        added = [self._new_instance(a) for a in addresses if a not in current]
        removed = [i for i in instances if i.address not in addresses] if source == TOPOLOGY else []
        if not addresses or (not added and not removed):
            return  # nothing listed at all (a cluster not started yet): keep what we have
        self._leadership.replace([i for i in instances if i not in removed] + added)
        for instance in added:
            instance.start()
            self._metrics.storage_discovery_changes.labels("added").inc()
            log.info("storage_instance_added", address=instance.address, source=source)
        for instance in removed:
            self._metrics.storage_discovery_changes.labels("removed").inc()
            role = instance.role.get("role")
            log.info("storage_instance_removed", address=instance.address, source=source, role=role)
            await instance.close()
        self._metrics.storage_instances.set(len(self._leadership.instances))
        if self._leadership.leader in removed:
            self._leadership.elect()
