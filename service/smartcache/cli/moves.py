"""Moving buckets between shards: one bucket's move, the settling of moves left half-done, and plans.

docs/design/resharding.md is the design and lua/README.md ("Moving a bucket") the
states and transitions, each a compare-and-set that storage checks
(lua/smartcache/moves.lua). This module only drives them, in the order that keeps
a bucket active on at most one shard:

1. source ``send_start`` (active -> sending, generation + 1: the bucket's calls are
   answered BUCKET_MOVING from now on);
2. destination ``recv_start`` (receiving at that generation);
3. the rows, space by space, page by page (``bucket_rows`` -> ``bucket_recv``; each
   chunk one synchronous transaction on the destination);
4. source ``send_done`` (sending -> sent: calls answered WRONG_BUCKET naming the
   destination);
5. destination ``recv_done`` (receiving -> active: served there);
6. the bucket map in etcd, by compare-and-swap on its revision;
7. source ``gc`` (its copy deleted in batches, then its row).

A leader lost mid-move (killed, frozen, cut off) is ridden out: each call goes to the
leader the shard's leader key names, one left unanswered is dropped once the key names
another (:class:`Link`), and the new leader finds the move where the old one left it, so
the bucket's pause grows by about a failover. A failure before 4 that outlasts that
(LEADER_WAIT_S, or a step refused) gives the move up (source ``send_abort``: active again
at a higher generation, so the destination's partial copy can never be made active;
destination ``recv_abort``). After 4 the move can only go forward. :func:`settle` finishes or
gives up what a driver left (a killed CLI, a leader change, a partition), and every
service instance runs it every few seconds (the ``Settler``), so no move needs a
person to end. Any number of drivers may act on one bucket at once: each transition
is checked by storage against the bucket's status and generation.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from smartcache.cli import cluster, etcd
from smartcache.wire import topology

#: the sharded spaces, in the order a bucket's rows are copied (a session before its cache entries: storage
#: checks a cache entry's bucket by its session)
SPACES = (
    "sessions", "cache", "device", "prewarm", "counters", "registers", "sequences",
    "semaphore_holders", "latches", "queue_tasks",
)  # fmt: skip
#: rows per chunk of a copy (storage takes up to 2,000)
CHUNK = 1000
#: a move that has made no progress for this long is given up by the settler (its driver is gone); longer
#: than a driver's call may take to find a new leader, so that a driver riding out a failover is not overtaken
STALL_S = 15.0
#: how long a call looks for its shard's leader (a failover takes a TTL and a bit)
LEADER_WAIT_S = 10.0
LEADER_POLL_S = 0.3
#: a call unanswered this long has its leader watched: once the shard's leader key (etcd) names another instance
#: or none, the leader lost its lease (a frozen or cut-off leader answers nothing, a dead host sends no reset), the
#: call is dropped and asked of the new leader, a failover after the loss, not ANSWER_TIMEOUT_S after it
WATCH_AFTER_S = 1.0
#: how long the watcher's read of the leader key may take (etcd not answering: the call is left to its timeout)
WATCH_READ_TIMEOUT_S = 1.0
#: how often the settler's thread looks at the clock (its interval may be changed while it runs)
SETTLER_TICK_S = 0.5
#: how long one call may take (a gc deletes a bucket's rows in batches)
ANSWER_TIMEOUT_S = 10.0


class MoveError(Exception):
    """A move cannot go on: a shard without a leader, or a step refused; the message says which."""


class NotSharded(MoveError):
    """The cluster has no bucket map."""


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

    def __init__(self, access: cluster.Access, shard: str) -> None:
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
                    self._conn = cluster.connection(self.access, self.leader, ANSWER_TIMEOUT_S)
                result = self._watched(procedure, args)
                if result.get("status") != "NOT_LEADER":
                    return result
                last = f"{self.leader} answered NOT_LEADER"
            except (*cluster.CONNECTION_ERRORS, MoveError) as e:
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
            uri = cluster.leader_of(self.access)
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
        except cluster.CONNECTION_ERRORS as e:
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
            with contextlib.suppress(*cluster.CONNECTION_ERRORS):
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

    def __init__(self, access: cluster.Access) -> None:
        super().__init__()
        self.access = access

    def __missing__(self, shard: str) -> Link:
        link = self[shard] = Link(self.access, shard)
        return link

    def close(self) -> None:
        for link in self.values():
            link.close()


# --- the bucket map ---


def read_map(access: cluster.Access) -> tuple[dict[str, Any], int]:
    """etcd's bucket map and its mod_revision; MoveError when the cluster is not sharded."""
    assert access.cluster is not None
    raw, revision = etcd.read_revision(access.etcd, topology.buckets_key(access.cluster), access.timeout_s)
    if raw is None:
        raise NotSharded(f"cluster {access.cluster} has no bucket map: not sharded (cluster init --shards)")
    doc: dict[str, Any] = json.loads(raw)
    return doc, revision


