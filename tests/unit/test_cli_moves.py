"""`smartcache-cli cluster shard add / move / rebalance / drain / settle`: bad arguments and an etcd that does not
answer get a precise error and exit code, never a traceback (the moves themselves: tests/integration); a Link's
call on a leader that stops answering goes to the new leader once the leader key names it."""

from __future__ import annotations

import errno
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import tarantool

from smartcache.cli import exits
from smartcache.cli.main import main
from smartcache.ops import cluster, moves


def refused_url() -> str:
    """An etcd URL nothing listens on (a port just closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize(
    "args",
    [
        ["move", "3", "s2", "--reason", "r"], ["rebalance", "--dry-run"], ["drain", "s2", "--reason", "r"],
        ["settle"], ["shard", "add", "s3", "--reason", "r"],
    ],
)  # fmt: skip
def test_an_etcd_that_does_not_answer_is_said_so(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["cluster", "--etcd", refused_url(), "--cluster", "bank", *args])
    doc = json.loads(capsys.readouterr().out)
    assert code == exits.UNAVAILABLE
    assert doc["error"] == "ETCD_UNAVAILABLE", doc
    assert "Connection refused" in doc["message"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["rebalance", "--parallel", "0"], "--parallel: must be 1 or more, not 0"),
        (["drain", "s1", "--pause-ms", "-5"], "--pause-ms: must be 0 or more, not -5"),
        (["move", "x", "s2"], "invalid int value: 'x'"),
    ],
)
def test_bad_arguments_are_refused_naming_the_argument(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["cluster", "--cluster", "bank", *args])
    doc = json.loads(capsys.readouterr().out)
    assert exited.value.code == 2
    assert doc["error"] == "BAD_ARGUMENT"
    assert message in doc["message"]


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["move", "3", "s2"], "move"), (["rebalance"], "rebalance"), (["drain", "s2"], "drain"),
        (["shard", "add", "s3"], "shard add"), (["switchover"], "switchover"), (["rejoin", "a:1"], "rejoin"),
        (["init"], "init"), (["add", "a:1"], "add"), (["remove", "a:1"], "remove"),
        (["move", "3", "s2", "--reason", "  "], "move"),
    ],
)  # fmt: skip
def test_an_acting_command_without_a_reason_is_a_usage_error_before_anything_is_asked(
    args: list[str], what: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[Any] = []
    monkeypatch.setattr(cluster, "leader_now", lambda *a: asked.append(a))
    monkeypatch.setattr(moves.bucketmap.etcd, "read_revision", lambda *a, **k: asked.append(a))
    code = main(["cluster", "--etcd", "", "--tarantool", "127.0.0.1:1", "--cluster", "bank", *args])
    doc = json.loads(capsys.readouterr().out)
    assert code == exits.USAGE
    assert doc["error"] == "BAD_ARGUMENT"
    assert doc["message"].startswith(f"smartcache-cli cluster {what}: --reason TEXT is required: say why")
    assert not asked, "nothing was asked before the reason was checked"


def test_without_a_name_the_moves_ask_the_instances_and_say_so_when_none_answers(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SMARTCACHE_CLUSTER", raising=False)
    nobody = refused_url().removeprefix("http://")
    code = main(
        ["cluster", "--etcd", refused_url(), "--tarantool", nobody, "--cluster", "", "rebalance", "--reason", "r"]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == exits.UNAVAILABLE
    assert doc["error"] == "UNREACHABLE"
    assert nobody in doc["message"]
    assert "--cluster" in doc["message"]


# --- Link: a call on a leader that stops answering goes to the new leader once the key names it ---


class _Answer:
    def __init__(self, doc: dict[str, Any]) -> None:
        self.data = [doc]


class _FakeConn:
    """A connection whose call waits on a socket for `wait_s` (None: until the socket is shut: a frozen leader),
    as the connector's read does, then answers OK naming its address."""

    def __init__(self, address: str, wait_s: float | None) -> None:
        self.address, self.wait_s, self.calls = address, wait_s, 0
        self._socket, self._peer = socket.socketpair()

    def call(self, name: str, args: list[Any]) -> _Answer:
        self.calls += 1
        if self.wait_s is None or self.wait_s > 0:
            self._socket.settimeout(self.wait_s)
            try:
                if self._socket.recv(1) == b"":
                    raise tarantool.error.NetworkError(OSError(errno.ECONNRESET, "Lost connection"))
            except TimeoutError:
                pass
        return _Answer({"status": "OK", "address": self.address, "procedure": name})

    def close(self) -> None:
        self._socket.close()
        self._peer.close()


@pytest.fixture
def link(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[moves.Link, dict[str, Any]]]:
    """A Link on shard s1 whose leader key (etcd) and connections are fakes the test drives: state["key"] is the
    uri the key names (None: no key), state["wait"] per address how long its calls wait (None: forever)."""
    state: dict[str, Any] = {"key": "a1:3301", "wait": {}, "conns": []}

    def read(_endpoints: Any, key: str, _timeout_s: float, **_kw: Any) -> list[tuple[str, bytes]]:
        assert key == "/smartcache/bank.s1/leader"
        return [] if state["key"] is None else [(key, json.dumps({"uri": state["key"], "term": 3}).encode())]

    def connection(_access: Any, address: str, _timeout_s: float) -> _FakeConn:
        conn = _FakeConn(address, state["wait"].get(address, 0.0))
        state["conns"].append(conn)
        return conn

    monkeypatch.setattr(moves.link.etcd, "read", read)
    monkeypatch.setattr(moves.link.instances, "connection", connection)
    monkeypatch.setattr(moves.link, "WATCH_AFTER_S", 0.2)
    monkeypatch.setattr(moves.link, "LEADER_POLL_S", 0.05)
    access = cluster.Access(addresses=(), user="operator", password="operator", etcd=["http://e1"], cluster="bank")
    lk = moves.Link(access, "s1")
    try:
        yield lk, state
    finally:
        lk.close()
        for c in state["conns"]:
            c.close()


def test_a_call_on_a_frozen_leader_goes_to_the_new_one_once_the_key_names_it(
    link: tuple[moves.Link, dict[str, Any]],
) -> None:
    lk, state = link
    state["wait"]["a1:3301"] = None  # frozen: never answers
    threading.Timer(0.5, lambda: state.update(key="a2:3301")).start()
    started = time.monotonic()
    answer = lk.call("bucket_rows", 7)
    took = time.monotonic() - started
    assert answer["address"] == "a2:3301"
    assert lk.dropped == 1
    assert took < 2.0, f"{took:.2f} s: the call waited for its timeout, not for the key"


def test_a_slow_answer_of_the_leader_that_keeps_its_key_is_waited_for(link: tuple[moves.Link, dict[str, Any]]) -> None:
    lk, state = link
    state["wait"]["a1:3301"] = 0.6  # slower than WATCH_AFTER_S: watched, but the key stays its own
    assert lk.call("bucket_gc", 7, 2)["address"] == "a1:3301"
    assert lk.dropped == 0
    assert [c.calls for c in state["conns"]] == [1], "asked once, on one connection"


def test_no_leader_key_is_no_leader_until_one_is_elected(link: tuple[moves.Link, dict[str, Any]]) -> None:
    lk, state = link
    state["key"] = None
    threading.Timer(0.4, lambda: state.update(key="a3:3301")).start()
    assert lk.call("bucket_state", 7)["address"] == "a3:3301"
