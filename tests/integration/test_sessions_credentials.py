"""A session id is a credential (issue 37): it leaves the service nowhere but in its client's replies.

One stack for the module: etcd (three members) and three Tarantool instances in HA mode
(conftest_ha) with an operator HTTP token, the real service as a child process over them
(discovery, a session key, DEBUG logs: every line it can write) and the operator's console as
a child process. The first test creates, reads, rotates and ends 1,000 sessions through the
service and guesses 50 more, then looks for every raw id (UUID text, hex and the 16 bytes) in
everything the stack shows or keeps: the events endpoint (every frame, raw), the operator HTTP
of each instance, the service's INFO and /metrics, the CLI's listings (session-list, events tail,
cluster status, audit), the console's lookups, and every file of the stack's directory: the
service's, the console's, each Tarantool's and etcd's logs, each instance's WAL and snapshots.
None may hold one. The second steals a follower's snapshot and shows that none of its session
keys works as a session id against the service.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import zmq

from smartcache.client import Client, Status
from smartcache.devstack.stack import free_port
from smartcache.wire import sessionkeys
from tests.conftest import service_env
from tests.integration.conftest_ha import HACluster, eventually, ha_cluster, wait_for

pytestmark = pytest.mark.slow

KEY_HEX = "c0ffee" + "11" * 29
KEY = bytes.fromhex(KEY_HEX)
HTTP_TOKEN = "creds-http-token-" + uuid.uuid4().hex
SESSIONS = 1000
CLIENTS = 100
GUESSES = 50
#: sessions left live at the end (what the lookups find)
LIVE = 20
#: clients whose sessions stay live until one log-out-everywhere each, at the end
LOGGED_OUT_TOGETHER = range(25)


# -- looking for raw ids -------------------------------------------------------------------------------

_UUID_AT = re.compile(rb"(?=([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}))")
_HEX_AT = re.compile(rb"(?=([0-9a-f]{32}))")


@dataclass
class RawIds:
    """Every raw session id the tests made or sent, and their forms: UUID text, hex, the 16 bytes."""

    raw: set[bytes] = field(default_factory=set)

    def add(self, sid: uuid.UUID | bytes | None) -> None:
        assert sid is not None
        self.raw.add(sid.bytes if isinstance(sid, uuid.UUID) else sid)

    def found_in(self, blob: bytes) -> set[bytes]:
        """The raw ids ``blob`` holds in any form (text forms in any case, overlapping runs included)."""
        found: set[bytes] = set()
        lower = blob.lower()
        texts = {str(uuid.UUID(bytes=r)).encode(): r for r in self.raw}
        texts |= {r.hex().encode(): r for r in self.raw}
        for pattern in (_UUID_AT, _HEX_AT):
            found |= {texts[m.group(1)] for m in pattern.finditer(lower) if m.group(1) in texts}
        # The 16 bytes at any offset: an occurrence at p holds the 8-byte word at the first multiple of 8 from p
        # (p + 0..7, wholly inside it), so the blob's aligned words are looked up among each id's nine 8-byte
        # pieces, and a hit is checked in full where it would start.
        pieces: dict[int, list[tuple[bytes, int]]] = {}
        for r in self.raw:
            for o in range(9):
                pieces.setdefault(int.from_bytes(r[o : o + 8], "little"), []).append((r, o))
        words = memoryview(blob[: len(blob) // 8 * 8]).cast("Q")
        for w in set(words) & pieces.keys():
            for r, o in pieces[w]:
                at = blob.find(w.to_bytes(8, "little"))
                while at != -1:
                    if at % 8 == 0 and at >= o and blob[at - o : at - o + 16] == r:
                        found.add(r)
                    at = blob.find(w.to_bytes(8, "little"), at + 1)
        return found


def _assert_none(ids: RawIds, where: str, blob: bytes) -> None:
    found = ids.found_in(blob)
    assert not found, f"{where}: {len(found)} raw session ids, e.g. {uuid.UUID(bytes=next(iter(found)))}"


# -- the stack -------------------------------------------------------------------------------------------


@dataclass
class Stack:
    ha: HACluster
    base: Path
    service: subprocess.Popen[bytes]
    endpoint: str
    events_endpoint: str
    metrics_url: str
    console_url: str
    service_log: Path
    console_log: Path
    cluster_env: dict[str, str]

    def client(self, **kwargs: Any) -> Client:
        return Client(self.endpoint, timeout_s=10, **kwargs)

    def cli(self, *args: str) -> str:
        """smartcache-cli's output (one JSON document per line)."""
        env = {**os.environ, **self.cluster_env}
        argv = [sys.executable, "-m", "smartcache.cli", "--endpoint", self.endpoint, "--json", *args]
        done = subprocess.run(argv, env=env, capture_output=True, timeout=60, check=False)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout.decode() + done.stderr.decode()

    def http(self, node: str, path: str) -> httpx.Response:
        url = self.ha.nodes[node].http_url + path
        return httpx.get(url, headers={"Authorization": f"Bearer {HTTP_TOKEN}"}, timeout=10)

    def console(self, path: str) -> httpx.Response:
        return httpx.get(self.console_url + path, timeout=30)


