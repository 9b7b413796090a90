"""One message from its body to its answer: decode, validate, run the handler, build the reply or the failure."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from typing import Any

import pytest

from smartcache.server.broker import inproc
from smartcache.server.config import Settings
from smartcache.server.corebackend import CoreBackend
from smartcache.server.handlers import Context, Handler, Request
from smartcache.server.handlers.devices import HANDLERS as DEVICES
from smartcache.server.handlers.sessions import HANDLERS as SESSIONS
from smartcache.server.job import Job
from smartcache.server.metrics import Metrics
from smartcache.server.work.execute import Answer, execute
from smartcache.wire import (
    FLAG_DATA_ERROR,
    FLAG_NO_REPLY,
    NO_SESSION,
    REGISTRY,
    STATUS,
    decode_body,
    decode_header,
    frame_flags,
)
from smartcache.wire.errors import DeadlineExceeded, OutcomeUnknown, StorageUnavailable
from tests.unit.stubs import SESSION, StubStorage, body, header, sample

MAX_BODY_BYTES = 4096


def context(storage: StubStorage, metrics: Metrics | None = None) -> Context:
    settings = Settings()
    metrics = metrics or Metrics()
    return Context(
        storage=storage,  # type: ignore[arg-type]
        backend=CoreBackend(settings=settings, metrics=metrics),  # never called here: no network
        settings=settings,
        metrics=metrics,
        enqueue=lambda *_: None,
        owner_prefix="test/w0",
    )


def job(
    type_name: str, fields: Mapping[str, Any] | None = None, *, raw: bytes | None = None, **header_fields: Any
) -> Job:
    frame = header(type_name, **header_fields)
    return Job(inproc.TICKET.pack(1, 2000), frame, body(fields) if raw is None else raw, time.monotonic() + 2.0)


def run(j: Job, handlers: Mapping[str, Handler], ctx: Context | None = None) -> Answer:
    return asyncio.run(execute(j, ctx or context(StubStorage()), handlers, MAX_BODY_BYTES))


def returning(result: dict[str, Any], calls: list[Request] | None = None) -> Handler:
    """A handler that answers ``result`` (and records the requests it got)."""

    async def handler(req: Request, ctx: Context) -> dict[str, Any]:
        if calls is not None:
            calls.append(req)
        return dict(result)

    return handler


def reply_of(answer: Answer) -> tuple[Any, dict[str, Any]]:
    """The decoded (header, body) of a reply answer."""
    assert answer.error is None
    assert answer.frames is not None
    h, b = answer.frames
    return decode_header(h), decode_body(b)


# -- the body ----------------------------------------------------------------------------


def test_an_undecodable_body_fails_with_bad_body_counts_it_and_runs_no_handler() -> None:
    calls: list[Request] = []
    ctx = context(StubStorage())
    answer = run(job("DEVICE_LOOKUP", raw=b"\xc1"), {"DEVICE_LOOKUP": returning({"status": "OK"}, calls)}, ctx)
    assert (answer.outcome, answer.error, answer.frames) == ("BAD_BODY", "BAD_BODY", None)
    assert answer.message
    assert sample(ctx.metrics.bad_input, error="bad_body") == 1
    assert calls == []


def test_a_body_over_the_limit_fails_with_body_too_large_and_counts_it() -> None:
    ctx = context(StubStorage())
    answer = run(job("DEVICE_LOOKUP", {"device_id": "x" * MAX_BODY_BYTES}), {}, ctx)
    assert (answer.outcome, answer.error) == ("BODY_TOO_LARGE", "BODY_TOO_LARGE")
    assert sample(ctx.metrics.bad_input, error="body_too_large") == 1


# -- the registry's checks -----------------------------------------------------------------


BAD_REQUESTS = {
    "missing field": ("DEVICE_LOOKUP", {}, NO_SESSION, "missing field 'device_id'"),
    "mistyped field": ("DEVICE_LOOKUP", {"device_id": 5}, NO_SESSION, "field 'device_id' must be str"),
    "session required": ("SESSION_GET", {}, NO_SESSION, "header session_id is required for this type"),
    "session must be zero": (
        "DEVICE_LOOKUP",
        {"device_id": "d-1"},
        SESSION,
        "header session_id must be zero for this type",
    ),
}


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_a_request_the_registry_refuses_is_answered_bad_request_without_running_its_handler(name: str) -> None:
    type_name, fields, session_id, message = BAD_REQUESTS[name]
    calls: list[Request] = []
    handlers = {t: returning({"status": "OK"}, calls) for t in ("DEVICE_LOOKUP", "SESSION_GET")}
    answer = run(job(type_name, fields, session_id=session_id), handlers)
    h, b = reply_of(answer)
    assert answer.outcome == "BAD_REQUEST"
    assert b == {"status": STATUS["BAD_REQUEST"], "message": message}
    assert (h.transport_error, h.flags, h.request_id) == (0, 0, 1)
    assert calls == []


@pytest.mark.parametrize("session_id", [NO_SESSION, SESSION])
def test_an_optional_session_rule_accepts_a_zero_and_a_set_session_id(session_id: bytes) -> None:
    answer = run(job("CACHE_GET", {"key": "k"}, session_id=session_id), {"CACHE_GET": returning({"status": "OK"})})
    assert answer.outcome == "OK"


def test_the_handler_gets_the_decoded_header_and_body_and_the_job() -> None:
    calls: list[Request] = []
    j = job("SESSION_GET", {"extra": 1}, session_id=SESSION, request_id=77, lifetime_ms=900)
    run(j, {"SESSION_GET": returning({"status": "OK"}, calls)})
    [req] = calls
    assert req.header == decode_header(j.header)
    assert req.body == {"extra": 1}  # unknown fields are passed on, not refused
    assert req.job is j
    assert req.deadline == j.deadline


# -- the reply --------------------------------------------------------------------------------


def test_a_handlers_result_becomes_the_reply_with_its_status_code_in_the_requests_header() -> None:
    storage = StubStorage().will_answer({"status": "OK", "client_id": "c-1"})
    j = job("DEVICE_LOOKUP", {"device_id": "d-1"}, request_id=5)
    answer = run(j, DEVICES, context(storage))
    assert answer.outcome == "OK"
    assert answer.frames is not None
    assert answer.frames[0] == j.header  # nothing to change in it
    assert decode_body(answer.frames[1]) == {"status": STATUS["OK"], "client_id": "c-1"}
    [call] = storage.calls
    assert (call.procedure, call.args, call.job) == ("device_lookup", ["d-1"], j)
    assert (j.sent, j.returned) == (1, 1)


def test_a_status_that_is_not_a_data_error_is_a_plain_reply() -> None:
    storage = StubStorage().will_answer({"status": "NOT_FOUND"})
    h, b = reply_of(run(job("DEVICE_LOOKUP", {"device_id": "d-1"}), DEVICES, context(storage)))
    assert (h.flags, b) == (0, {"status": STATUS["NOT_FOUND"]})


def test_a_data_error_status_sets_data_error_and_makes_the_body_an_error_object() -> None:
    for status in sorted(REGISTRY.data_error_statuses - {"ERROR"}):
        answer = run(job("CACHE_GET", {"key": "k"}), {"CACHE_GET": returning({"status": status})})
        h, b = reply_of(answer)
        assert answer.outcome == status
        assert h.flags == FLAG_DATA_ERROR
        assert h.transport_error == 0
        assert b == {"status": STATUS[status], "error": status, "message": status}


def test_a_data_error_keeps_the_handlers_own_error_and_message() -> None:
    result = {"status": "BACKEND_ERROR", "error": "BACKEND_ERROR", "message": "HTTP 503"}
    _, b = reply_of(run(job("CACHE_GET", {"key": "k"}), {"CACHE_GET": returning(result)}))
    assert b["message"] == "HTTP 503"


def test_a_reply_has_the_replys_flags_not_the_requests() -> None:
    answer = run(job("CACHE_GET", {"key": "k"}, flags=FLAG_NO_REPLY), {"CACHE_GET": returning({"status": "OK"})})
    assert answer.frames is not None
    assert frame_flags(answer.frames[0]) == 0


def test_a_reply_keeps_the_requests_session_id_for_a_type_that_creates_none() -> None:
    h, _ = reply_of(run(job("CACHE_GET", {"key": "k"}, session_id=SESSION), {"CACHE_GET": returning({"status": "OK"})}))
    assert h.session_id == SESSION


CREATED = uuid.UUID(bytes=bytes(range(16, 32)))


def test_session_create_ok_answers_the_raw_id_the_service_made_in_the_header_and_storage_gets_its_stored_id() -> None:
    storage = StubStorage().will_answer({"status": "OK", "rev": 1})
    ctx = context(storage)
    h, b = reply_of(run(job("SESSION_CREATE", {"client_id": "c-1"}), SESSIONS, ctx))
    stored, handle = ctx.sessions.made(h.session_id)
    assert uuid.UUID(bytes=h.session_id).version == 4  # one replica set: version 4
    assert storage.calls[0].args[0] == stored != str(uuid.UUID(bytes=h.session_id))
    assert b == {"status": STATUS["OK"], "rev": 1, "handle": handle}  # the id travels in the header only


def test_session_create_that_is_not_ok_answers_a_zero_session_id_even_if_the_request_had_one() -> None:
    storage = StubStorage().will_answer({"status": "ALREADY_EXISTS"})
    h, b = reply_of(run(job("SESSION_CREATE", {"client_id": "c-1"}, session_id=SESSION), SESSIONS, context(storage)))
    assert h.session_id == NO_SESSION
    assert b["status"] == STATUS["ALREADY_EXISTS"]


def test_session_create_answered_other_than_ok_carries_a_zero_session_id_even_if_the_handler_set_one() -> None:
    async def half_created(req: Request, ctx: Context) -> dict[str, Any]:
        req.reply_session = CREATED.bytes
        return {"status": "BAD_REQUEST", "message": "ttl_s out of range"}

    h, _ = reply_of(run(job("SESSION_CREATE", {"client_id": "c-1"}), {"SESSION_CREATE": half_created}))
    assert h.session_id == NO_SESSION


def test_session_create_ok_without_a_created_id_answers_a_zero_session_id() -> None:
    handlers = {"SESSION_CREATE": returning({"status": "OK"})}
    h, _ = reply_of(run(job("SESSION_CREATE", {"client_id": "c-1"}, session_id=SESSION), handlers))
    assert h.session_id == NO_SESSION


def test_a_storage_only_status_from_a_handler_raises_instead_of_reaching_a_client() -> None:
    for status in sorted(REGISTRY.storage_only_statuses):
        with pytest.raises(ValueError, match=status):
            run(job("CACHE_GET", {"key": "k"}), {"CACHE_GET": returning({"status": status})})


# -- storage failures ----------------------------------------------------------------------------


FAILURES = {
    "unavailable": (StorageUnavailable("no leader"), "STORAGE_UNAVAILABLE", "no leader", 0),
    "deadline": (
        DeadlineExceeded("too late"),
        "EXPIRED",
        "lifetime ended before storage could execute it: too late",
        1,
    ),
    "unknown": (OutcomeUnknown("connection lost"), "OUTCOME_UNKNOWN", "connection lost", 1),
}


@pytest.mark.parametrize("name", list(FAILURES))
def test_a_storage_failure_becomes_the_transport_error_that_says_whether_it_ran(name: str) -> None:
    error, transport_error, message, sent = FAILURES[name]
    storage = StubStorage().will_raise(error)
    j = job("DEVICE_LOOKUP", {"device_id": "d-1"})
    answer = run(j, DEVICES, context(storage))
    assert answer == Answer(outcome=transport_error, frames=None, error=transport_error, message=message)
    assert (j.sent, j.returned) == (sent, sent)


def test_any_other_exception_from_a_handler_propagates_for_the_worker_to_answer() -> None:
    async def broken(req: Request, ctx: Context) -> dict[str, Any]:
        raise RuntimeError("bug")

    with pytest.raises(RuntimeError, match="bug"):
        run(job("CACHE_GET", {"key": "k"}), {"CACHE_GET": broken})
