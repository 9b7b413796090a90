"""A shard's leader, kept connected, found by its leader key in etcd and watched while a call goes unanswered.

Every step of a move is a call on a shard's leader (the instance the shard's leader key in
etcd names: what the instances elect by). A leader lost mid-move (killed, frozen, cut off)
is ridden out here: a call that finds it gone or no longer leading goes to the new one, and
a call left unanswered is dropped once the key names another instance or none (a frozen
leader answers nothing, a dead host sends no reset), so the bucket's pause grows by about a
failover, not by ANSWER_TIMEOUT_S.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from smartcache.ops import etcd, instances
from smartcache.ops.access import Access
from smartcache.ops.moves.errors import MoveError
from smartcache.wire import topology

#: how long a call looks for its shard's leader (a failover takes a TTL and a bit)
LEADER_WAIT_S = 10.0
LEADER_POLL_S = 0.3
#: a call unanswered this long has its leader watched: once the shard's leader key (etcd) names another instance
#: or none, the leader lost its lease (a frozen or cut-off leader answers nothing, a dead host sends no reset), the
#: call is dropped and asked of the new leader, a failover after the loss, not ANSWER_TIMEOUT_S after it
WATCH_AFTER_S = 1.0
#: how long the watcher's read of the leader key may take (etcd not answering: the call is left to its timeout)
WATCH_READ_TIMEOUT_S = 1.0
#: how long one call may take (a gc deletes a bucket's rows in batches)
ANSWER_TIMEOUT_S = 10.0


@dataclass
class _Call:
    """A call under way on a shard's leader, as its Link's watcher sees it."""

    conn: Any
    leader: str
    done: threading.Event = field(default_factory=threading.Event)
    #: the watcher found the leader's key gone or another's, and shut the connection
    dropped: bool = False


def _shut(conn: Any) -> None:
    """Wake a call blocked on conn's answer at once (it fails with a lost connection). The connector has no way
    to interrupt a read; shutting the socket down does, from any thread (closing it would not wake the read)."""
    sock = getattr(conn, "_socket", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class Link:
    """One shard's leader, kept connected; a call that finds it gone or no longer leading goes to the new one.

    The leader is the instance the shard's leader key in etcd names (what the instances elect by), asked directly:
    a frozen old leader costs no connect timeout once its key is gone. A call that waits past WATCH_AFTER_S is
    watched by a thread of the Link's own, which reads the key every LEADER_POLL_S and drops the call once the key
    names another instance or none. Before, a call on a frozen leader waited for it to wake or for
    ANSWER_TIMEOUT_S: the fault rows move-stop-source/-destination (SIGSTOP for 6 s, TTL 3 s) paused the
    interrupted bucket 6.3-6.8 s; with the watch 3.4-3.6 s, about the failover (docs/sharding.md)."""

    def __init__(self, access: Access, shard: str) -> None:
        assert access.cluster is not None
        self.shard = shard
        self.access = replace(access, cluster=topology.shard_cluster(access.cluster, shard), addresses=())
        self.leader: str | None = None
        self.dropped = 0  # calls dropped because their leader lost its key (tests, logs)
        self._conn: Any = None
        self._cond = threading.Condition()
        self._current: _Call | None = None
        self._watcher: threading.Event | None = None  # set: the watcher thread is to end

    def call(self, procedure: str, *args: Any) -> dict[str, Any]:
        """sc.<procedure>(nil, *args) on the leader; NOT_LEADER and lost connections are retried for
        LEADER_WAIT_S on whoever leads then. A call lost after it was sent may have happened: every
        transition is safe to ask again (a repeat answers OK)."""
        deadline = time.monotonic() + LEADER_WAIT_S
        last = "no leader"
        while True:
            try:
                if self._conn is None:
                    self.leader = self._find_leader()
                    self._conn = instances.connection(self.access, self.leader, ANSWER_TIMEOUT_S)
                result = self._watched(procedure, args)
                if result.get("status") != "NOT_LEADER":
                    return result
                last = f"{self.leader} answered NOT_LEADER"
            except (*instances.CONNECTION_ERRORS, MoveError) as e:
                last = f"{type(e).__name__}: {e}"
            self._drop()
            if time.monotonic() > deadline:
                raise MoveError(f"shard {self.shard}: {procedure} not answered by a leader in {LEADER_WAIT_S:g} s"
                                f" ({last})")  # fmt: skip
            time.sleep(LEADER_POLL_S)

    def _find_leader(self) -> str:
        """The address the shard's leader key names; without etcd's answer, the instance that says it leads."""
        try:
            uri = self._key_uri(self.access.timeout_s)
        except etcd.EtcdUnavailable:
            uri = instances.leader_of(self.access)
        if uri is None:
            raise MoveError(f"shard {self.shard}: no instance leads")
        return uri

    def _key_uri(self, timeout_s: float) -> str | None:
        """The uri in the shard's leader key (None: no key, no instance leads); raises EtcdUnavailable."""
        assert self.access.cluster is not None
        found = etcd.read(self.access.etcd, topology.leader_key(self.access.cluster), timeout_s)
        if not found:
            return None
        try:
            uri = json.loads(found[0][1]).get("uri")
        except (ValueError, AttributeError):
            return None
        return uri if isinstance(uri, str) and uri else None

    def _watched(self, procedure: str, args: tuple[Any, ...]) -> dict[str, Any]:
        """The call on the connection, its leader watched while it goes unanswered."""
        assert self.leader is not None
        call = _Call(self._conn, self.leader)
        with self._cond:
            self._current = call
            self._cond.notify()
            if self._watcher is None:
                self._watcher = threading.Event()
                threading.Thread(target=self._watch, args=(self._watcher,), name=f"link-{self.shard}",
                                 daemon=True).start()  # fmt: skip
        try:
            result: dict[str, Any] = self._conn.call(f"sc.{procedure}", [None, *args]).data[0]
            return result
        except instances.CONNECTION_ERRORS as e:
            if call.dropped:
                raise MoveError(f"{call.leader} no longer holds {self.shard}'s leader key: {procedure} "
                                f"asked again of the new leader") from e  # fmt: skip
            raise
        finally:
            call.done.set()
            with self._cond:
                self._current = None

    def _watch(self, stop: threading.Event) -> None:
        """The watcher: each call still unanswered after WATCH_AFTER_S, until it ends or its leader loses the key;
        ends once stop is set."""
        while True:
            with self._cond:
                self._cond.wait_for(lambda: stop.is_set() or (self._current is not None
                                                              and not self._current.done.is_set()))  # fmt: skip
                if stop.is_set():
                    return
                call = self._current
            assert call is not None
            if call.done.wait(WATCH_AFTER_S):
                continue
            while not call.done.wait(LEADER_POLL_S) and not stop.is_set():
                try:
                    uri = self._key_uri(WATCH_READ_TIMEOUT_S)
                except etcd.EtcdUnavailable:
                    continue  # cannot tell: the call keeps its own timeout
                if uri != call.leader and not call.done.is_set():
                    call.dropped = True
                    self.dropped += 1
                    _shut(call.conn)
                    break

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(*instances.CONNECTION_ERRORS):
                self._conn.close()
            self._conn = None

    def close(self) -> None:
        """The connection closed and the watcher ended (a later call starts them again)."""
        self._drop()
        with self._cond:
            if self._watcher is not None:
                self._watcher.set()
                self._watcher = None
            self._cond.notify_all()


class Links(dict[str, Link]):
    """A Link per shard, made on first use."""

    def __init__(self, access: Access) -> None:
        super().__init__()
        self.access = access

    def __missing__(self, shard: str) -> Link:
        link = self[shard] = Link(self.access, shard)
        return link

    def close(self) -> None:
        for link in self.values():
            link.close()