def owners(doc: dict[str, Any]) -> list[str]:
    """The map as one owner per bucket."""
    out = [""] * int(doc["buckets"])
    for first, last, shard in doc["ranges"]:
        out[first : last + 1] = [shard] * (last - first + 1)
    return out


def ranges_of(owner: Sequence[str]) -> list[list[Any]]:
    """Owners per bucket as [first, last, shard] ranges."""
    out: list[list[Any]] = []
    for b, shard in enumerate(owner):
        if out and out[-1][2] == shard and out[-1][1] == b - 1:
            out[-1][1] = b
        else:
            out.append([b, b, shard])
    return out


def change_map(access: cluster.Access, change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> dict[str, Any]:
    """Apply change to the map by compare-and-swap (read, change, put if unchanged since; again on a race).
    change returns the new map, or None when the map already says what it should."""
    for _ in range(20):
        doc, revision = read_map(access)
        new = change(doc)
        if new is None:
            return doc
        new["version"] = int(doc["version"]) + 1
        assert access.cluster is not None
        key = topology.buckets_key(access.cluster)
        if etcd.put_if(access.etcd, key, json.dumps(new).encode(), revision, access.timeout_s):
            return new
    raise MoveError("the bucket map changed under every one of 20 compare-and-swaps")


def assign(access: cluster.Access, buckets: dict[int, str], was: dict[int, str] | None = None) -> dict[str, Any]:
    """The map names these owners for these buckets (one swap for all); with was, only for the buckets whose owner
    in the map is still the one the caller saw (a caller with an older view never undoes a newer move)."""

    def change(doc: dict[str, Any]) -> dict[str, Any] | None:
        owner = owners(doc)
        todo = {b: s for b, s in buckets.items() if owner[b] != s and (was is None or owner[b] == was.get(b))}
        if not todo:
            return None
        for b, s in todo.items():
            owner[b] = s
        shards = list(doc["shards"]) + sorted(set(todo.values()) - set(doc["shards"]))
        return {**doc, "shards": shards, "ranges": ranges_of(owner)}

    return change_map(access, change)


# --- one move ---


@dataclass
class Moved:
    """What one move did and how long calls of the bucket were paused."""

    bucket: int
    source: str
    destination: str
    rows: int = 0
    paused_ms: float = 0.0
    chunks: int = 0
    steps: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"bucket": self.bucket, "from": self.source, "to": self.destination, "rows": self.rows,
                "paused_ms": round(self.paused_ms, 1), "chunks": self.chunks}  # fmt: skip


def _ok(result: dict[str, Any], what: str) -> dict[str, Any]:
    if result.get("status") != "OK":
        raise MoveError(f"{what}: {result.get('status')}: {result.get('message') or result}")
    return result


