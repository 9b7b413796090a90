"""The near cache's two sides in a client: the follower thread that feeds it the event stream, and the
calls that ask it first (:func:`through`).

:class:`Follower` is a thread of its own, with its own sockets (a subscription's SUB socket and the
client its catch-up reads go through, and a client for the touches), made inside the thread: sockets
never cross threads. Each turn it takes what the subscription delivers (``poll``: the catch-up with
``EVENTS_READ``, then the ``PUB`` stream, duplicates dropped, gaps detected), applies each event to
the cache in order, tells the cache which shards are current (no gap pending, nothing buffered,
and when a publisher last showed it: ``Subscription.heard``), watches the SUB socket's disconnects,
and sends the touches hits asked for, pipelined as one batch. A cursor older than what storage keeps
(``CursorTooOld``) starts the shard again from the head, with its entries dropped.

:func:`through` is what ``Client.call`` does with a near cache: a read (``SESSION_GET``,
``DEVICE_LOOKUP``) is answered from the cache when it can and otherwise sent, its reply offered to the
cache; a write of a session or a device binding through this client drops its copy before it is sent
(read-your-writes: this client's next read goes to the service).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import zmq
from zmq.utils.monitor import recv_monitor_message

from smartcache.client.base import Reply, SessionId, session_bytes
from smartcache.client.nearcache import DEVICE, SESSION, NearCache
from smartcache.wire.errors import CursorTooOld, RequestError

if TYPE_CHECKING:
    from smartcache.client.interface import BlockingClient
    from smartcache.client.subscriber import Subscription


class Client(Protocol):
    """What the follower uses of its client (smartcache.client.clients.Client): clients of its own."""

    def twin(self, timeout_s: float | None = None) -> BlockingClient: ...

    def subscribe(
        self, topics: Sequence[str] = (), from_seq: int | None = None, *, publishers: str, retry_s: float = ...
    ) -> Subscription: ...


log = logging.getLogger("smartcache.client.nearcache")

#: how long one poll of the stream waits (the touches and the shards' state are looked at between polls)
POLL_S = 0.05
#: events applied per turn at most, before the shards' state is told again
EVENTS_PER_TURN = 2000
#: how long the first message of a publisher may take before the log says the cache is not serving
NO_STREAM_S = 5.0
#: a subscription that could not start (no service answering EVENTS_READ) is tried again after this
RESTART_S = 2.0
#: touches per batch, and how long their answers are waited for
TOUCH_BATCH = 1000
TOUCH_WAIT_S = 1.0
#: how long a subscription's catch-up read retries a service that does not answer before it starts again
CATCH_UP_RETRY_S = 5.0

#: the writes that drop this client's own copy first
_SESSION_WRITES = frozenset({"SESSION_UPDATE", "SESSION_DELETE", "SESSION_ROTATE"})
NEAR_TYPES = frozenset({"SESSION_GET", "DEVICE_LOOKUP", "SESSION_DELETE_CLIENT", "DEVICE_BIND"}) | _SESSION_WRITES


def read_key(cache: NearCache, type_name: str, body: Mapping[str, Any] | None, session_id: SessionId | None) -> Any:
    """(kind, key) of a read the cache may answer; None for anything else (a write, a read it does not keep)."""
    if not cache.enabled:
        return None
    if type_name == "SESSION_GET":
        return SESSION, (session_bytes(session_id), (body or {}).get("binding"))
    device = (body or {}).get("device_id")
    if type_name == "DEVICE_LOOKUP" and cache.devices and isinstance(device, str):
        return DEVICE, device
    return None


def before_write(
    cache: NearCache, type_name: str, body: Mapping[str, Any] | None, session_id: SessionId | None
) -> None:
    """This client's own write of a session or a device binding: its copy dropped before the write is sent."""
    b = body or {}
    if type_name in _SESSION_WRITES:
        if session_id is not None:
            cache.forget_session(session_bytes(session_id))
        if isinstance(b.get("handle"), str):
            cache.forget_name(b["handle"])
    elif type_name == "SESSION_DELETE_CLIENT" and isinstance(b.get("client_id"), str):
        cache.forget_client(b["client_id"])
    elif type_name == "DEVICE_BIND" and isinstance(b.get("device_id"), str):
        cache.forget_name(b["device_id"])


