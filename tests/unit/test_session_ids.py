"""Session ids on the way in: storage gets stored ids only, the service makes the raw ids it answers, a key
that is not the cluster's refuses every session call, and the lazy rekey renames a raw-keyed session once."""

from __future__ import annotations

import asyncio
import dataclasses
import tomllib
import uuid
from typing import Any

import pytest

from smartcache.server.config import Settings
from smartcache.server.handlers.routes import ALL_HANDLERS
from smartcache.server.sessionids import KeyCheck, SessionIds, uuid_text
from smartcache.server.work.execute import BINDING_MAX_BYTES, BINDING_MIN_BYTES
from smartcache.wire import NO_SESSION, STATUS, buckets
from smartcache.wire.registry import REGISTRY_PATH
from smartcache.wire.sessionkeys import binding_digest, derive, handle
from tests.unit.stubs import SESSION, StubStorage, sample
from tests.unit.test_execute import context, job, reply_of, run

KEY = bytes(range(32))


def _ctx(storage: StubStorage, **settings: Any) -> Any:
    ctx = context(storage)
    ctx.settings = dataclasses.replace(Settings(), session_key=KEY, **settings)
    ctx.sessions = SessionIds(ctx.settings)
    return ctx


def _raw_forms(raw: bytes) -> set[str]:
    return {raw.hex(), uuid_text(raw), str(uuid.UUID(bytes=raw))}


def _args_text(storage: StubStorage) -> str:
    return repr([c.args for c in storage.calls])


STORED = uuid_text(derive(KEY, SESSION))


@pytest.mark.parametrize(
    ("type_name", "fields"),
    [
        ("SESSION_GET", {}),
        ("SESSION_TOUCH", {}),
        ("SESSION_UPDATE", {"data": 1}),
        ("SESSION_DELETE", {}),
        ("SESSION_ROTATE", {}),
        ("SESSION_DELETE_CLIENT", {"client_id": "c-1", "except_current": True}),
        ("CACHE_PUT", {"key": "k", "data": 1}),
        ("CACHE_GET", {"key": "k"}),
        ("CACHE_DELETE", {"key": "k"}),
        ("PRODUCTS_GET", {"client_id": "c-1", "data_type": 1}),
    ],
)
def test_every_call_that_names_a_session_gives_storage_its_stored_id_never_the_raw_one(
    type_name: str, fields: dict[str, Any]
) -> None:
    storage = StubStorage(default={"status": "FRESH", "data": 1, "updated_at_ms": 0})
    if type_name != "PRODUCTS_GET":
        storage.default = {"status": "OK"}
    run(job(type_name, fields, session_id=SESSION), ALL_HANDLERS, _ctx(storage))
    assert storage.calls
    assert STORED in _args_text(storage)
    for form in _raw_forms(SESSION):
        assert form not in _args_text(storage)
    assert repr(SESSION) not in _args_text(storage)


def test_a_create_with_a_zero_id_on_a_sharded_cluster_makes_a_version_8_id_with_the_clients_bucket() -> None:
    storage = StubStorage(bucket_count=1024, default={"status": "OK", "rev": 1})
    ctx = _ctx(storage)
    h, b = reply_of(run(job("SESSION_CREATE", {"client_id": "client-7"}), ALL_HANDLERS, ctx))
    assert buckets.session_bucket(h.session_id) == buckets.bucket_of("client-7", 1024)
    assert storage.calls[0].args[0] == uuid_text(derive(KEY, h.session_id))
    assert b["handle"] == handle(derive(KEY, h.session_id))


def test_a_repeat_under_an_idempotency_key_makes_the_same_raw_id_and_another_key_another() -> None:
    def create(key: str) -> bytes:
        storage = StubStorage(default={"status": "OK", "rev": 1})
        fields = {"client_id": "c-1", "idempotency_key": key}
        h, _ = reply_of(run(job("SESSION_CREATE", fields), ALL_HANDLERS, _ctx(storage)))
        return bytes(h.session_id)

    assert create("k-1") == create("k-1")
    assert create("k-1") != create("k-2")
    assert create("k-1") != NO_SESSION


