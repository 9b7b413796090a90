"""The client's session calls build the frames PROTOCOL.md revision 11 describes: bindings, lifetimes, grace
windows and handles, and never a handle where a session id goes."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import pytest

from smartcache.client.base import Reply, request_frames
from smartcache.client.typed import TypedCalls
from smartcache.wire import REGISTRY, Header, decode_body, decode_header
from smartcache.wire import sessionkeys as sk
from smartcache.wire.status import Status

SID = uuid.UUID("6f1c2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b")
HANDLE = sk.handle(sk.derive(bytes(range(32)), SID.bytes))


class Frames(TypedCalls[tuple[Header, dict[str, Any]]]):
    """A client whose call returns the decoded frames it would send."""

    def call(
        self,
        type_name: str,
        body: Mapping[str, Any] | None = None,
        *,
        session_id: Any = None,
        lifetime_ms: int = 0,
        timeout_s: float | None = None,
    ) -> tuple[Header, dict[str, Any]]:
        header, frame = request_frames(
            type_name, body, request_id=1, session_id=session_id, lifetime_ms=lifetime_ms, no_reply=False
        )
        h = decode_header(header)
        assert REGISTRY.types_by_id[h.type].check_request(decode_body(frame)) is None
        return h, decode_body(frame)


c = Frames()


def test_a_bound_session_s_calls_carry_the_binding() -> None:
    assert c.session_create("c-1", binding="dev-1", max_lifetime_s=3600)[1] == {
        "client_id": "c-1",
        "binding": "dev-1",
        "max_lifetime_s": 3600,
    }
    for header, body in (
        c.session_get(SID, binding="dev-1"),
        c.session_touch(SID, binding="dev-1"),
        c.session_update(SID, {"a": 1}, binding="dev-1"),
        c.session_delete(SID, binding="dev-1"),
        c.session_rotate(SID, binding="dev-1"),
        c.cache_put("k", 1, session_id=SID, binding="dev-1"),
        c.cache_get("k", session_id=SID, binding="dev-1"),
        c.cache_delete("k", session_id=SID, binding="dev-1"),
    ):
        assert header.session_id == SID.bytes
        assert body["binding"] == "dev-1"


def test_an_unbound_call_sends_no_binding_and_the_frames_of_before() -> None:
    """nil is absent (PROTOCOL.md 5): the client leaves out what was not given, so old calls build old frames."""
    assert c.session_get(SID)[1] == {}
    assert c.session_rotate(SID)[1] == {}
    assert c.cache_get("k", session_id=SID)[1] == {"key": "k"}


def test_a_rotation_takes_its_grace_window() -> None:
    header, body = c.session_rotate(SID, grace_ms=0)
    assert (REGISTRY.types_by_id[header.type].name, body) == ("SESSION_ROTATE", {"grace_ms": 0})


def test_a_session_is_ended_by_handle_with_its_client_and_a_zero_header() -> None:
    header, body = c.session_delete(handle=HANDLE, client_id="c-1")
    assert header.session_id == bytes(16)
    assert body == {"handle": HANDLE, "client_id": "c-1"}


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"session_id": SID, "handle": HANDLE, "client_id": "c-1"},
        {"handle": HANDLE},
        {"client_id": "c-1"},
        {"session_id": SID, "client_id": "c-1"},
    ],
    ids=["neither", "both", "handle alone", "client alone", "id and client"],
)
def test_session_delete_takes_an_id_or_a_handle_with_its_client(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="session_id, or handle= with client_id="):
        c.session_delete(**kwargs)


def test_session_delete_refuses_what_is_not_a_handle_before_sending() -> None:
    with pytest.raises(sk.NotAHandle, match="is a session id"):
        c.session_delete(handle=str(SID), client_id="c-1")


def test_a_handle_is_refused_where_a_session_id_goes() -> None:
    with pytest.raises(ValueError, match="is a session handle, not a session id"):
        c.session_get(HANDLE)


def test_a_reply_gives_the_handle_and_binding_mismatch_is_a_status() -> None:
    header = Header.request(REGISTRY.types["SESSION_CREATE"].id, request_id=1, session_id=SID.bytes)
    created = Reply(header, {"status": 0, "handle": HANDLE, "expires_in_ms": 1, "absolute_expires_in_ms": 2})
    assert created.handle == HANDLE
    assert created.session_id == SID
    assert Reply(header, {"status": 6}).status is Status.BINDING_MISMATCH
    assert Status.BINDING_MISMATCH.code == 6
    assert Reply(header, {"status": 0}).handle is None
