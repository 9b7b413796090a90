"""One poller per part of the page: a part that does not answer degrades itself, not the page.

The connectors the CLI uses are blocking (tarantool, urllib for etcd, the
client's DEALER socket), so each ask runs on the console's thread pool
(``loop.run_in_executor``) and is waited for at most ``timeout_s``. An ask that
outlives its wait keeps its thread until the call's own socket timeout ends it;
the part is not asked again before that (one thread per part at most, so a
frozen instance cannot eat the pool). The part keeps its last answer, when it
came, and why the latest ask failed: the page says "service-2: no answer for
12 s" from that.

``Seen`` does the same per instance inside an answer: ``cluster status`` lists
every Tarantool instance and etcd member with ``reachable``; the console notes
when each last answered and adds ``no_answer_for_s`` to those that do not.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import structlog

log = structlog.get_logger("smartcache.console")


class Part:
    """A part of the page, asked every ``every_s`` by ``fetch`` (blocking, run on ``executor``)."""

    def __init__(
        self,
        *,
        name: str,
        fetch: Callable[[], Any],
        every_s: float,
        timeout_s: float,
        executor: Executor,
        on_answer: Callable[[Any], None] | None = None,
    ) -> None:
        self.name = name
        self.fetch = fetch
        self.every_s = every_s
        self.timeout_s = timeout_s
        self.executor = executor
        self.on_answer = on_answer
        self.data: Any = None
        self.error: str | None = "not asked yet"
        self.answered_at: float | None = None  # monotonic
        self.started_at = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"part-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def ask(self) -> None:
        """One ask: the answer is kept, or the reason it did not come."""
        future = asyncio.get_running_loop().run_in_executor(self.executor, self.fetch)
        try:
            data = await asyncio.wait_for(asyncio.shield(future), self.timeout_s)
        except TimeoutError:
            self.error = f"no answer within {self.timeout_s:g} s"
            with contextlib.suppress(Exception):
                await future  # the call's own socket timeout ends it; not asked again before
            return
        except Exception as e:  # whatever the connector raised: shown, and asked again next round
            self.error = f"{type(e).__name__}: {e}"[:300]
            return
        self.data, self.error = data, None
        self.answered_at = time.monotonic()
        if self.on_answer is not None:
            self.on_answer(data)

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.ask()
            except Exception:  # a bug in on_answer: logged, the part goes on
                log.exception("console_part_failed", part=self.name)
            await asyncio.sleep(max(0.05, self.every_s - (time.monotonic() - started)))

    def view(self) -> dict[str, Any]:
        """What the page shows of this part: its data (the last answer), and when it stopped answering."""
        now = time.monotonic()
        out: dict[str, Any] = {"name": self.name, "ok": self.error is None, "data": self.data}
        if self.error is not None:
            since = self.answered_at if self.answered_at is not None else self.started_at
            out["error"] = self.error
            out["no_answer_for_s"] = round(now - since, 1)
            out["ever_answered"] = self.answered_at is not None
        if self.answered_at is not None:
            out["age_s"] = round(now - self.answered_at, 1)
        return out


class Seen:
    """When each instance (by address or endpoint) last answered, from the answers of ``cluster status``."""

    def __init__(self) -> None:
        self.started_at = time.monotonic()
        self.last: dict[str, float] = {}
        self.names: dict[str, str] = {}  # the name an instance answered with, kept for when it does not

    def note(self, tree: Any) -> Any:
        """Walk an answer: every dict with ``reachable`` is noted, and given ``no_answer_for_s`` when false."""
        now = time.monotonic()
        if isinstance(tree, list):
            for item in tree:
                self.note(item)
        elif isinstance(tree, dict):
            key = tree.get("address") or tree.get("endpoint")
            if "reachable" in tree and isinstance(key, str):
                if tree["reachable"]:
                    self.last[key] = now
                    if isinstance(tree.get("name"), str):
                        self.names[key] = tree["name"]
                else:
                    if key in self.names:
                        tree.setdefault("name", self.names[key])
                    tree["no_answer_for_s"] = round(now - self.last.get(key, self.started_at), 1)
            for value in tree.values():
                if isinstance(value, dict | list):
                    self.note(value)
        return tree
