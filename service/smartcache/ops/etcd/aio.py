"""The asyncio face of the etcd client, on aiohttp: for code on an event loop (the service's discovery).

A blocking read there would stall every request on the loop for as long as an etcd member
takes not to answer; aiohttp is already the service's HTTP client. The calls, the answers
and the walk over the endpoints are the core's (:mod:`.core`), as the blocking face's are.
One :class:`AsyncEtcd` per event loop: its aiohttp session belongs to the loop it was made
on (made on first use, inside the running loop).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aiohttp

from smartcache.ops.etcd import core
from smartcache.ops.etcd.core import ASK_TIMEOUT_S, Call, KeyValue


class AsyncEtcd:
    """The cluster's endpoints, asked in turn: each call goes to the first that answers, the one that answered
    last first."""

    def __init__(self, endpoints: Sequence[str], timeout_s: float = ASK_TIMEOUT_S) -> None:
        self.rotation = core.Rotation(endpoints)
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._http: aiohttp.ClientSession | None = None

    async def ask(self, call: Call) -> dict[str, Any]:
        """The answer of the first endpoint that answers call; raises EtcdUnavailable when none does."""
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=self._timeout)
        attempt = self.rotation.attempt()
        for endpoint in attempt:
            method = "GET" if call.body is None else "POST"
            try:
                async with self._http.request(method, endpoint + call.path, json=call.body) as r:
                    code = r.status
                    doc: Any = await r.json(content_type=None) if code == 200 else None
            except (TimeoutError, aiohttp.ClientError, ValueError) as e:
                attempt.failed(endpoint, e)
                continue
            if attempt.answered(endpoint, code, doc):
                answer: dict[str, Any] = doc
                return answer
        raise attempt.unavailable()

    async def range(self, key: str, *, prefix: bool = False) -> list[KeyValue]:
        """The key (or every key under it); [] when absent."""
        return core.kvs(await self.ask(core.range_call(key, prefix=prefix)))

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
