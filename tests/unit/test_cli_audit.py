"""smartcache-cli audit and cluster sessions-rekey, without storage: what is refused before anything is asked
(no key, a bad key never shown, no reason), and how an entry is printed (the entries themselves:
tests/integration/test_audit_ops.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from smartcache.cli import exits, output
from smartcache.cli.main import main
from smartcache.ops import rekey

NOBODY = "127.0.0.1:1"


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every rekey the CLI would start (none may be, in these tests)."""
    calls: list[Any] = []
    monkeypatch.setattr(rekey, "rekey", lambda *a, **k: calls.append((a, k)) or {"status": "OK"})
    for name in ("SMARTCACHE_SESSION_KEY", "SMARTCACHE_SESSION_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    return calls


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = main(["cluster", "--etcd", "", "--tarantool", NOBODY, "--cluster", "bank", *argv])
    return code, json.loads(capsys.readouterr().out.splitlines()[-1])


def test_sessions_rekey_without_the_session_key_is_refused_naming_the_variables(
    asked: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc = _run(["sessions-rekey", "--reason", "upgrade to revision 11"], capsys)
    assert code == exits.USAGE
    assert doc["error"] == "BAD_ARGUMENT"
    assert "needs the session key" in doc["message"]
    assert "SMARTCACHE_SESSION_KEY or SMARTCACHE_SESSION_KEY_FILE" in doc["message"]
    assert not asked


def test_a_bad_session_key_is_named_and_never_shown(
    asked: list[Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    secretish = "ab" * 31 + "zz"  # 64 characters, not all hex
    monkeypatch.setenv("SMARTCACHE_SESSION_KEY", secretish)
    code, doc = _run(["sessions-rekey", "--reason", "upgrade"], capsys)
    assert code == exits.USAGE
    assert "SMARTCACHE_SESSION_KEY" in doc["message"]
    assert secretish not in doc["message"]
    assert not asked


def test_sessions_rekey_without_a_reason_is_refused_before_the_key_is_read(
    asked: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc = _run(["sessions-rekey"], capsys)
    assert code == exits.USAGE
    assert doc["message"].startswith("smartcache-cli cluster sessions-rekey: --reason TEXT is required")
    assert not asked


def test_a_reason_longer_than_storage_keeps_is_refused(asked: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = _run(["switchover", "--reason", "é" * 513], capsys)
    assert code == exits.USAGE
    assert "--reason is 1026 bytes; at most 1024" in doc["message"]


def test_shard_cursors_for_one_replica_set_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["audit", "--etcd", "", "--tarantool", NOBODY, "--since", "s1=3"])
    doc = json.loads(capsys.readouterr().out)
    assert code == exits.USAGE
    assert "shard=seq pairs are for a sharded cluster" in doc["message"]


def test_an_entry_in_columns_is_one_line_with_its_shard_phase_and_reason() -> None:
    entry = {
        "seq": 12, "time": "2026-12-06T18:00:00.000+00:00", "who": "cli:alice@bastion as operator",
        "action": "cluster.drain", "target": "s2", "reason": "retire s2", "shard": "s1",
        "details": {"phase": "done", "status": "OK", "moved": 512},
    }  # fmt: skip
    line = output.render(entry, "audit", as_json=False)
    assert line == (
        '2026-12-06T18:00:00.000+00:00  s1:12  cli:alice@bastion as operator  cluster.drain  s2  done OK  "retire s2"'
    )
    assert json.loads(output.render(entry, "audit", as_json=True)) == entry
