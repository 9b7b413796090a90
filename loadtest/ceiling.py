"""The two ceilings `make bench` measures the service against, each a process of its own.

``sketch``: the service's path with nothing but the path -- a zmq.asyncio ROUTER, one asynctnt
connection, the same stored procedures with the same arguments (``sc.session_create`` and
``sc.session_get``, no meta, the session named by the stored id derived from its raw id as the service
derives it: loadtest/storedids.py), a task per message and the reply sent from it. No queue, no
validation, no deadlines, no metrics, no logs; plain asyncio (not the service's coalescing loop).
What the service costs beyond it is the price of its guarantees and of how they are built.

``echo``: the transport alone -- a ROUTER socket handed to ``zmq.proxy`` as both its ends, so
libzmq sends each message back to its sender in C, with no Python per message. The generator
counts these replies as outcome UNKNOWN (a request body has no status); only their rate matters.

    python -m loadtest.ceiling sketch --endpoint tcp://127.0.0.1:5601 --tarantool 127.0.0.1:3301
    python -m loadtest.ceiling echo --endpoint tcp://127.0.0.1:5602
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import asynctnt
import msgpack
import zmq
import zmq.asyncio

from loadtest import storedids
from smartcache.devstack.stack import free_port
from smartcache.server import eventloop
from smartcache.wire import REGISTRY

DEFAULT_USER = DEFAULT_PASSWORD = "smartcache"  # noqa: S105 - the local default, as in lua/README.md
_CREATE = REGISTRY.types["SESSION_CREATE"].id
_GET = REGISTRY.types["SESSION_GET"].id
_STATUS = {name: code for code, name in REGISTRY.status_names.items()}
_SESSION_AT = REGISTRY.header_size - 16  # the header's last field: session_id, 16 bytes
_TYPE_AT = 2  # version, system, then the type (big-endian u16)


class Sketch:
    """The session scenario's path and nothing else. drained: a plain socket read until empty at each readiness of
    its FD (as the service reads) instead of zmq.asyncio's one future per message."""

    def __init__(self, conn: asynctnt.Connection, sock: zmq.asyncio.Socket, *, drained: bool) -> None:
        self.conn = conn
        self.sock = sock
        self.plain = zmq.Socket.shadow(sock.underlying) if drained else None
        self.running: set[asyncio.Task[None]] = set()
        self.loop = asyncio.get_running_loop()

    async def one(self, identity: bytes, header: bytes, body: bytes) -> None:
        type_id = int.from_bytes(header[_TYPE_AT : _TYPE_AT + 2], "big")
        if type_id == _CREATE:
            b = msgpack.unpackb(body)
            raw, stored = storedids.new()  # the service makes the raw id and gives storage its stored id
            resp = await self.conn.call("sc.session_create", [None, stored, b["client_id"], None, None, b.get("data")])
            result: dict[str, Any] = resp.body[0]
            if result["status"] == "OK":
                header = header[:_SESSION_AT] + raw  # the raw id travels in the reply's header only
        elif type_id == _GET:
            stored = storedids.stored_text(header[_SESSION_AT:])
            result = (await self.conn.call("sc.session_get", [None, stored])).body[0]
        else:
            result = {"status": "BAD_REQUEST"}
        result["status"] = _STATUS[result["status"]]
        if self.plain is None:
            await self.sock.send_multipart([identity, header, msgpack.packb(result)])
        else:
            self.plain.send_multipart([identity, header, msgpack.packb(result)], zmq.NOBLOCK)
            self.loop.call_soon(self.readable)  # a send can take the FD's edge: look again (it is edge-triggered)

    def start(self, frames: list[bytes]) -> None:
        task = self.loop.create_task(self.one(*frames))
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    def readable(self) -> None:
        assert self.plain is not None
        while self.plain.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self.start(self.plain.recv_multipart(zmq.NOBLOCK))

    async def serve(self, stop: asyncio.Event) -> None:
        if self.plain is not None:
            fd = self.plain.getsockopt(zmq.FD)
            self.loop.add_reader(fd, self.readable)
            self.readable()
            await stop.wait()
            self.loop.remove_reader(fd)
            return
        stopping = asyncio.ensure_future(stop.wait())
        while not stop.is_set():
            receiving = asyncio.ensure_future(self.sock.recv_multipart())
            await asyncio.wait({receiving, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not receiving.done():
                receiving.cancel()
                return
            self.start(receiving.result())


async def sketch(endpoint: str, address: str, user: str, password: str, *, drained: bool = False) -> None:
    """Serve the session scenario until SIGTERM or SIGINT."""
    host, _, port = address.rpartition(":")
    conn = asynctnt.Connection(host=host, port=int(port), username=user, password=password)
    await conn.connect()
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.bind(endpoint)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    await Sketch(conn, sock, drained=drained).serve(stop)
    sock.close()
    await conn.disconnect()
    ctx.term()


def echo(endpoint: str) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.bind(endpoint)
    print("ready", flush=True)
    try:
        zmq.proxy(sock, sock)  # runs until the process is stopped (SIGTERM: the default action)
    finally:
        sock.close()
        ctx.term()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.ceiling", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sketch", help="zmq.asyncio ROUTER + one asynctnt connection, the same procedures")
    s.add_argument("--endpoint", required=True)
    s.add_argument("--tarantool", required=True, help="host:port")
    s.add_argument("--user", default=DEFAULT_USER)
    s.add_argument("--password", default=DEFAULT_PASSWORD)
    s.add_argument(
        "--drained",
        action="store_true",
        help="a plain socket read until empty at each readiness, on the service's loop (writes of a turn together)",
    )
    e = sub.add_parser("echo", help="a ROUTER echoing every message through zmq.proxy, in C")
    e.add_argument("--endpoint", required=True)
    a = p.parse_args(argv)
    if a.cmd == "sketch":
        if a.drained:
            eventloop.run(sketch(a.endpoint, a.tarantool, a.user, a.password, drained=True))
        else:
            asyncio.run(sketch(a.endpoint, a.tarantool, a.user, a.password))
    else:
        echo(a.endpoint)
    return 0


@dataclass
class Running:
    """A ceiling process started by :func:`running`: where to send load, and its PID for /proc."""

    endpoint: str
    pid: int


@contextlib.contextmanager
def running(kind: str, tarantool: str = "", *, drained: bool = False) -> Iterator[Running]:
    """``python -m loadtest.ceiling <kind>`` on a free 127.0.0.1 port until the block ends; stopped by its PID
    (SIGTERM, then SIGKILL after 5 s)."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    args = [sys.executable, "-m", "loadtest.ceiling", kind, "--endpoint", endpoint]
    if kind == "sketch":
        args += ["--tarantool", tarantool, *(["--drained"] if drained else [])]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":  # it prints "ready" once its socket is bound
            raise RuntimeError(f"the {kind} ceiling did not start (exit code {proc.poll()})")
        yield Running(endpoint, proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


if __name__ == "__main__":
    sys.exit(main())
