"""Both faces of the etcd client (service/smartcache/ops/etcd) against a gateway on a real socket: the same reads,
the same walk past a member that refuses, the same error when none answers. The gateway is a stand-in (aiohttp on
port 0) answering /v3/kv/range as etcd 3.4 does; the real etcd is test_topology's and test_cluster_cli_etcd's."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from smartcache.ops import etcd
from smartcache.ops.etcd.aio import AsyncEtcd

KEYS = {"/smartcache/bank/topology": b'{"version": 1}', "/smartcache/bank/members/a": b'{"uri": "t1:3301"}'}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def _range(request: web.Request) -> web.Response:
    body = await request.json()
    key = base64.b64decode(body["key"]).decode()
    end = base64.b64decode(body["range_end"]).decode() if "range_end" in body else None
    found = [k for k in sorted(KEYS) if (key <= k < end if end else k == key)]
    kvs = [{"key": _b64(k.encode()), "value": _b64(KEYS[k]), "mod_revision": "5"} for k in found]
    return web.json_response({"header": {"revision": "5"}, **({"kvs": kvs, "count": str(len(kvs))} if kvs else {})})


def _refused() -> str:
    """An endpoint nothing listens on (a port just closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    """The stand-in gateway's URL, served by a loop in a thread of its own."""
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v3/kv/range", _range)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.run_until_complete(runner.cleanup())
        loop.close()


def _async_read(endpoints: list[str], key: str, *, prefix: bool = False) -> tuple[list[Any], list[str]]:
    """The AsyncEtcd's answer to two reads, and the endpoint order its rotation holds after them."""

    async def run() -> tuple[list[Any], list[str]]:
        client = AsyncEtcd(endpoints, timeout_s=1.0)
        try:
            first = await client.range(key, prefix=prefix)
            again = await client.range(key, prefix=prefix)
            assert first == again
            return first, list(client.rotation.attempt())
        finally:
            await client.close()

    return asyncio.run(run())


def test_both_faces_read_a_key_and_a_prefix_past_a_member_that_refuses(gateway: str) -> None:
    endpoints = [_refused(), gateway]
    blocking = etcd.Etcd(endpoints, timeout_s=1.0)
    for prefix, key in ((False, "/smartcache/bank/topology"), (True, "/smartcache/bank/members/")):
        found, order = _async_read(endpoints, key, prefix=prefix)
        assert found == blocking.range(key, prefix=prefix)
        assert [kv.key for kv in found] == [k for k in KEYS if k.startswith(key)]
        assert order[0] == gateway, "the member that answered is asked first next time"
    assert json.loads(etcd.read(endpoints, "/smartcache/bank/topology", 1.0)[0][1]) == {"version": 1}
    assert etcd.read_revision(endpoints, "/smartcache/bank/absent", 1.0) == (None, 0)


def test_when_no_member_answers_both_faces_say_what_each_did() -> None:
    endpoints = [_refused(), _refused()]
    with pytest.raises(etcd.EtcdUnavailable, match="Connection refused") as blocking:
        etcd.Etcd(endpoints, timeout_s=1.0).range("/k")
    with pytest.raises(etcd.EtcdUnavailable) as in_loop:
        _async_read(endpoints, "/k")
    for e in (blocking.value, in_loop.value):
        assert [part.split(": ")[0] for part in str(e).split("; ")] == endpoints