def move(access: cluster.Access, links: Links, bucket: int, destination: str) -> Moved:
    """Move bucket to destination, from the shard the map names; MoveError when the move was given up (the bucket
    active where it was) or, past the source's send_done, left for the settler to finish."""
    doc, _ = read_map(access)
    if not 0 <= bucket < int(doc["buckets"]):
        raise MoveError(f"bucket must be 0..{int(doc['buckets']) - 1}, not {bucket}")
    source = owners(doc)[bucket]
    if source == destination:
        raise MoveError(f"bucket {bucket} is on {destination} already")
    if destination not in doc["shards"]:
        raise MoveError(f"no shard {destination!r} in the map (cluster shard add first)")
    src, dst = links[source], links[destination]
    state = _ok(src.call("bucket_state", bucket), f"bucket {bucket} on {source}")
    if state.get("state") != "active":
        raise MoveError(f"bucket {bucket} is {state.get('state')} on {source}, not active: settle it first")
    out = Moved(bucket, source, destination)
    started = time.monotonic()
    gen = int(_ok(src.call("bucket_send_start", bucket, destination, state["generation"]), "send_start")["generation"])
    try:
        numbers = state.get("numbers") or {}
        _ok(dst.call("bucket_recv_start", bucket, source, gen, numbers), f"recv_start on {destination}")
        for space in SPACES:
            after = None
            while True:
                page = _ok(src.call("bucket_rows", bucket, gen, space, after, CHUNK), f"rows of {space}")
                if page["rows"]:
                    _ok(dst.call("bucket_recv", bucket, gen, space, page["rows"]), f"recv of {space}")
                    out.rows += len(page["rows"])
                    out.chunks += 1
                if page["done"]:
                    break
                after = page["last"]
        _ok(src.call("bucket_send_done", bucket, gen), "send_done")
    except Exception as e:  # any failure before the source is sent: give the move up (or find it sent after all)
        if give_up(links, bucket, source, destination, gen) != "forward":
            raise MoveError(f"bucket {bucket} {source} -> {destination} given up: {type(e).__name__}: {e}") from e
    # Past send_done the move only goes forward (a failure here is the settler's to finish).
    try:
        _ok(dst.call("bucket_recv_done", bucket, gen), "recv_done")
    except MoveError as e:
        raise MoveError(f"bucket {bucket} {source} -> {destination}: sent, left for the settler: {e}") from e
    out.paused_ms = (time.monotonic() - started) * 1000
    assign(access, {bucket: destination}, was={bucket: source})
    try:
        _ok(src.call("bucket_gc", bucket, gen), "gc")
    except MoveError as e:  # moved all the same: the garbage is the settler's
        out.steps.append(f"gc left for the settler: {e}")
    return out


def give_up(links: Links, bucket: int, source: str, destination: str, generation: int) -> str:
    """Give a move at generation up: the source active again (at generation + 1), and only then the destination's
    copy deleted. Returns "given up"; "forward" when the source turned out to be sent at that generation (the
    destination is made active instead); "unknown" when the source could not say (the destination is left alone:
    the settler decides once it can ask both)."""
    try:
        r = links[source].call("bucket_send_abort", bucket, generation)
    except (MoveError, *cluster.CONNECTION_ERRORS):
        return "unknown"
    if r.get("status") == "OK":
        with contextlib.suppress(MoveError, *cluster.CONNECTION_ERRORS):
            links[destination].call("bucket_recv_abort", bucket, generation)
        return "given up"
    if r.get("state") in ("sent", "garbage") and r.get("generation") == generation:
        with contextlib.suppress(MoveError, *cluster.CONNECTION_ERRORS):
            if links[destination].call("bucket_recv_done", bucket, generation).get("status") == "OK":
                return "forward"
    return "unknown"


# --- settling what drivers left ---


