"""The console's HTTP side: a JSON API, the actions behind the operator token, one static page.

Reads (open: the console listens on 127.0.0.1 by default):
``/api/status`` (the storage cluster as ``cluster status`` sees it, each instance
that stopped answering with ``no_answer_for_s``, etcd's members, who leads),
``/api/services`` (each service's INFO), ``/api/rates``, ``/api/sessions``
(``?client_id=`` or ``?session_id=``; data masked, ``&reveal=1`` needs the
token), ``/api/events``, ``/api/leader-changes``.

Actions (``ACTION_ROUTES``, POST, JSON): ``/api/actions/switchover``
``{"candidate"?, "timeout_ms"?}`` and ``/api/actions/rejoin`` ``{"instance",
"force"?}``, the CLI's ``cluster switchover`` and ``cluster rejoin``. Each needs
``Authorization: Bearer <token>``: none is 401, a wrong one 403 (compared in
constant time), and with no token configured every one is 403 (read-only).
A header a browser never adds by itself, so no other page can make the
operator's browser act (no cookie, no CSRF).

No access log: a query string may hold a session id. What is logged is the
action, who it was asked of and its status, never a token or session data.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from smartcache.client import Client
from smartcache.console import lookups
from smartcache.console.parts import Part, Seen
from smartcache.console.rates import Scraper
from smartcache.console.settings import Service, Settings
from smartcache.ops import cluster

log = structlog.get_logger("smartcache.console")

STATIC = Path(__file__).parent / "static"
ACTION_ROUTES = ("/api/actions/switchover", "/api/actions/rejoin")
#: a switchover's answer comes once the candidate took over or its timeout passed; beyond that, this margin
ACTION_MARGIN_S = 15.0
LEADER_CHANGES_KEPT = 50
#: what the page shows of a service's INFO (its settings stay out: the CLI's info shows them)
INFO_KEYS = ("version", "uptime_s", "queue", "workers", "storage")
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

STATE: web.AppKey[Console] = web.AppKey("console")


def _info(service: Service, timeout_s: float) -> dict[str, Any]:
    with Client(service.endpoint, timeout_s=timeout_s) as c:
        reply = c.info()
    if not reply.ok:
        raise RuntimeError(f"INFO answered {reply.status}")
    return {k: reply.body.get(k) for k in INFO_KEYS}


def _leaders(status: dict[str, Any]) -> dict[str | None, tuple[str | None, Any]]:
    """Who leads (and the term), per shard (None: the one replica set)."""
    if "shards" in status:
        return {name: (s.get("leader"), s.get("term")) for name, s in status["shards"].items()}
    return {None: (status.get("leader"), status.get("term"))}


class Console:
    """The parts, the scrapers and the event tail of one console, started and stopped with the app."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        s = settings
        self.pool = ThreadPoolExecutor(max_workers=4 + 2 * len(s.services), thread_name_prefix="console")
        self.actions = ThreadPoolExecutor(max_workers=2, thread_name_prefix="console-action")
        self.seen = Seen()
        self.leader_changes: collections.deque[dict[str, Any]] = collections.deque(maxlen=LEADER_CHANGES_KEPT)
        self._leaders: dict[str | None, tuple[str | None, Any]] = {}
        # cluster status asks every instance and etcd member in turn, each bounded by the access timeout
        storage_wait_s = s.answer_timeout_s * (len(s.access.addresses) + len(s.access.etcd) + 2)
        self.storage = Part(
            name="storage",
            fetch=lambda: cluster.status(s.access),
            every_s=s.storage_poll_s,
            timeout_s=storage_wait_s,
            executor=self.pool,
            on_answer=self._on_status,
        )
        self.services = [
            Part(
                name=svc.name,
                fetch=lambda svc=svc: _info(svc, s.answer_timeout_s),  # type: ignore[misc]
                every_s=s.poll_s,
                timeout_s=s.answer_timeout_s + 1,
                executor=self.pool,
            )
            for svc in s.services
        ]
        self.scrapers = [
            Scraper(svc, every_s=s.scrape_s, window_s=s.window_s, timeout_s=s.answer_timeout_s, token=s.metrics_token)
            for svc in s.services
        ]
        self.events = lookups.EventTail(
            endpoint=",".join(svc.endpoint for svc in s.services),
            publishers=s.publishers,
            timeout_s=s.answer_timeout_s,
        )
        self._http: aiohttp.ClientSession | None = None

    def _on_status(self, status: dict[str, Any]) -> None:
        self.seen.note(status)
        now = _leaders(status)
        for shard, (leader, term) in now.items():
            before = self._leaders.get(shard)
            if before is None or before[0] != leader:
                self.leader_changes.append(
                    {"at": time.time(), "shard": shard, "from": before[0] if before else None, "to": leader,
                     "term": term, "first_seen": before is None}
                )  # fmt: skip
                log.info("console_leader_seen", shard=shard, leader=leader, term=term)
        self._leaders = now

    async def start(self) -> None:
        self._http = aiohttp.ClientSession()
        for part in [self.storage, *self.services]:
            part.start()
        for scraper in self.scrapers:
            scraper.start(self._http)
        self.events.start()

    async def stop(self) -> None:
        self.events.stop()
        for part in [self.storage, *self.services]:
            await part.stop()
        for scraper in self.scrapers:
            await scraper.stop()
        if self._http is not None:
            await self._http.close()
        self.events.join(5)
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.actions.shutdown(wait=False, cancel_futures=True)

    def authorized(self, request: web.Request) -> web.Response | None:
        """None when the request carries the operator token; else the 401 or 403 to answer."""
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return _json(
                {"error": "UNAUTHORIZED", "message": "this needs the operator token: Authorization: Bearer <token>"},
                401,
                {"WWW-Authenticate": "Bearer"},
            )
        expected = self.settings.token
        if not expected or not hmac.compare_digest(given.strip().encode(), expected.encode()):
            message = "wrong token" if expected else "the console has no operator token: it is read-only"
            return _json({"error": "FORBIDDEN", "message": message}, 403)
        return None


