"""The client installs alone, under its own import name: a wheel that holds the package smartcache and
nothing else, a fresh virtual environment with only the client's dependencies, and real calls from it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.conftest import Running

ROOT = Path(__file__).resolve().parents[2]
PIP = ["-m", "pip", "--disable-pip-version-check", "-q"]
#: our distribution (smartcache on the package index is another project); its wheel's file name prefix
DISTRIBUTION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
WHEEL_PREFIX = DISTRIBUTION.replace("-", "_") + "-"
#: what a client-only install may hold besides the distribution itself (pip's own in a new venv)
CLIENT_DISTRIBUTIONS = {DISTRIBUTION, "pyzmq", "msgpack", "pip", "setuptools"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from a copy of what the wheel is made of: an in-tree build/ would keep modules long gone."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheels")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("service", "proto"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, *PIP, "wheel", "--no-deps", "-w", str(out), str(src)], check=True)
    (built,) = out.glob(f"{WHEEL_PREFIX}*.whl")
    return built


@pytest.fixture(scope="module")
def client_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment with the wheel installed the way a front server would: no extra."""
    venv = tmp_path_factory.mktemp("client-venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), *PIP, "install", "-c", str(ROOT / "constraints.txt"), str(wheel)], check=True)
    return venv


def test_the_wheel_holds_one_top_level_package_with_its_registry(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.startswith(WHEEL_PREFIX)}  # not its .dist-info
    assert top == {"smartcache"}
    assert "smartcache/wire/spec/protocol.toml" in names
    assert not any(n.startswith(("loadtest/", "service/", "tests/", "smartcache/devstack/")) for n in names)


def test_the_wheel_holds_every_package_of_the_source_but_the_development_stack(wheel: Path) -> None:
    """A package left out of pyproject's list builds a wheel whose service fails at its first import
    (smartcache.supervision once did: the Docker stack's services restarted for ever)."""
    names = set(zipfile.ZipFile(wheel).namelist())
    source = ROOT / "service"
    packages = {p.parent.relative_to(source).as_posix() for p in source.rglob("__init__.py")}
    packages = {p for p in packages if not p.startswith("smartcache/devstack")}
    assert sorted(p for p in packages if f"{p}/__init__.py" not in names) == []


def test_the_client_installs_with_zeromq_and_msgpack_only(client_venv: Path) -> None:
    listing = subprocess.run(
        [str(client_venv / "bin" / "python"), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    installed = {d["name"].lower() for d in json.loads(listing)}
    assert {DISTRIBUTION, "pyzmq", "msgpack"} <= installed
    assert "smartcache" not in installed  # the package index's other project
    assert installed <= CLIENT_DISTRIBUTIONS, installed - CLIENT_DISTRIBUTIONS


CLIENT_SESSION = """
import asyncio, sys
import smartcache
from smartcache import AsyncClient, Client

endpoint = sys.argv[1]
print(smartcache.wire.REGISTRY_PATH)
with Client(endpoint, timeout_s=5, retries=2) as c:
    created = c.session_create("packaging-client", data={"step": 1})
    assert created.ok, created.body
    sid = created.session_id
    assert c.session_get(sid).body["data"] == {"step": 1}
    assert c.cache_put("wizard", {"amount": 10}, session_id=sid).ok
    assert c.cache_get("wizard", session_id=sid).body["data"] == {"amount": 10}
    assert c.cache_get("absent", session_id=sid).status == "NOT_FOUND"

async def main():
    c = AsyncClient(endpoint, timeout_s=5)
    try:
        got = await asyncio.gather(*(c.session_get(sid) for _ in range(10)))
        assert all(r.ok for r in got)
    finally:
        c.close()

asyncio.run(main())
print("client ok", sid)
"""


def test_a_fresh_client_only_venv_makes_real_calls(client_venv: Path, svc: Running, tmp_path: Path) -> None:
    """Blocking and asyncio calls against the service; the registry comes from the installed package."""
    out = subprocess.run(
        [str(client_venv / "bin" / "python"), "-c", CLIENT_SESSION, svc.endpoint],
        cwd=tmp_path,  # away from the source tree: nothing of it on sys.path
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    registry, verdict = out.stdout.splitlines()
    assert registry.startswith(str(client_venv))
    assert registry.endswith("smartcache/wire/spec/protocol.toml")
    assert verdict.startswith("client ok")


def test_the_cli_works_without_the_server_extra_and_says_what_cluster_needs(
    client_venv: Path, svc: Running, tmp_path: Path
) -> None:
    cli = str(client_venv / "bin" / "smartcache-cli")
    ping = subprocess.run([cli, "--endpoint", svc.endpoint, "ping"], capture_output=True, text=True, check=False)
    assert ping.returncode == 0, ping.stderr
    assert json.loads(ping.stdout)["status"] == "OK"
    cluster = subprocess.run([cli, "cluster", "status"], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert cluster.returncode == 5  # smartcache-cli's exit code for a missing package (cli/exits.py)
    assert json.loads(cluster.stdout)["error"] == "MISSING_PACKAGE"


def test_the_server_command_without_its_extra_names_the_extra(client_venv: Path, tmp_path: Path) -> None:
    server = subprocess.run(
        [str(client_venv / "bin" / "smartcache")], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert server.returncode == 2
    assert "pip install 'smartcache-bank[server]'" in server.stderr
