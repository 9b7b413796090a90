"""`smartcache-cli cluster shard add / move / rebalance / drain / settle`: bad arguments and an etcd that does not
answer get a precise error and exit code, never a traceback (the moves themselves: tests/integration)."""

from __future__ import annotations

import json
import socket

import pytest

from smartcache.cli.main import main


def refused_url() -> str:
    """An etcd URL nothing listens on (a port just closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize(
    "args",
    [["move", "3", "s2"], ["rebalance", "--dry-run"], ["drain", "s2"], ["settle"], ["shard", "add", "s3"]],
)
def test_an_etcd_that_does_not_answer_is_said_so(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["cluster", "--etcd", refused_url(), "--cluster", "bank", *args])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
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


def test_the_moves_need_the_cluster_s_name(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SMARTCACHE_CLUSTER", raising=False)
    code = main(["cluster", "--etcd", refused_url(), "--cluster", "", "rebalance"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 2
    assert "--cluster" in doc["message"]