def through(
    cache: NearCache,
    send: Callable[..., Reply],
    type_name: str,
    body: Mapping[str, Any] | None,
    session_id: SessionId | None,
    **kw: Any,
) -> Reply:
    """``Client.call`` of a type in NEAR_TYPES, with the near cache: see the module docstring."""
    read = read_key(cache, type_name, body, session_id)
    if read is None:
        before_write(cache, type_name, body, session_id)
        return send(type_name, body, session_id=session_id, **kw)
    hit = cache.lookup(read[1])
    if hit is not None:
        return hit
    sent_at = cache.clock()
    reply = send(type_name, body, session_id=session_id, **kw)
    cache.offer(read[0], read[1], reply, sent_at)
    return reply


def through_async(
    cache: NearCache,
    send: Callable[..., asyncio.Future[Reply]],
    type_name: str,
    body: Mapping[str, Any] | None,
    session_id: SessionId | None,
    **kw: Any,
) -> asyncio.Future[Reply]:
    """``AsyncClient.call`` of a type in NEAR_TYPES: a hit is a future already done; a miss's reply is offered
    to the cache when it comes."""
    read = read_key(cache, type_name, body, session_id)
    if read is None:
        before_write(cache, type_name, body, session_id)
        return send(type_name, body, session_id=session_id, **kw)
    hit = cache.lookup(read[1])
    if hit is not None:
        done: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        done.set_result(hit)
        return done
    sent_at = cache.clock()
    fut = send(type_name, body, session_id=session_id, **kw)

    def keep(f: asyncio.Future[Reply]) -> None:
        if not f.cancelled() and f.exception() is None:
            cache.offer(read[0], read[1], f.result(), sent_at)

    fut.add_done_callback(keep)
    return fut


