"""`smartcache` without the server extra says what is missing and exits 2, in the words `smartcache-console` and
`smartcache-cli cluster` use (smartcache.extras), never with a raw ModuleNotFoundError."""

from __future__ import annotations

import sys

import pytest

import smartcache.server
from smartcache import extras


def _unimported(monkeypatch: pytest.MonkeyPatch, *prefixes: str) -> None:
    """The modules under prefixes imported afresh by the test: the originals back after it, in sys.modules and
    as their packages' attributes (``from smartcache.server import config`` finds the attribute first)."""
    for name in [m for m in sys.modules if m.startswith(prefixes)]:
        parent, _, child = name.rpartition(".")
        if hasattr(sys.modules.get(parent), child):
            monkeypatch.setattr(sys.modules[parent], child, getattr(sys.modules[parent], child))
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delattr(smartcache.server, "app", raising=False)


@pytest.mark.parametrize("package", smartcache.server.SERVER_PACKAGES)
def test_the_service_names_a_missing_package_of_the_server_extra_with_the_install_command(
    package: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _unimported(monkeypatch, package, "smartcache.server.", "smartcache.ops")
    monkeypatch.setitem(sys.modules, package, None)  # import package: ModuleNotFoundError, as when not installed
    assert smartcache.server.main(["--help"]) == extras.EXIT_MISSING == 2
    err = capsys.readouterr().err
    assert err == (
        f"smartcache: the service needs the server extra ({package} is missing): "
        "pip install 'smartcache-bank[server]'\n"
    )


def test_a_missing_module_outside_the_extra_is_raised_again() -> None:
    e = ModuleNotFoundError("No module named 'smartcache.nothing'", name="smartcache.nothing")
    with pytest.raises(ModuleNotFoundError) as raised:
        extras.missing(e, ("tarantool",), "smartcache: the service")
    assert raised.value is e