def test_without_an_idempotency_key_every_create_makes_a_new_random_id() -> None:
    ids = set()
    for _ in range(3):
        h, _ = reply_of(run(job("SESSION_CREATE", {"client_id": "c-1"}), ALL_HANDLERS, _ctx(StubStorage())))
        ids.add(bytes(h.session_id))
    assert len(ids) == 3


def test_a_rotation_passes_both_stored_ids_and_grace_and_answers_the_new_raw_id_keeping_the_bucket() -> None:
    old = buckets.session_id_with_bucket(bytes(range(16)), 77)
    storage = StubStorage(default={"status": "OK", "rev": 3, "cache_moved": 0, "grace_ms": 500})
    h, b = reply_of(run(job("SESSION_ROTATE", {"grace_ms": 500}, session_id=old), ALL_HANDLERS, _ctx(storage)))
    new = bytes(h.session_id)
    assert new not in (old, NO_SESSION)
    assert buckets.session_bucket(new) == 77
    assert storage.calls[0].args == [uuid_text(derive(KEY, old)), uuid_text(derive(KEY, new)), 500, None]
    assert b["handle"] == handle(derive(KEY, new))


def test_a_rotation_refused_answers_a_zero_id_and_no_handle() -> None:
    storage = StubStorage(default={"status": "NOT_FOUND"})
    h, b = reply_of(run(job("SESSION_ROTATE", {}, session_id=SESSION), ALL_HANDLERS, _ctx(storage)))
    assert h.session_id == NO_SESSION
    assert "handle" not in b


def test_a_binding_reaches_storage_as_its_sha256_never_the_value() -> None:
    storage = StubStorage()
    run(job("SESSION_GET", {"binding": "device-42"}, session_id=SESSION), ALL_HANDLERS, _ctx(storage))
    assert storage.calls[0].args == [STORED, binding_digest("device-42")]
    assert "device-42" not in _args_text(storage)


def test_binding_mismatch_is_answered_as_storage_says() -> None:
    storage = StubStorage(default={"status": "BINDING_MISMATCH"})
    _, b = reply_of(run(job("SESSION_GET", {"binding": "x"}, session_id=SESSION), ALL_HANDLERS, _ctx(storage)))
    assert b["status"] == STATUS["BINDING_MISMATCH"]


def test_delete_by_handle_needs_its_client_and_no_header_id() -> None:
    h = handle(derive(KEY, SESSION))
    cases = [
        ({"handle": h}, NO_SESSION, "a header session_id, or a handle with its client_id"),
        ({"handle": h, "client_id": "c"}, SESSION, "not both"),
        ({}, NO_SESSION, "a header session_id, or a handle with its client_id"),
        ({"handle": STORED, "client_id": "c"}, NO_SESSION, "is a session id (a UUID), not a handle"),
    ]
    for fields, sid, message in cases:
        storage = StubStorage()
        _, b = reply_of(run(job("SESSION_DELETE", fields, session_id=sid), ALL_HANDLERS, _ctx(storage)))
        assert b["status"] == STATUS["BAD_REQUEST"]
        assert message in b["message"]
        assert storage.calls == []
    storage = StubStorage()
    run(job("SESSION_DELETE", {"handle": h, "client_id": "c"}), ALL_HANDLERS, _ctx(storage))
    assert storage.calls[0].args == [None, None, h, "c"]


def test_a_key_that_is_not_the_clusters_refuses_every_session_call_and_nothing_else() -> None:
    storage = StubStorage().will_answer({"status": "MISMATCH", "expected": "00" * 8})
    ctx = _ctx(storage)
    assert asyncio.run(KeyCheck(ctx.sessions).check(storage)) is True
    assert ctx.sessions.checked is False
    for type_name, fields, sid in [
        ("SESSION_GET", {}, SESSION),
        ("SESSION_CREATE", {"client_id": "c"}, NO_SESSION),
        ("SESSION_LIST", {"client_id": "c"}, NO_SESSION),
        ("CACHE_GET", {"key": "k"}, SESSION),
    ]:
        answer = run(job(type_name, fields, session_id=sid), ALL_HANDLERS, ctx)
        assert answer.error == "STORAGE_UNAVAILABLE"
        assert f"key id {ctx.sessions.key_id}" in answer.message
        assert "key id 0000000000000000" in answer.message
    assert run(job("CACHE_GET", {"key": "k"}), ALL_HANDLERS, ctx).error is None  # the global namespace
    storage.will_answer({"status": "OK"})
    assert asyncio.run(KeyCheck(ctx.sessions).check(storage)) is True
    assert (ctx.sessions.checked, ctx.sessions.refusal) == (True, None)


