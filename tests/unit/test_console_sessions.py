"""The console's session lookups without a stack: a session id in any UUID spelling is refused saying why, a
handle and a client id are taken, each replica set is asked leader first, and data is masked unless revealed."""

from __future__ import annotations

import uuid

import pytest

from smartcache.console import sessions
from smartcache.wire import sessionkeys

SID = uuid.UUID("6f1c2d4e-0b7a-4c55-9a51-3f0e8c1d2b6a")
HANDLE = sessionkeys.handle(SID.bytes)


@pytest.mark.parametrize("typed", [str(SID), SID.hex, str(SID).upper(), f"{{{SID}}}", f"urn:uuid:{SID}", f" {SID} "])
def test_a_session_id_in_any_spelling_is_refused_saying_why(typed: str) -> None:
    with pytest.raises(sessions.Refused, match="a session id is a credential") as refused:
        sessions.query_of(typed)
    assert str(SID) not in str(refused.value)


def test_a_handle_and_a_client_id_are_taken() -> None:
    assert sessions.query_of(HANDLE) == ("handle", HANDLE)
    assert sessions.query_of(" client-42 ") == ("client_id", "client-42")
    assert sessions.query_of("hello") == ("client_id", "hello")  # an h-word is a client id unless handle-shaped


def test_something_shaped_like_a_handle_that_is_not_one_is_refused_with_the_reason() -> None:
    with pytest.raises(sessions.Refused, match="lowercase"):
        sessions.query_of(HANDLE.upper().replace("H", "h", 1))
    with pytest.raises(sessions.Refused, match="type a client id"):
        sessions.query_of("  ")


def test_each_replica_set_is_asked_leader_first_and_only_instances_that_publish_a_port() -> None:
    one = {"address": "10.0.0.1:3301", "http_port": 8301, "reachable": True, "role": "follower"}
    two = {"address": "10.0.0.2:3301", "http_port": 8302, "reachable": True, "role": "leader", "writable": True}
    silent = {"address": "10.0.0.3:3301", "reachable": True, "role": "follower"}
    assert sessions.replica_sets({"instances": [one, two, silent]}) == [
        ["http://10.0.0.2:8302", "http://10.0.0.1:8301"]
    ]
    sharded = {"shards": {"s1": {"instances": [one]}, "s2": {"instances": [silent]}}}
    assert sessions.replica_sets(sharded) == [["http://10.0.0.1:8301"]]


def test_data_is_masked_with_its_size_unless_revealed() -> None:
    view = {"handle": HANDLE, "client_id": "c", "data": {"card": "4111"}}
    assert sessions._shown(view, reveal=False)["data"] == {"masked": sessions.MASK, "bytes": 11}  # msgpack
    assert sessions._shown(view, reveal=True)["data"] == {"card": "4111"}


def test_no_instance_with_an_http_port_is_said_so() -> None:
    found = sessions.lookup([], "client_id", "c", token="", timeout_s=1, reveal=False)
    assert found["error"] == "NO_HTTP"
