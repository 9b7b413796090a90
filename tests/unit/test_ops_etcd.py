"""The etcd client's core without I/O (service/smartcache/ops/etcd): the gateway's calls and answers, and the walk
over the endpoints both faces share."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from smartcache.ops import etcd
from smartcache.ops.etcd import core, sync


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_a_prefix_read_asks_for_every_key_up_to_the_next_prefix() -> None:
    call = core.range_call("/smartcache/bank/members/", prefix=True)
    assert call.path == "/v3/kv/range"
    assert call.body == {"key": _b64("/smartcache/bank/members/"), "range_end": _b64("/smartcache/bank/members0")}


def test_a_compare_and_swap_compares_the_mod_revision_as_a_string() -> None:
    body = core.put_if_call("/k", b"v", 42).body
    assert body is not None
    assert body["compare"] == [{"key": _b64("/k"), "target": "MOD", "result": "EQUAL", "mod_revision": "42"}]
    assert body["success"] == [{"request_put": {"key": _b64("/k"), "value": _b64("v")}}]


def test_a_create_that_lost_the_race_returns_the_value_that_was_there() -> None:
    there = {"kvs": [{"key": _b64("/k"), "value": _b64("theirs"), "mod_revision": "7"}]}
    assert core.created({"succeeded": True}, b"ours") == (b"ours", True)
    assert core.created({"responses": [{"response_range": there}]}, b"ours") == (b"theirs", False)
    assert core.kvs(there) == [core.KeyValue("/k", b"theirs", 7)]


def test_endpoints_get_a_scheme_and_lose_their_trailing_slash() -> None:
    assert etcd.endpoints_of(" a:2379, http://b:2479/ ,") == ["http://a:2379", "http://b:2479"]


def test_a_call_goes_to_the_first_endpoint_that_answers_and_next_time_to_it_first() -> None:
    rotation = core.Rotation(["http://a", "http://b", "http://c"])
    attempt = rotation.attempt()
    asked = []
    for endpoint in attempt:
        asked.append(endpoint)
        if endpoint == "http://a":
            attempt.failed(endpoint, ConnectionRefusedError(111, "Connection refused"))
        elif attempt.answered(endpoint, 200, {"kvs": []}):
            break
    assert asked == ["http://a", "http://b"]
    assert list(rotation.attempt()) == ["http://b", "http://c", "http://a"]


def test_when_none_answers_the_error_says_what_each_did_and_the_next_call_starts_further_on() -> None:
    rotation = core.Rotation(["http://a", "http://b"])
    attempt = rotation.attempt()
    for endpoint in attempt:
        if endpoint == "http://a":
            attempt.failed(endpoint, TimeoutError("timed out"))
        else:
            assert not attempt.answered(endpoint, 503, {"error": "etcdserver: no leader"})
    error = attempt.unavailable()
    assert str(error) == "http://a: TimeoutError: timed out; http://b: HTTP 503"
    assert list(rotation.attempt()) == ["http://b", "http://a"]
    assert str(core.Rotation([]).attempt().unavailable()) == "no etcd endpoint given"


def test_the_blocking_face_reads_a_key_with_its_revision(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, Any]] = []

    def request(url: str, body: dict[str, Any] | None, timeout_s: float) -> tuple[int, Any]:
        asked.append((url, body))
        if url.startswith("http://down"):
            raise OSError("Connection refused")
        return 200, {"kvs": [{"key": _b64("/k"), "value": _b64(json.dumps({"uri": "t1:3301"})), "mod_revision": 9}]}

    monkeypatch.setattr(sync, "request", request)
    assert etcd.read_revision(["http://down", "http://up"], "/k", 1.0) == (b'{"uri": "t1:3301"}', 9)
    assert [url for url, _ in asked] == ["http://down/v3/kv/range", "http://up/v3/kv/range"]
    monkeypatch.setattr(sync, "request", lambda *_: (200, {}))
    assert etcd.read(["http://up"], "/absent", 1.0) == []
    assert etcd.read_revision(["http://up"], "/absent", 1.0) == (None, 0)
