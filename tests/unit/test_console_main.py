"""`smartcache-console` without the server extra says what is missing and exits 2, as `smartcache` and
`smartcache-cli cluster` do, never with a raw ModuleNotFoundError."""

from __future__ import annotations

import sys

import pytest

import smartcache.console
from smartcache.console import main


def _unimported(monkeypatch: pytest.MonkeyPatch, *prefixes: str) -> None:
    """The modules under prefixes imported afresh by the test (the originals back after it)."""
    for name in [m for m in sys.modules if m.startswith(prefixes)]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delattr(smartcache.console, "serve", raising=False)


@pytest.mark.parametrize("package", main.CONSOLE_PACKAGES)
def test_a_missing_package_of_the_server_extra_is_named_with_the_install_command(
    package: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _unimported(monkeypatch, package, "smartcache.console.", "smartcache.ops", "smartcache.cli")
    monkeypatch.setitem(sys.modules, package, None)  # import package: ModuleNotFoundError, as when not installed
    assert main.main(["--help"]) == 2
    err = capsys.readouterr().err
    assert f"({package} is missing)" in err
    assert "pip install 'smartcache-bank[server]'" in err


def test_another_missing_module_is_not_taken_for_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _unimported(monkeypatch, "smartcache.console.")
    monkeypatch.setitem(sys.modules, "smartcache.console.app", None)
    with pytest.raises(ModuleNotFoundError):
        main.main(["--help"])