def test_the_key_check_asks_every_shard() -> None:
    storage = StubStorage(shard_names=("s1", "s2"))
    ids = SessionIds(dataclasses.replace(Settings(), session_key=KEY))
    asyncio.run(KeyCheck(ids).check(storage))
    assert [c.args for c in storage.calls] == [[ids.key_id], [ids.key_id]]
    assert ids.checked


def test_the_lazy_rekey_renames_a_raw_keyed_session_and_asks_again() -> None:
    storage = StubStorage().will_answer({"status": "NOT_FOUND"}).will_answer({"status": "OK"})
    storage.will_answer({"status": "OK", "data": 1})
    ctx = _ctx(storage, session_rekey="lazy")
    _, b = reply_of(run(job("SESSION_GET", {}, session_id=SESSION), ALL_HANDLERS, ctx))
    assert b["status"] == STATUS["OK"]
    assert [c.procedure for c in storage.calls] == ["session_get", "session_rekey", "session_get"]
    assert storage.calls[1].args == [uuid_text(SESSION), STORED]
    assert sample(ctx.metrics.sessions_rekeyed) == 1


def test_without_the_lazy_rekey_not_found_is_the_answer_and_the_raw_id_never_leaves() -> None:
    storage = StubStorage(default={"status": "NOT_FOUND"})
    _, b = reply_of(run(job("SESSION_GET", {}, session_id=SESSION), ALL_HANDLERS, _ctx(storage)))
    assert b["status"] == STATUS["NOT_FOUND"]
    assert [c.procedure for c in storage.calls] == ["session_get"]


def test_a_session_the_lazy_rekey_does_not_find_raw_keyed_is_not_found() -> None:
    storage = StubStorage(default={"status": "NOT_FOUND"})
    ctx = _ctx(storage, session_rekey="lazy")
    _, b = reply_of(run(job("CACHE_GET", {"key": "k"}, session_id=SESSION), ALL_HANDLERS, ctx))
    assert b["status"] == STATUS["NOT_FOUND"]
    assert [c.procedure for c in storage.calls] == ["cache_get", "session_rekey"]


def test_a_not_found_about_a_session_is_marked_a_miss_and_a_live_sessions_missing_key_is_not() -> None:
    def answer(type_name: str, fields: dict[str, Any], result: dict[str, Any]) -> bool:
        storage = StubStorage(default=result)
        return run(job(type_name, fields, session_id=SESSION), ALL_HANDLERS, _ctx(storage)).miss

    assert answer("SESSION_GET", {}, {"status": "NOT_FOUND"})
    assert answer("SESSION_ROTATE", {}, {"status": "NOT_FOUND"})
    assert answer("CACHE_GET", {"key": "k"}, {"status": "NOT_FOUND", "message": "session is not live"})
    assert not answer("CACHE_GET", {"key": "k"}, {"status": "NOT_FOUND"})
    assert not answer("SESSION_GET", {}, {"status": "OK"})


def test_a_binding_is_checked_for_its_length_here_since_storage_sees_its_digest() -> None:
    limit = tomllib.loads(REGISTRY_PATH.read_text())["limits"]["binding"]
    assert (limit["min"], limit["max"]) == (BINDING_MIN_BYTES, BINDING_MAX_BYTES)
    for value, ok in (("", False), ("é" * 128, True), ("x" * 257, False)):
        storage = StubStorage()
        _, b = reply_of(run(job("SESSION_GET", {"binding": value}, session_id=SESSION), ALL_HANDLERS, _ctx(storage)))
        assert (b["status"] == STATUS["OK"]) is ok
        if not ok:
            assert b["message"] == "binding must be a string of 1..256 bytes"
