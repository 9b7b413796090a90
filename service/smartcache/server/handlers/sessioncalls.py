"""Calls on the header's session: its binding as storage is given it, and the lazy rekey of sessions stored by
their raw id (the migration).

A session created with a ``binding`` answers only requests that carry the same one; storage keeps and is
given its SHA-256 only (:func:`binding`), so the value (a device id, an app instance's fingerprint)
never reaches storage.

Sessions written before the stored ids (PROTOCOL.md revision 11) are keyed in storage by the raw
id itself. With ``SMARTCACHE_SESSION_REKEY=lazy`` a call on a session answered ``NOT_FOUND`` asks
storage once more, with the raw id: ``sc.session_rekey(raw, stored)`` renames a session still
stored under the raw id (its row, cache entries and rotations' rows, in one transaction), and the
call is sent again under the stored id, so the client sees its session as before. The raw id
reaches storage only there, and only while the migration lasts (docs/operations.md);
``smartcache-cli cluster sessions-rekey`` renames the sessions nobody asks for. Off (the default),
a ``NOT_FOUND`` is the answer.
"""

from __future__ import annotations

from typing import Any

from smartcache.server.handlers import Context, Request
from smartcache.server.sessionids import uuid_text
from smartcache.wire import NO_SESSION
from smartcache.wire.sessionkeys import binding_digest


def binding(req: Request) -> str | None:
    """The request's binding as storage is given it: its SHA-256 (hex), never the value; None when absent."""
    value: str | None = req.body.get("binding")
    return None if value is None else binding_digest(value)


async def session_call(req: Request, ctx: Context, procedure: str, args: list[Any]) -> dict[str, Any]:
    """Call ``procedure`` on the header's session (``args`` name its stored id); with the lazy rekey, a
    NOT_FOUND renames a raw-keyed session and asks again."""
    result = await ctx.storage.call(procedure, args, job=req.job, idempotency_key=req.idempotency_key)
    if result.get("status") == "NOT_FOUND" and ctx.sessions.lazy_rekey and await rekey(req, ctx):
        result = await ctx.storage.call(procedure, args, job=req.job, idempotency_key=req.idempotency_key)
    return result


async def rekey(req: Request, ctx: Context) -> bool:
    """Rename the header's session if storage still keys it by the raw id; whether it is under its stored id
    now (renamed here, or by a call that raced this one)."""
    raw = req.header.session_id
    if raw == NO_SESSION or not req.session:
        return False
    result = await ctx.storage.call("session_rekey", [uuid_text(raw), req.session], job=req.job)
    status = result.get("status")
    if status == "OK":
        ctx.metrics.sessions_rekeyed.inc()
        return True
    return status == "ALREADY_EXISTS"
