"""make run's session key: made once in var/ (0600), kept, and the shell's own wins."""

from __future__ import annotations

import stat
from pathlib import Path

from smartcache.devstack.makerun import _session_key, session_key_file
from smartcache.devstack.plan import Plan


def test_the_key_file_is_made_once_private_and_kept(tmp_path: Path) -> None:
    path = session_key_file(tmp_path / "var")
    first = path.read_text()
    assert len(first.strip()) == 64
    assert bytes.fromhex(first.strip())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert session_key_file(tmp_path / "var").read_text() == first  # kept: var/'s sessions are stored under it


def test_the_service_gets_var_s_key_unless_the_shell_gives_one(tmp_path: Path) -> None:
    plan = Plan.from_env({"SMARTCACHE_VAR": str(tmp_path)})
    assert _session_key(plan, {}) == {"SMARTCACHE_SESSION_KEY_FILE": str(tmp_path / "session.key")}
    assert _session_key(plan, {"SMARTCACHE_SESSION_KEY": "ab" * 32}) == {}
    assert _session_key(plan, {"SMARTCACHE_SESSION_KEY_FILE": "/run/secrets/session_key"}) == {}