class Follower:
    """The thread that follows the event stream for a near cache (``start``, ``stop``, ``join``)."""

    def __init__(self, *, cache: NearCache, client: Client) -> None:
        assert cache.publishers is not None
        self.cache = cache
        self._client = client
        self._publishers = cache.publishers
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self.run, name="smartcache-near-cache", daemon=True)
        self._heard_any = False
        self._said_silent = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()

    def join(self, timeout_s: float | None = None) -> None:
        self._thread.join(timeout_s)

    def run(self) -> None:
        # Sockets of this thread only: the touches' client, the subscription's (made in _subscribe).
        toucher = self._client.twin(timeout_s=TOUCH_WAIT_S)
        toucher.near_cache = None  # type: ignore[attr-defined]  # its touches are the cache's own
        sub: Subscription | None = None
        monitor: zmq.Socket[Any] | None = None
        started = time.monotonic()
        try:
            while not self._stopping.is_set():
                if sub is None:
                    sub, monitor = self._subscribe()
                    if sub is None:
                        self._stopping.wait(RESTART_S)
                        continue
                try:
                    self._turn(sub)
                except CursorTooOld as e:
                    log.warning("near_cache_cursor_too_old: %s; its shards start again from the head", e)
                    sub, monitor = self._restart(sub, monitor)
                    continue
                except RequestError as e:
                    log.warning("near_cache_catch_up_failed: %s; the subscription starts again", e)
                    sub, monitor = self._restart(sub, monitor)
                    continue
                if monitor is not None:
                    self._watch(monitor)
                self._tell(sub)
                if not self._heard_any and not self._said_silent and time.monotonic() - started > NO_STREAM_S:
                    self._said_silent = True
                    log.warning(
                        "near_cache_not_serving: no message from the events endpoint %s within %g s; every read "
                        "goes to the service until one comes",
                        self._publishers,
                        NO_STREAM_S,
                    )
                self._touch(toucher)
        except Exception:
            log.exception("near_cache_follower_failed; the cache is disabled")
            self.cache.disable("its follower failed")
        finally:
            if sub is not None:
                self._restart(sub, monitor, again=False)
            toucher.close(linger_ms=0)

    def _subscribe(self) -> tuple[Subscription | None, zmq.Socket[Any] | None]:
        try:
            sub = self._client.subscribe(publishers=self._publishers, retry_s=CATCH_UP_RETRY_S)
        except (RequestError, ValueError, zmq.ZMQError) as e:
            self.cache.disable(f"the event log could not be read ({e})")
            return None, None
        if not self.cache.enabled:
            self.cache.enabled = True
            log.warning("near_cache_enabled: following the events endpoint %s", self._publishers)
        for shard, cursor in sub.cursors.items():
            self.cache.start_stream(shard, cursor)
        sub.on_gap = self.cache.gap
        return sub, sub.monitor()

    def _restart(self, sub: Subscription, monitor: zmq.Socket[Any] | None, *, again: bool = True) -> tuple[None, None]:
        """Close a subscription (its shards stop being served); the next turn starts a new one from the heads."""
        for shard in sub.cursors:
            self.cache.stream_state(shard, current=False, heard_at=-math.inf)
        if monitor is not None:
            monitor.close(linger=0)
        sub.close()
        return None, None

    def _turn(self, sub: Subscription) -> None:
        """Apply what the subscription delivers: waits up to POLL_S for the first event."""
        event = sub.poll(POLL_S)
        n = 0
        while event is not None:
            self.cache.apply(event.shard, event.seq, event.topic, event.key, event.payload)
            n += 1
            if n >= EVENTS_PER_TURN:
                return
            event = sub.poll(0)

    def _tell(self, sub: Subscription) -> None:
        behind = sub.behind
        for shard, cursor in sub.cursors.items():
            heard = sub.heard.get(shard)
            if heard is not None:
                self._heard_any = True
            current = shard not in behind and self.cache.applied(shard) == cursor
            self.cache.stream_state(shard, current=current, heard_at=-math.inf if heard is None else heard)

    def _watch(self, monitor: zmq.Socket[Any]) -> None:
        while monitor.poll(0):
            message = recv_monitor_message(monitor)
            if message["event"] == zmq.EVENT_DISCONNECTED:
                self.cache.disconnected()

    def _touch(self, client: BlockingClient) -> None:
        """The touches hits asked for: sent together, then their answers (SESSION_TOUCH slides the deadline as
        a service read would have)."""
        entries = self.cache.take_touches()
        if not entries:
            return
        sent = []
        for e in entries[:TOUCH_BATCH]:
            sid, binding = e.key
            sent.append((e, self.cache.clock(), client.send("SESSION_TOUCH", {"binding": binding}, session_id=sid)))
        unanswered = list(entries[TOUCH_BATCH:])
        for e, at, rid in sent:
            try:
                reply = client.wait(rid, TOUCH_WAIT_S)
            except RequestError:
                unanswered.append(e)
                continue
            self.cache.touched(e.key, at, reply.body if reply.ok else None)
        self.cache.untouched(unanswered)


def attach(cache: NearCache, client: Client) -> Follower | None:
    """Give a client its near cache: a follower thread started, or, with no events endpoint, the cache disabled
    (said once). A cache already followed (another client of the process, its twins) is shared: None."""
    if cache.follower is not None or not cache.enabled:
        return None
    if cache.publishers is None:
        cache.disable("no events endpoint given (NearCache(publishers=...))")
        return None
    follower = Follower(cache=cache, client=client)
    cache.follower = follower
    follower.start()
    return follower
