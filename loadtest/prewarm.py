"""The original's claim, reproduced: products ready before login.

Each simulated login: the app starts (APP_START with its device id), the
user types a password (``think_ms``), logs in, and the front server reads the
client's products of every data type, ``reads_per_type`` times over the
session (main screen, account screen, payments...). Three ways:

* ``no smartcache``: the front server asks the core backend every time;
* ``cold``: through smartcache, no prewarm (the first read of each type fetches);
* ``prewarm``: through smartcache, the device is bound from an earlier login, so
  APP_START fetched everything while the user was typing.

Reported: front-server time to get products after login (p50, p99 of the
first read of each type) and backend calls per login.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from loadtest.backend import Backend
from loadtest.report import summarize
from loadtest.stack import stack
from smartcache.client import AsyncClient

TYPES = (1, 2, 3, 4)
THINK_MS = 1000
CONCURRENT_LOGINS = 20


async def _login(
    client: AsyncClient | None,
    http: httpx.AsyncClient,
    backend_url: str,
    *,
    n: int,
    mode: str,
    reads: int,
    first: list[float],
) -> None:
    device, client_id = f"{mode}-dev-{n}", f"{mode}-client-{n}"
    if mode == "prewarm":
        assert client is not None
        await client.device_bind(device, client_id)  # an earlier login bound this device
        await client.app_start(device)
    await asyncio.sleep(THINK_MS / 1000)  # the user types the password
    for r in range(reads):
        for t in TYPES:
            started = time.perf_counter()
            if client is None:
                resp = await http.get(f"{backend_url}/clients/{client_id}/products/{t}")
                resp.raise_for_status()
            else:
                reply = await client.products_get(client_id, t)
                assert reply.ok, reply.body
            if r == 0:
                first.append(time.perf_counter() - started)


async def _run_mode(endpoint: str, backend: Backend, mode: str, logins: int, reads: int) -> dict[str, Any]:
    backend.state.calls.clear()
    client = None if mode == "no smartcache" else AsyncClient(endpoint, timeout_s=30)
    first: list[float] = []
    sem = asyncio.Semaphore(CONCURRENT_LOGINS)
    async with httpx.AsyncClient(timeout=30) as http:

        async def one(n: int) -> None:
            async with sem:
                await _login(client, http, backend.url, n=n, mode=mode, reads=reads, first=first)

        await asyncio.gather(*(one(n) for n in range(logins)))
    if client is not None:
        client.close()
    calls = backend.state.stats()["calls"]
    return {
        "mode": mode,
        "logins": logins,
        "products_after_login": summarize(first),
        "backend_calls_per_login": round(calls / logins, 2),
    }


def run(*, logins: int = 200, latency_ms: float = 200.0, reads_per_type: int = 4) -> dict[str, Any]:
    backend = Backend(latency_ms=latency_ms).start()
    try:
        with stack({"SMARTCACHE_BACKEND_URL": backend.url}) as (_, sut):
            rows = [
                asyncio.run(_run_mode(sut.endpoint, backend, mode, logins, reads_per_type))
                for mode in ("no smartcache", "cold", "prewarm")
            ]
    finally:
        backend.stop()
    print(
        f"backend latency {latency_ms:.0f} ms; {logins} logins; {len(TYPES)} data types; "
        f"{reads_per_type} reads per type per session"
    )
    print(f"{'mode':<15} {'p50 ms':>8} {'p99 ms':>8} {'backend calls/login':>20}")
    for r in rows:
        lat = r["products_after_login"]
        print(f"{r['mode']:<15} {lat['p50_ms']:>8.2f} {lat['p99_ms']:>8.2f} {r['backend_calls_per_login']:>20}")
    base, pre = rows[0], rows[2]
    speedup = base["products_after_login"]["p50_ms"] / pre["products_after_login"]["p50_ms"]
    fewer = base["backend_calls_per_login"] / pre["backend_calls_per_login"]
    print(
        f"prewarm vs no smartcache: {speedup:.0f}x faster (p50), {fewer:.1f}x fewer backend calls (original: 10x, 4x)"
    )
    return {"latency_ms": latency_ms, "rows": rows, "speedup_p50": round(speedup, 1), "fewer_calls": round(fewer, 2)}