def settle(access: cluster.Access, links: Links, *, stall_s: float | None = None) -> dict[str, Any]:
    """One pass over every shard: finish the moves past send_done, give up those stalled (no progress for
    stall_s, default STALL_S) before it, delete stale copies, collect garbage, and make the map name the shard
    each bucket is active on. Returns what it did, and how many buckets each shard serves and moves."""
    doc, _ = read_map(access)
    pass_ = _Pass(access, links, doc, STALL_S if stall_s is None else stall_s)
    held: dict[str, dict[str, Any]] = {}
    for shard in doc["shards"]:
        try:
            held[shard] = _ok(links[shard].call("buckets_held"), f"buckets of {shard}")
        except MoveError as e:
            pass_.did.append(f"{shard} not asked: {e}")
    for shard, h in held.items():
        for b, generation in h["active"]:
            pass_.active_on[b], pass_.active_gen[b] = shard, generation
    for shard, h in held.items():
        for m in h["moving"]:
            if m.get("peer") and not m.get("pending"):
                pass_.one(shard, m, h["now_ms"])
    wrong = {b: s for b, s in pass_.active_on.items() if pass_.owner[b] != s}
    if wrong:
        assign(access, wrong, was={b: pass_.owner[b] for b in wrong})
        pass_.did.append(f"the map names the shard {len(wrong)} bucket(s) are active on: {sorted(wrong)[:10]}")
    counts = {s: {"active": len(h["active"]), "moving": len(h["moving"])} for s, h in held.items()}
    return {"status": "OK", "did": pass_.did, "map_version": doc["version"], "held": counts}


@dataclass
class _Pass:
    """One settle pass: what it knows of the map and of who serves what, and what it did."""

    access: cluster.Access
    links: Links
    doc: dict[str, Any]
    stall_s: float
    did: list[str] = field(default_factory=list)
    active_on: dict[int, str] = field(default_factory=dict)
    #: bucket -> the generation it is active at (on active_on's shard)
    active_gen: dict[int, int] = field(default_factory=dict)
    owner: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.owner = owners(self.doc)

    def state(self, shard: str, bucket: int) -> dict[str, Any] | None:
        """The bucket's row on a shard's leader, committed (None: the shard cannot be asked now, or a write of
        the row still waits for its quorum: nothing is decided on a guess)."""
        if shard not in self.doc["shards"]:
            return None
        try:
            r = _ok(self.links[shard].call("bucket_state", bucket), f"bucket {bucket} on {shard}")
        except MoveError:
            return None
        return None if r.get("pending") else r

    def one(self, shard: str, m: dict[str, Any], now_ms: int) -> None:
        """A bucket of shard between states, against its peer's row; a refused step is noted, not raised."""
        try:
            self._one(shard, m, now_ms)
        except (MoveError, *cluster.CONNECTION_ERRORS, etcd.EtcdUnavailable) as e:
            self.did.append(f"bucket {m['bucket']} on {shard}: not settled now: {e}")

    def _one(self, shard: str, m: dict[str, Any], now_ms: int) -> None:
        b, status, gen, peer = m["bucket"], m["state"], m["generation"], m["peer"]
        other = self.state(peer, b)
        if status == "sending":
            # Quiet on both clocks (each shard's own since and now): a move that makes progress on either is alive.
            quiet_ms = now_ms - (m.get("since") or 0)
            if other is not None:
                quiet_ms = min(quiet_ms, (other.get("now_ms") or 0) - (other.get("since") or 0))
            if quiet_ms > self.stall_s * 1000:
                outcome = give_up(self.links, b, shard, peer, gen)
                self.did.append(f"bucket {b} {shard} -> {peer}: {outcome}, {quiet_ms / 1000:.0f} s without progress")
            return
        if other is None:
            return
        o_status, o_gen = other.get("state"), other.get("generation")
        if status in ("sent", "garbage"):
            if o_status == "receiving" and o_gen == gen:
                _ok(self.links[peer].call("bucket_recv_done", b, gen), "recv_done")
                self.active_on[b], self.active_gen[b] = peer, gen
                self.did.append(f"bucket {b} {shard} -> {peer}: made active on {peer} (the source was sent)")
                o_status = "active"
            moved_on = b in self.active_on and self.active_on[b] != shard and self.active_gen[b] >= gen
            if (o_status == "active" and o_gen == gen) or moved_on:
                if o_status == "active" and o_gen == gen and self.owner[b] != peer:
                    assign(self.access, {b: peer}, was={b: self.owner[b]})
                    self.owner[b] = peer
                _ok(self.links[shard].call("bucket_gc", b, gen), "gc")
                self.did.append(f"bucket {b}: garbage on {shard} deleted")
        elif status in ("receiving", "aborting"):
            # A copy the source no longer backs: it holds nothing of the bucket, or moved on to a later generation.
            stale = o_gen is not None and (o_gen > gen or (o_gen == gen and o_status == "active"))
            if status == "aborting" or o_status is None or (stale and o_status in ("active", "sending")):
                _ok(self.links[shard].call("bucket_recv_abort", b, gen), "recv_abort")
                self.did.append(f"bucket {b}: a stale copy on {shard} (generation {gen}) deleted")


