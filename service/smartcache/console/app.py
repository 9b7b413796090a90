"""The console's HTTP side: a JSON API, the actions behind the operator token, one static page.

Reads (open: the console listens on 127.0.0.1 by default):
``/api/status`` (the storage cluster as ``cluster status`` sees it, each instance
that stopped answering with ``no_answer_for_s``, etcd's members, who leads),
``/api/services`` (each service's INFO), ``/api/rates``, ``/api/sessions``
(``?q=`` a client id or a session's handle; never a session id: refused with
the reason; data masked), ``/api/events``, ``/api/leader-changes``,
``/api/audit`` (the operator actions storage recorded most recently).

Actions (:mod:`.actions`, POST, JSON): switchover, rejoin, reveal of session
data, log out everywhere. Each needs ``Authorization: Bearer <token>``: none is
401, a wrong one 403 (compared in constant time), and with no token configured
every one is 403 (read-only). A header a browser never adds by itself, so no
other page can make the operator's browser act (no cookie, no CSRF). Each needs
a reason too, and is written to the audit with the token's id before it acts.

No access log: a query string holds a client id. What is logged is the action,
who it was asked of and its status, never a token, a client id or session data.
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
from smartcache.console import actions, sessions
from smartcache.console.audit import AuditTail
from smartcache.console.events import EventTail
from smartcache.console.parts import Part, Seen
from smartcache.console.rates import Scraper
from smartcache.console.settings import Service, Settings
from smartcache.ops import audit, cluster

log = structlog.get_logger("smartcache.console")

STATIC = Path(__file__).parent / "static"
ACTION_ROUTES = tuple(actions.ROUTES)
LEADER_CHANGES_KEPT = 50
#: how often the audit panel asks for new entries
AUDIT_POLL_S = 2.0
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
        self.audit = Part(
            name="audit",
            fetch=AuditTail(s.access, self._shards).fetch,
            every_s=AUDIT_POLL_S,
            timeout_s=storage_wait_s,
            executor=self.pool,
        )
        self.events = EventTail(
            endpoint=",".join(svc.endpoint for svc in s.services),
            publishers=s.publishers,
            timeout_s=s.answer_timeout_s,
        )
        self._http: aiohttp.ClientSession | None = None

    def status_data(self) -> dict[str, Any]:
        """The last cluster status the storage part got ({} before the first)."""
        data = self.storage.data
        return data if isinstance(data, dict) else {}

    def _shards(self) -> tuple[str | None, list[str]]:
        """The sharded cluster's name and its shards, as the last status saw them (None, []: one replica set)."""
        data = self.status_data()
        if "shards" in data:
            return data.get("cluster"), list(data["shards"])
        return None, []

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
        for part in [self.storage, self.audit, *self.services]:
            part.start()
        for scraper in self.scrapers:
            scraper.start(self._http)
        self.events.start()

    async def stop(self) -> None:
        self.events.stop()
        for part in [self.storage, self.audit, *self.services]:
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


async def audit_entries(request: web.Request) -> web.Response:
    view = _console(request).audit.view()
    return _json({**view, "entries": view.pop("data") or []})


async def session_lookup(request: web.Request) -> web.Response:
    """A masked lookup: ``?q=`` a client id or a handle (``client_id=`` and ``handle=`` too); a session id is
    refused with the reason, and so is a reveal asked for here (it is an action: a reason, the audit)."""
    c = _console(request)
    if "session_id" in request.query:
        return _json({"error": "BAD_REQUEST", "message": sessions.REFUSED_ID}, 400)
    if "reveal" in request.query:
        message = "revealing session data is an action: POST /api/actions/reveal with the token and a reason"
        return _json({"error": "BAD_REQUEST", "message": message}, 400)
    typed = request.query.get("q") or request.query.get("handle") or request.query.get("client_id") or ""
    try:
        kind, value = sessions.query_of(typed)
    except sessions.Refused as e:
        return _json({"error": "BAD_REQUEST", "message": str(e)}, 400)
    sets = sessions.replica_sets(c.status_data())
    s = c.settings

    def ask() -> dict[str, Any]:
        return sessions.lookup(sets, kind, value, token=s.http_token, timeout_s=s.answer_timeout_s, reveal=False)

    wait_s = s.answer_timeout_s * (3 * len(sets) + 2)
    try:
        found = await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(c.pool, ask), wait_s)
    except TimeoutError:
        found = {"error": "UNAVAILABLE", "message": f"no answer within {wait_s:g} s"}
    log.info("console_session_lookup", by=kind, found=found.get("count"), error=found.get("error"))
    if "error" in found:
        return _json(found, 503)
    return _json({**found, "by": kind, "revealed": False})


async def _body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        doc = await request.json()
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def action(
    name: str, plan: Callable[[actions.Asked], actions.Planned]
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """An action route: the token first, then the reason and the arguments, then the call on the action pool
    (written to the audit by the call itself: before it acts, and its outcome)."""

    async def handler(request: web.Request) -> web.Response:
        c = _console(request)
        if (refused := c.authorized(request)) is not None:
            log.warning("console_action_refused", action=name, status=refused.status)
            return refused
        body = await _body(request)
        reason = actions.reason_of(body)
        if reason is None:
            return _json({"error": "BAD_REQUEST", "message": actions.NO_REASON}, 400)
        actor = audit.Actor(audit.console_who(c.settings.token), reason)
        planned = plan(actions.Asked(c.settings, c.status_data(), actor, body))
        if isinstance(planned, str):
            return _json({"error": "BAD_REQUEST", "message": planned}, 400)
        call, wait_s = planned
        try:
            result = await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(c.actions, call), wait_s)
        except TimeoutError:
            result = {"status": "NO_ANSWER", "message": f"no answer within {wait_s:g} s: see the status now"}
        except LookupError as e:
            result = {"status": "NOT_FOUND", "message": str(e)}
        log.info("console_action", action=name, status=result.get("status") or result.get("error"),
                 audited="audit" in result)  # fmt: skip
        return _json(result)

    return handler


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
    app.router.add_get("/api/sessions", session_lookup)
    app.router.add_get("/api/events", events)
    app.router.add_get("/api/leader-changes", leader_changes)
    app.router.add_get("/api/audit", audit_entries)
    for route, (name, plan) in actions.ROUTES.items():
        app.router.add_post(route, action(name, plan))
    app.router.add_static("/static/", STATIC)
    return app
