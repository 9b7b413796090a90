"""Sessions: create (with a per-client limit), read, touch, update (whole or merged), rotate, delete,
log out everywhere, and a client's list (SESSION_*).

A read refreshes a session's deadline in storage once a tenth of its TTL has passed since the
last refresh, keeping it alive, never past its absolute deadline; a stale or missing one answers
NOT_FOUND, after which the front server ends the session. Each call is one storage transaction
(log out everywhere: one per batch), so the limits and merges hold under concurrency
(lua/smartcache/sessions/ keeps the rules: create.lua, rotations.lua, access.lua...).

A session id is a credential (issue 37): storage gets the stored id execute derived
(``req.session``), never the header's raw id, and the service makes the raw ids of new
sessions and rotations itself, answering them in the reply's header only; a session's
``binding`` reaches storage as its SHA-256. Everything else names a session by its
handle (the replies' ``handle``, SESSION_LIST, SESSION_DELETE by handle).
"""

from __future__ import annotations

from typing import Any

from smartcache.server.handlers import Context, Handler, Request
from smartcache.server.handlers.sessioncalls import binding, rekey, session_call
from smartcache.wire import NO_SESSION, buckets
from smartcache.wire.sessionkeys import NotAHandle, stored_of


def _bucket_of_client(ctx: Context, client_id: str) -> int | None:
    """A new session's bucket: its client's on a sharded cluster, else None (a version 4 id)."""
    count = ctx.storage.bucket_count
    return None if count is None else buckets.bucket_of(client_id, count)


async def session_create(req: Request, ctx: Context) -> dict[str, Any]:
    """A zero header session id: the service makes the raw id (from the idempotency key when there is one, so
    a repeat passes storage the same stored id and is answered the same raw id)."""
    b = req.body
    raw = req.header.session_id
    if raw == NO_SESSION:
        raw = ctx.sessions.new_raw(
            _bucket_of_client(ctx, b["client_id"]), "SESSION_CREATE", b["client_id"], req.idempotency_key
        )
    stored, handle = ctx.sessions.made(raw)
    args = [stored, b["client_id"], b.get("version"), b.get("ttl_s"), b.get("data")]
    args += [b.get("max_sessions"), b.get("limit_policy"), b.get("device"), b.get("max_lifetime_s"), binding(req)]
    result = await ctx.storage.call("session_create", args, job=req.job, idempotency_key=req.idempotency_key)
    return _answer_with_session(req, result, raw, handle)


def _answer_with_session(req: Request, result: dict[str, Any], raw: bytes, handle: str) -> dict[str, Any]:
    """An OK reply's header carries the raw id the service made (create, rotate), its body the handle; storage's
    own ``session_id`` (a stored id) is never answered."""
    result.pop("session_id", None)
    if result["status"] == "OK":
        req.reply_session = raw
        result["handle"] = handle
    return result


async def session_get(req: Request, ctx: Context) -> dict[str, Any]:
    return await session_call(req, ctx, "session_get", [req.session, binding(req)])


async def session_touch(req: Request, ctx: Context) -> dict[str, Any]:
    return await session_call(req, ctx, "session_touch", [req.session, binding(req)])


async def session_update(req: Request, ctx: Context) -> dict[str, Any]:
    b = req.body
    args = [req.session, b.get("data"), b.get("expected_rev"), b.get("version"), b.get("set"), b.get("unset")]
    return await session_call(req, ctx, "session_update", [*args, binding(req)])


async def session_rotate(req: Request, ctx: Context) -> dict[str, Any]:
    """The new raw id keeps the old one's bucket (a version 8 id; a version 4 one made before sharding gets a
    version 4 successor, located as it was); under an idempotency key it is made from the old raw id and the key."""
    old = req.header.session_id
    raw = ctx.sessions.new_raw(ctx.sessions.bucket_of_raw(old), "SESSION_ROTATE", old, req.idempotency_key)
    stored, handle = ctx.sessions.made(raw)
    args = [req.session, stored, req.body.get("grace_ms"), binding(req)]
    result = await session_call(req, ctx, "session_rotate", args)
    return _answer_with_session(req, result, raw, handle)


async def session_delete_client(req: Request, ctx: Context) -> dict[str, Any]:
    """Log out everywhere; with except_current, all but the header's session."""
    b = req.body
    keep = req.session if b.get("except_current") and req.session else None
    if keep is not None and ctx.sessions.lazy_rekey:
        await rekey(req, ctx)  # the one kept is renamed first, if it is still raw-keyed
    return await ctx.storage.call(
        "session_delete_client", [b["client_id"], keep], job=req.job, idempotency_key=req.idempotency_key
    )


async def session_delete(req: Request, ctx: Context) -> dict[str, Any]:
    """By the header's session (its binding checked), or by handle with the client it must belong to ("sign out
    that device": a front server or the console ending another of the client's sessions)."""
    b = req.body
    handle, client_id = b.get("handle"), b.get("client_id")
    if req.session:
        if handle is not None or client_id is not None:
            return _bad("a header session_id or a handle with its client_id, not both")
        return await session_call(req, ctx, "session_delete", [req.session, binding(req), None, None])
    if handle is None or client_id is None:
        return _bad("a header session_id, or a handle with its client_id")
    try:
        stored_of(handle)
    except NotAHandle as e:
        return _bad(str(e))
    return await ctx.storage.call(
        "session_delete", [None, None, handle, client_id], job=req.job, idempotency_key=req.idempotency_key
    )


def _bad(message: str) -> dict[str, Any]:
    return {"status": "BAD_REQUEST", "message": message}


async def session_list(req: Request, ctx: Context) -> dict[str, Any]:
    """Each session by its handle (storage names them so: never an id, which would hand out every other device's
    credential)."""
    return await ctx.storage.call("session_list", [req.body["client_id"]], job=req.job)


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