# --- plans ---


def plan_even(doc: dict[str, Any], shards: Sequence[str], *, away: Sequence[str] = ()) -> list[tuple[int, str]]:
    """Moves (bucket, destination) that leave the shards holding the buckets evenly by count (within one), every
    bucket of away moved to the others; the fewest moves (a shard gives only what it holds above its share)."""
    owner = owners(doc)
    keep = [s for s in shards if s not in away]
    if not keep:
        raise MoveError("no shard would be left to hold the buckets")
    held: dict[str, list[int]] = {s: [] for s in keep}
    pool: list[int] = []
    for b, s in enumerate(owner):
        held.get(s, pool).append(b)
    base, extra = divmod(len(owner), len(keep))
    by_size = sorted(keep, key=lambda x: -len(held[x]))
    target = {s: base + (1 if i < extra else 0) for i, s in enumerate(by_size)}
    for s in keep:
        while len(held[s]) > target[s]:
            pool.append(held[s].pop())
    moves: list[tuple[int, str]] = []
    for b in pool:
        s = max(keep, key=lambda x: target[x] - len(held[x]))
        held[s].append(b)
        moves.append((b, s))
    return moves


class Progress:
    """A progress line on stderr: done/total, buckets/s and rows/s, time left."""

    def __init__(self, total: int, out: Any = None) -> None:
        self.total, self.done, self.rows, self.failed = total, 0, 0, 0
        self.started = time.monotonic()
        self.out = out if out is not None else sys.stderr
        self.lock = threading.Lock()
        self._shown = 0.0

    def add(self, moved: Moved | None) -> None:
        with self.lock:
            self.done += 1
            if moved is None:
                self.failed += 1
            else:
                self.rows += moved.rows
            now = time.monotonic()
            if now - self._shown >= 1.0 or self.done == self.total:
                self._shown = now
                self.out.write(self.line() + ("\n" if self.done == self.total else "\r"))
                self.out.flush()

    def line(self) -> str:
        took = max(time.monotonic() - self.started, 1e-6)
        rate = self.done / took
        left = (self.total - self.done) / rate if rate > 0 else 0.0
        width = 30
        filled = int(width * self.done / max(self.total, 1))
        return (f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} buckets, "
                f"{rate:.1f} buckets/s, {self.rows / took:.0f} rows/s, {left:.0f} s left"
                + (f", {self.failed} given up" if self.failed else ""))  # fmt: skip


