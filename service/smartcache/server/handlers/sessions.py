"""Sessions: create (with a per-client limit), read, touch, update (whole or merged), rotate, delete,
log out everywhere, and a client's list (SESSION_*).

A read refreshes a session's deadline in storage once a tenth of its TTL has passed since the
last refresh, keeping it alive; a stale or missing one answers NOT_FOUND, after which the front
server ends the session. Each call is one storage transaction (log out everywhere: one per
batch), so the limits and merges hold under concurrency (lua/smartcache/sessions/ keeps the
rules: create.lua, update.lua, ends.lua...).
"""

from __future__ import annotations

import uuid
from typing import Any

from smartcache.server.handlers import Context, Handler, Request


async def session_create(req: Request, ctx: Context) -> dict[str, Any]:
    """A zero header session id lets storage choose the UUID (so a repeat under an idempotency key
    has the same arguments and gets the same session)."""
    sid = req.session or None
    b = req.body
    args = [sid, b["client_id"], b.get("version"), b.get("ttl_s"), b.get("data")]
    args += [b.get("max_sessions"), b.get("limit_policy"), b.get("device")]
    result = await ctx.storage.call("session_create", args, job=req.job, idempotency_key=req.idempotency_key)
    return _answer_with_session(req, result)


def _answer_with_session(req: Request, result: dict[str, Any]) -> dict[str, Any]:
    """A reply whose header carries the session storage made (create, rotate), never its body."""
    made = result.pop("session_id", None)
    if made is not None:
        req.reply_session = bytes.fromhex(made.replace("-", ""))  # UUID text -> 16 bytes, without uuid.UUID
    return result


async def session_get(req: Request, ctx: Context) -> dict[str, Any]:
    return await ctx.storage.call("session_get", [req.session], job=req.job)


async def session_touch(req: Request, ctx: Context) -> dict[str, Any]:
    return await ctx.storage.call("session_touch", [req.session], job=req.job, idempotency_key=req.idempotency_key)


async def session_update(req: Request, ctx: Context) -> dict[str, Any]:
    b = req.body
    return await ctx.storage.call(
        "session_update",
        [req.session, b.get("data"), b.get("expected_rev"), b.get("version"), b.get("set"), b.get("unset")],
        job=req.job,
        idempotency_key=req.idempotency_key,
    )


async def session_rotate(req: Request, ctx: Context) -> dict[str, Any]:
    result = await ctx.storage.call("session_rotate", [req.session], job=req.job, idempotency_key=req.idempotency_key)
    return _answer_with_session(req, result)


async def session_delete_client(req: Request, ctx: Context) -> dict[str, Any]:
    """Log out everywhere; with except_current, all but the header's session."""
    b = req.body
    keep = req.session if b.get("except_current") and req.session else None
    return await ctx.storage.call(
        "session_delete_client", [b["client_id"], keep], job=req.job, idempotency_key=req.idempotency_key
    )


async def session_delete(req: Request, ctx: Context) -> dict[str, Any]:
    return await ctx.storage.call("session_delete", [req.session], job=req.job, idempotency_key=req.idempotency_key)


async def session_list(req: Request, ctx: Context) -> dict[str, Any]:
    result = await ctx.storage.call("session_list", [req.body["client_id"]], job=req.job)
    for s in result.get("sessions", ()):
        s["session_id"] = uuid.UUID(s["session_id"]).bytes  # wire form: 16 raw bytes
    return result


HANDLERS: dict[str, Handler] = {
    "SESSION_CREATE": session_create,
    "SESSION_GET": session_get,
    "SESSION_TOUCH": session_touch,
    "SESSION_UPDATE": session_update,
    "SESSION_DELETE": session_delete,
    "SESSION_LIST": session_list,
    "SESSION_ROTATE": session_rotate,
    "SESSION_DELETE_CLIENT": session_delete_client,
}