@contextlib.contextmanager
def _child(argv: list[str], env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(5)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("creds")
    with ha_cluster(base, SC_HTTP_TOKEN=HTTP_TOKEN) as ha:
        cluster = next(iter(ha.nodes.values())).env["SC_CLUSTER"]
        addresses = ",".join(n.address for n in ha.nodes.values())
        events_port = free_port()
        cluster_env = {"SMARTCACHE_ETCD": ha.etcd.url, "SMARTCACHE_CLUSTER": cluster, "SMARTCACHE_TARANTOOL": addresses}
        env, port, metrics_port = service_env(
            addresses,
            **cluster_env,
            SMARTCACHE_EVENTS_LISTEN=f"tcp://127.0.0.1:{events_port}",
            SMARTCACHE_SESSION_KEY=KEY_HEX,
            SMARTCACHE_LOG_LEVEL="debug",  # every line the service can write is looked at
            # the stolen snapshot's ids are tried a thousand at a time: NOT_FOUND answered, not throttled
            SMARTCACHE_NOT_FOUND_PER_PEER_PER_S="100000",
        )
        endpoint, metrics_url = f"tcp://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}"
        service_log = base / "service.log"
        with _child([sys.executable, "-m", "smartcache.server"], env, service_log) as service:
            eventually(lambda: _ready(metrics_url), 30, what=lambda: service_log.read_text()[-2000:])
            console_port = free_port()
            console_env = {**os.environ, "SC_HTTP_TOKEN": HTTP_TOKEN, "SMARTCACHE_CONSOLE_TOKEN": uuid.uuid4().hex}
            console_env.pop("SMARTCACHE_METRICS_TOKEN", None)
            console_argv = [
                sys.executable, "-m", "smartcache.console",
                "--listen", f"127.0.0.1:{console_port}",
                "--tarantool", addresses, "--etcd", ha.etcd.url, "--cluster", cluster,
                "--service", f"{endpoint}={metrics_url}",
                "--publishers", f"tcp://127.0.0.1:{events_port}",
                "--scrape-s", "1", "--timeout", "1",
            ]  # fmt: skip
            console_log = base / "console.log"
            with _child(console_argv, console_env, console_log):
                yield Stack(
                    ha,
                    base,
                    service,
                    endpoint,
                    f"tcp://127.0.0.1:{events_port}",
                    metrics_url,
                    f"http://127.0.0.1:{console_port}",
                    service_log,
                    console_log,
                    cluster_env,
                )


def _ready(metrics_url: str) -> bool:
    try:
        return httpx.get(metrics_url + "/health/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class EventCapture:
    """A raw SUB socket on the events endpoint: every frame as it came, kept."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.connect(endpoint)
        self.frames: list[bytes] = []

    def drain(self, quiet_s: float = 2.5, most_s: float = 60.0) -> None:
        """Take frames until only heartbeats (an empty topic, one a second when idle) came for quiet_s."""
        end, last = time.monotonic() + most_s, time.monotonic()
        while time.monotonic() - last < quiet_s and time.monotonic() < end:
            if self.sock.poll(200):
                frames = self.sock.recv_multipart()
                self.frames += frames
                if frames[0]:  # an event, not a heartbeat
                    last = time.monotonic()

    def topics(self) -> set[bytes]:
        return {f for f in self.frames if f.startswith((b"session.", b"device."))}

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


# -- the workload ------------------------------------------------------------------------------------------


@dataclass
class Made:
    ids: RawIds
    handles: dict[str, str]  # handle -> its client
    clients: list[str]
    #: the sessions left live after the workload: handle -> its client
    live: dict[str, str] = field(default_factory=dict)
    #: every reply header the tests received: the positive control of the search
    headers: list[bytes] = field(default_factory=list)


def _client_of(i: int) -> str:
    return f"leak-client-{i % CLIENTS}"


def _workload(c: Client, made: Made) -> None:
    """1,000 sessions created (half under an idempotency key, a tenth bound), read, cached in, updated, rotated
    (the old id read in its grace window), then ended: by id, by handle, or by log out everywhere."""
    live: dict[str, list[tuple[uuid.UUID, str | None]]] = {}
    for i in range(SESSIONS):
        client, binding = _client_of(i), (f"device-{i}" if i % 10 == 0 else None)
        key = uuid.uuid4().hex if i % 2 else None
        created = c.session_create(client, data={"i": i}, device=f"phone-{i}", binding=binding, idempotency_key=key)
        assert created.ok, created.body
        if key is not None:  # a repeat under its key: the same id, made again from the key (storage's answer)
            again = c.session_create(client, data={"i": i}, device=f"phone-{i}", binding=binding, idempotency_key=key)
            assert again.session_id == created.session_id
        old = created.session_id
        assert old is not None
        made.ids.add(old)
        made.headers.append(bytes(created.header.session_id))
        assert c.session_get(old, binding=binding).ok
        assert c.cache_put("cart", {"n": i}, session_id=old, binding=binding).ok
        assert c.cache_get("cart", session_id=old, binding=binding).ok
        assert c.session_update(old, set={"step": 2}, binding=binding).ok
        rotated = c.session_rotate(old, binding=binding)
        assert rotated.ok, rotated.body
        new = rotated.session_id
        assert new is not None
        made.ids.add(new)
        made.handles[rotated.body["handle"]] = client
        during = c.session_get(old, binding=binding)  # the grace window: the old id still reads
        assert (during.status, during.body.get("rotated")) == (Status.OK, True)
        assert c.session_get(new, binding=binding).body["data"] == {"i": i, "step": 2}
        if i % CLIENTS in LOGGED_OUT_TOGETHER:
            live.setdefault(client, []).append((new, binding))
        elif i % 2:
            assert c.session_delete(new, binding=binding).ok
        else:
            assert c.session_delete(handle=rotated.body["handle"], client_id=client).ok
            assert c.session_get(new, binding=binding).status is Status.NOT_FOUND
    for _ in range(GUESSES):  # what a guesser sends: ids of nobody
        guess = uuid.uuid4()
        made.ids.add(guess)
        assert c.session_get(guess).status is Status.NOT_FOUND
    for client, sessions in live.items():
        assert c.session_list(client).body["sessions"]
        kept, binding = sessions[0]
        assert c.session_delete_client(client, keep=kept).ok
        assert c.session_delete(kept, binding=binding).ok
    for i in range(LIVE):  # left live: what the listings and lookups below show
        created = c.session_create(_client_of(i), data={"live": i}, device=f"tablet-{i}")
        assert created.ok
        made.ids.add(created.session_id)
        made.live[created.body["handle"]] = _client_of(i)


def _checkpoint(ha: HACluster) -> None:
    """box.snapshot() on every instance (SIGUSR1), waited for: the files hold everything storage has."""
    before = {n: set(node.data_dir.glob("*.snap")) for n, node in ha.nodes.items()}
    for node in ha.nodes.values():
        node.send_signal(signal.SIGUSR1)
    for n, node in ha.nodes.items():
        eventually(lambda n=n, node=node: set(node.data_dir.glob("*.snap")) - before[n], what=f"a snapshot on {n}")


def _files(base: Path) -> Iterable[Path]:
    return sorted(p for p in base.rglob("*") if p.is_file())


def _views(stack: Stack, made: Made, t0: float) -> dict[str, bytes]:
    """What the stack shows about sessions, by where: the operator HTTP of each instance, /metrics, the CLI's
    listings and the console's lookups (by client id and by handle)."""
    seen: dict[str, bytes] = {"/metrics": httpx.get(stack.metrics_url + "/metrics", timeout=10).content}
    for node in stack.ha.nodes:
        for path in ("/health", "/metrics", *(f"/clients/{cl}/sessions" for cl in made.clients)):
            seen[f"{node} {path}"] = stack.http(node, path).content
        for handle in [*list(made.handles)[:30], *made.live]:
            seen[f"{node} /sessions/{handle}"] = stack.http(node, f"/sessions/{handle}").content
    print(f"http {time.monotonic() - t0:.1f} s")
    seen["cli session-list"] = "".join(stack.cli("session-list", cl) for cl in made.clients[:40]).encode()
    seen["cli events tail"] = stack.cli(
        "events", "tail", "--publishers", stack.events_endpoint, "--from", "1", "--count", "2000"
    ).encode()
    seen["cli cluster status"] = stack.cli("cluster", "status").encode()
    seen["cli audit"] = stack.cli("audit").encode()
    seen["cli info"] = stack.cli("info").encode()
    print(f"cli {time.monotonic() - t0:.1f} s")
    lookups = [stack.console(f"/api/sessions?q={cl}") for cl in made.clients[:10]]
    lookups += [stack.console(f"/api/sessions?q={h}") for h in list(made.live)[:10]]
    lookups += [stack.console(p) for p in ("/api/status", "/api/services", "/api/events", "/api/audit")]
    assert all(r.status_code in (200, 503) for r in lookups), [r.text for r in lookups if r.status_code >= 400]
    # the search looks at real answers: the session lookups found sessions, named by their handles
    assert all(r.status_code == 200 for r in lookups[:20]), [r.text for r in lookups[:20] if r.status_code != 200]
    assert all(h.encode() in r.content for r, h in zip(lookups[10:20], made.live, strict=False))
    assert all(h.encode() in seen[f"{n} /sessions/{h}"] for n in stack.ha.nodes for h in made.live)
    seen["console"] = b"\n".join(r.content for r in lookups)
    return seen


# -- the tests ---------------------------------------------------------------------------------------------


def test_no_raw_session_id_leaves_the_service_but_in_its_clients_replies(stack: Stack) -> None:
    """Created, read, rotated and ended 1,000 sessions (and 50 guesses): no raw id in the events, the operator
    HTTP, INFO, /metrics, the CLI's listings, the console's lookups, or any log, WAL or snapshot of the stack."""
    t0 = time.monotonic()
    capture = EventCapture(stack.events_endpoint)
    made = Made(RawIds(), {}, [_client_of(i) for i in range(CLIENTS)])
    try:
        with stack.client() as c:
            eventually(lambda: c.ping().ok)
            time.sleep(0.5)  # the SUB socket's subscription reaches the publisher
            _workload(c, made)
            info = json.dumps(c.info().body, default=repr).encode()
        capture.drain()
    finally:
        capture.close()
    assert len(made.ids.raw) == 2 * SESSIONS + GUESSES + LIVE
    # The search finds what it looks for: every id is in the replies' headers it came in.
    assert made.ids.found_in(b"".join(made.headers)) == {bytes(h) for h in made.headers}
    assert made.ids.found_in(json.dumps([str(uuid.UUID(bytes=r)) for r in made.ids.raw]).encode()) == made.ids.raw

    print(f"workload {time.monotonic() - t0:.1f} s")
    events = b"\n".join(capture.frames)
    assert b"session.created" in events
    assert b"session.rotated" in events
    assert b"session.deleted" in events
    assert any(h.encode() in events for h in made.handles)  # events name sessions by handle
    _assert_none(made.ids, "the events endpoint", events)

    seen = {"INFO": info, **_views(stack, made, t0)}
    for where, blob in seen.items():
        _assert_none(made.ids, where, blob)

    print(f"console and search {time.monotonic() - t0:.1f} s")
    _checkpoint(stack.ha)
    files = list(_files(stack.base))
    names = {p.name for p in files}
    assert {"service.log", "console.log", "ha1.log", "ha2.log", "ha3.log"} <= names
    assert any(n.endswith(".xlog") for n in names)
    assert any(n.endswith(".snap") for n in names)
    for path in files:
        _assert_none(made.ids, str(path.relative_to(stack.base)), path.read_bytes())
    print(f"files {time.monotonic() - t0:.1f} s, {sum(p.stat().st_size for p in files)} bytes")
    log = stack.service_log.read_text()
    assert '"event": "request_done"' in log  # DEBUG: one line per request, and none names a session
    assert "session_key_checked" in log


SNAPSHOT_SESSIONS_LUA = """
local xlog = require('xlog')
local json = require('json')
local space_id
for _, row in xlog.pairs(arg[1]) do
    local b = row.BODY
    if b ~= nil and b.space_id == 280 and b.tuple[3] == 'sessions' then
        space_id = b.tuple[1]
    end
end
for _, row in xlog.pairs(arg[1]) do
    local b = row.BODY
    if b ~= nil and b.space_id == space_id then
        print(json.encode({id = b.tuple[1], client_id = b.tuple[2]}))
    end
end
os.exit(0)
"""


def test_a_stolen_snapshot_of_a_follower_holds_no_key_that_works_as_a_session_id(stack: Stack) -> None:
    """A follower's snapshot read with Tarantool's own xlog reader: every session's key is its stored id, and
    sent as a session id it is NOT_FOUND; the clients' raw ids, nowhere in the file, still work."""
    leader = stack.ha.leader()
    follower = next(n for n in stack.ha.nodes if n != leader)
    made: dict[str, uuid.UUID] = {}
    with stack.client() as c:
        for i in range(200):
            created = c.session_create(f"stolen-{i % 20}", data={"card": f"4111-{i}"}, ttl_s=600)
            assert created.session_id is not None
            made[sessionkeys.handle(sessionkeys.derive(KEY, created.session_id.bytes))] = created.session_id
    node = stack.ha.nodes[follower]
    before = set(node.data_dir.glob("*.snap"))
    eventually(lambda: _replicated(stack.ha, follower) == len(made), what="the follower has every session")
    node.send_signal(signal.SIGUSR1)
    snap = wait_for(lambda: max(set(node.data_dir.glob("*.snap")) - before, default=None), what="a new snapshot")
    script = stack.base / "sessions_of_snapshot.lua"
    script.write_text(SNAPSHOT_SESSIONS_LUA)
    rows = eventually_rows(shutil.which("tarantool") or "tarantool", script, snap, expected=len(made))
    stored = {r["id"] for r in rows if r["client_id"].startswith("stolen-")}
    assert len(stored) == len(made)
    raws = {str(u) for u in made.values()}
    assert not stored & raws  # the snapshot keys sessions by stored id, never by the id a client holds
    assert {sessionkeys.handle(uuid.UUID(s).bytes) for s in stored} == set(made)
    ids = RawIds({u.bytes for u in made.values()})
    _assert_none(ids, "the follower's snapshot", snap.read_bytes())
    with stack.client() as c:
        for key in stored:  # the thief sends each key as a session id, read, write and rotate
            assert c.session_get(uuid.UUID(key)).status is Status.NOT_FOUND, key
        for key in list(stored)[:20]:
            assert c.session_update(uuid.UUID(key), {"stolen": True}).status is Status.NOT_FOUND
            assert c.session_rotate(uuid.UUID(key)).status is Status.NOT_FOUND
            assert c.cache_put("k", 1, session_id=uuid.UUID(key)).status is Status.NOT_FOUND
        for raw in made.values():  # the customers' own ids still work, untouched
            got = c.session_get(raw)
            assert got.ok
            assert got.body["rev"] == 1


def _replicated(ha: HACluster, node: str) -> int:
    """How many of the test's sessions an instance lists."""
    answers = [ha.call(node, "session_list", f"stolen-{k}") for k in range(20)]
    return sum(len(a["sessions"]) for a in answers if a is not None and a.get("status") == "OK")


def eventually_rows(tarantool: str, script: Path, snap: Path, expected: int) -> list[dict[str, Any]]:
    """The session rows of a snapshot file (a file being written is read again once it is whole)."""

    def read() -> list[dict[str, Any]] | None:
        argv = [tarantool, str(script), str(snap)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            return None
        rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        return rows if sum(r["client_id"].startswith("stolen-") for r in rows) >= expected else None

    return wait_for(read, 30, what=f"{expected} session rows in {snap}")