def _json(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(doc, status=status, headers={"Cache-Control": "no-store", **(headers or {})})


def _console(request: web.Request) -> Console:
    return request.app[STATE]


async def status(request: web.Request) -> web.Response:
    c = _console(request)
    view = c.storage.view()
    data = view.get("data") or {}
    leaders = {str(k) if k else "": v[0] for k, v in _leaders(data).items()} if data else {}
    return _json(
        {
            **view,
            "leader": data.get("leader"),
            "term": data.get("term"),
            "leaders": leaders,
            "healthy": bool(view["ok"] and data.get("healthy")),
            "read_only": not c.settings.token,
            "services": [{"name": p.name, "ok": p.error is None} for p in c.services],
            "at": time.time(),
        }
    )


async def services(request: web.Request) -> web.Response:
    c = _console(request)
    out = []
    for svc, part, scraper in zip(c.settings.services, c.services, c.scrapers, strict=True):
        ring = scraper.ring
        out.append(
            {
                **part.view(),
                "endpoint": svc.endpoint,
                "metrics_url": svc.metrics_url,
                "metrics_ok": scraper.error is None,
                "metrics_error": scraper.error,
                "rejections": ring[-1].rejections if ring else {},
                "bulkhead_limits": ring[-1].bulkhead_limits if ring else {},
            }
        )
    return _json({"services": out})


async def rates(request: web.Request) -> web.Response:
    c = _console(request)
    return _json({"window_s": c.settings.window_s, "services": [s.view() for s in c.scrapers]})


async def events(request: web.Request) -> web.Response:
    return _json(_console(request).events.view())


async def leader_changes(request: web.Request) -> web.Response:
    return _json({"changes": list(_console(request).leader_changes)[::-1]})


async def sessions(request: web.Request) -> web.Response:
    c = _console(request)
    client_id = request.query.get("client_id", "").strip()
    session_id = request.query.get("session_id", "").strip()
    if bool(client_id) == bool(session_id):
        return _json({"error": "BAD_REQUEST", "message": "give client_id or session_id (one of them)"}, 400)
    reveal = request.query.get("reveal") == "1"
    if reveal and (refused := c.authorized(request)) is not None:
        return refused
    if not c.settings.services:
        return _json({"error": "NO_SERVICE", "message": "no service instance configured (--service)"}, 503)
    endpoint = ",".join(s.endpoint for s in c.settings.services)
    loop = asyncio.get_running_loop()

    def ask() -> dict[str, Any]:
        return lookups.sessions(
            endpoint,
            c.settings.answer_timeout_s,
            client_id=client_id or None,
            session_id=session_id or None,
            reveal=reveal,
        )

    try:
        found = await asyncio.wait_for(
            loop.run_in_executor(c.pool, ask), c.settings.answer_timeout_s * (lookups.MAX_LISTED + 2)
        )
    except ValueError:
        return _json({"error": "BAD_REQUEST", "message": "session_id is not a UUID"}, 400)
    except Exception as e:  # the service did not answer: said, without the ids asked for
        return _json({"error": "UNAVAILABLE", "message": f"{type(e).__name__}: {e}"[:300]}, 503)
    log.info("console_session_lookup", by="session_id" if session_id else "client_id", revealed=reveal)
    return _json({**found, "revealed": reveal})


async def _body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        doc = await request.json()
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def action(
    name: str, run: Callable[[Console, dict[str, Any]], tuple[Callable[[], dict[str, Any]], float] | str]
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """An action route: the token first, then the arguments, then the CLI's call on the action pool."""

    async def handler(request: web.Request) -> web.Response:
        c = _console(request)
        if (refused := c.authorized(request)) is not None:
            log.warning("console_action_refused", action=name, status=refused.status)
            return refused
        planned = run(c, await _body(request))
        if isinstance(planned, str):
            return _json({"error": "BAD_REQUEST", "message": planned}, 400)
        call, wait_s = planned
        try:
            result = await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(c.actions, call), wait_s)
        except TimeoutError:
            result = {"status": "NO_ANSWER", "message": f"no answer within {wait_s:g} s: see the status now"}
        except LookupError as e:
            result = {"status": "NOT_FOUND", "message": str(e)}
        log.info("console_action", action=name, status=result.get("status") or result.get("error"))
        return _json(result)

    return handler


def _switchover(c: Console, body: dict[str, Any]) -> tuple[Callable[[], dict[str, Any]], float] | str:
    candidate = body.get("candidate") or None
    timeout_ms = body.get("timeout_ms", 5000)
    if candidate is not None and not isinstance(candidate, str):
        return "candidate: an instance address or uuid"
    if not isinstance(timeout_ms, int) or not 100 <= timeout_ms <= 60_000:
        return "timeout_ms: 100..60000"
    access = c.settings.access
    return (lambda: cluster.switchover(access, candidate, timeout_ms)), timeout_ms / 1000 + ACTION_MARGIN_S


def _rejoin(c: Console, body: dict[str, Any]) -> tuple[Callable[[], dict[str, Any]], float] | str:
    instance, force = body.get("instance"), bool(body.get("force", False))
    if not isinstance(instance, str) or not instance:
        return "instance: the address or uuid of the instance to rebuild"
    access = c.settings.access
    return (lambda: cluster.rejoin(access, instance, force=force)), 30.0 + ACTION_MARGIN_S


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})


@web.middleware
async def security_headers(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    response = await handler(request)
    response.headers.update(SECURITY_HEADERS)
    return response


def make_app(settings: Settings) -> web.Application:
    app = web.Application(middlewares=[security_headers])
    console = Console(settings)
    app[STATE] = console

    async def lifecycle(app: web.Application) -> Any:
        await console.start()
        yield
        await console.stop()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_get("/", index)
    app.router.add_get("/api/status", status)
    app.router.add_get("/api/services", services)
    app.router.add_get("/api/rates", rates)
    app.router.add_get("/api/sessions", sessions)
    app.router.add_get("/api/events", events)
    app.router.add_get("/api/leader-changes", leader_changes)
    app.router.add_post(ACTION_ROUTES[0], action("switchover", _switchover))
    app.router.add_post(ACTION_ROUTES[1], action("rejoin", _rejoin))
    app.router.add_static("/static/", STATIC)
    return app