def run_moves(
    access: cluster.Access,
    moves: Sequence[tuple[int, str]],
    *,
    parallel: int = 2,
    pause_s: float = 0.0,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Do the moves, at most parallel at once (each worker its own connections), pause_s between one worker's
    moves (throttling, so the front tier keeps its latency). Returns the totals and the pause per bucket."""
    results: list[Moved] = []
    errors: list[str] = []
    todo = list(moves)
    lock = threading.Lock()
    started = time.monotonic()

    def worker() -> None:
        links = Links(access)
        try:
            while True:
                with lock:
                    if not todo:
                        return
                    bucket, destination = todo.pop(0)
                try:
                    moved = move(access, links, bucket, destination)
                except Exception as e:  # reported with the others; the next move goes on
                    with lock:
                        errors.append(str(e))
                    if progress is not None:
                        progress.add(None)
                    continue
                with lock:
                    results.append(moved)
                if progress is not None:
                    progress.add(moved)
                if pause_s > 0:
                    time.sleep(pause_s)
        finally:
            links.close()

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        for f in [pool.submit(worker) for _ in range(max(1, min(parallel, len(todo))))]:
            f.result()
    took = time.monotonic() - started
    pauses = sorted(m.paused_ms for m in results)

    def pct(p: float) -> float:
        return round(pauses[min(len(pauses) - 1, int(p * len(pauses)))], 1) if pauses else 0.0

    rows = sum(m.rows for m in results)
    return {
        "status": "OK" if not errors else "INCOMPLETE",
        "moved": len(results),
        "given_up": len(errors),
        "errors": errors[:20],
        "rows": rows,
        "seconds": round(took, 1),
        "buckets_per_s": round(len(results) / took, 2) if took > 0 else None,
        "rows_per_s": round(rows / took) if took > 0 else None,
        "paused_ms": {"p50": pct(0.5), "p99": pct(0.99), "max": pauses[-1] if pauses else 0.0},
    }


def shard_add(access: cluster.Access, name: str) -> dict[str, Any]:
    """A new shard (its replica set running as SC_CLUSTER=<cluster>.<name>) joins the map holding no bucket, and
    its leader learns the bucket count; rebalance then fills it."""
    doc, _ = read_map(access)
    link = Link(access, name)
    try:
        init = link.call("buckets_init", doc["buckets"], [])
    finally:
        link.close()
    if init.get("status") != "OK":
        return {"status": init.get("status"), "message": f"shard {name}: {init.get('message') or init}"}

    def change(d: dict[str, Any]) -> dict[str, Any] | None:
        return None if name in d["shards"] else {**d, "shards": [*d["shards"], name]}

    new = change_map(access, change)
    return {"status": "OK", "shard": name, "shards": new["shards"], "map_version": new["version"]}


class Settler:
    """Runs :func:`settle` every interval_s in a thread of its own (every service instance has one, so a move
    whose driver died is finished or given up with no person); stopped by stop()."""

    def __init__(
        self,
        access: cluster.Access,
        interval_s: float = 5.0,
        log: Callable[[dict[str, Any]], None] | None = None,
        observe: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.access = access
        self.interval_s = interval_s
        self._log = log
        self._observe = observe  # every pass's result (the buckets each shard holds and moves: metrics)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bucket-settler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 1.0) -> None:
        """Ask the thread to end and wait timeout_s for it (a pass under way ends by itself: a daemon thread, its
        connections closed when it does; a service's stop is not held up by an etcd that does not answer)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        links = Links(self.access)
        failing = ""
        last = time.monotonic()
        try:
            while not self._stop.wait(min(SETTLER_TICK_S, self.interval_s)):
                if time.monotonic() - last < self.interval_s:
                    continue
                last = time.monotonic()
                try:
                    result = settle(self.access, links)
                except NotSharded:
                    continue  # one replica set: nothing moves (a map made later is settled from then on)
                except Exception as e:  # the settler lives on; logged once per kind
                    error = f"{type(e).__name__}: {e}"
                    if error != failing and self._log is not None:  # once per kind of failure, not every pass
                        self._log({"status": "ERROR", "did": [error]})
                    failing = error
                    continue
                failing = ""
                if self._observe is not None:
                    self._observe(result)
                if result.get("did") and self._log is not None:
                    self._log({k: v for k, v in result.items() if k != "held"})
        finally:
            links.close()
