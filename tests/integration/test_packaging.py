"""The client library works installed from a wheel, away from the source tree (the registry is package data)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_an_installed_wheel_finds_its_registry_without_the_source_tree(tmp_path: Path) -> None:
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(ROOT)], check=True)
    (wheel,) = wheels.glob("smartcache-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True)
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import service.protocol as p, service.client as c;"
        "print(p.__file__); print(p.REGISTRY_PATH); print(len(p.REGISTRY.types))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(target)], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.split()
    module, registry, types = out
    assert module.startswith(str(target))
    assert registry == str(target / "smartcache_proto" / "protocol.toml")
    assert int(types) > 10
