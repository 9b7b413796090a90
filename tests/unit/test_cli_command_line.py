"""smartcache-cli's command line (issue 36, what newcomers tripped on): every kind of outcome has its own exit code,
listed in --help."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from smartcache.cli import exits, main
from smartcache.wire.errors import RequestError, RequestTimeout

# --- exit codes ---


def test_every_kind_of_outcome_has_its_own_exit_code_and_help_lists_them(capsys: pytest.CaptureFixture[str]) -> None:
    codes = {name: value for name, value in vars(exits).items() if name.isupper() and isinstance(value, int)}
    assert sorted(codes.values()) == list(range(len(codes))), codes
    with pytest.raises(SystemExit) as exited:
        main.main(["--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    for name, code in codes.items():
        assert re.search(rf"^  {code}  \S", text, re.MULTILINE), f"--help does not list exit code {code} ({name})"
    for word in ("BAD_ARGUMENT", "TIMEOUT", "QUEUE_FULL", "CONNECTION_LOST", "MISSING_PACKAGE", "NOT_FOUND"):
        assert word in text


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (RequestTimeout("no reply"), exits.TIMEOUT),
        (RequestError("QUEUE_FULL", "full"), exits.UNAVAILABLE),
        (RequestError("STORAGE_UNAVAILABLE", "no leader"), exits.UNAVAILABLE),
    ],
)
def test_a_timeout_and_a_transport_error_exit_apart_from_a_usage_error(
    error: RequestError, code: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(*_: Any) -> None:
        raise error

    monkeypatch.setattr(main, "_run", fail)
    assert main.main(["--endpoint", "tcp://127.0.0.1:1", "ping"]) == code
    assert json.loads(capsys.readouterr().out)["error"] == error.transport_error
    assert code != exits.USAGE
