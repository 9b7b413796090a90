"""The Makefile is the front door: `make help` lists every target with its comment; `make reset-data` keeps .venv."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET = re.compile(r"^([a-zA-Z_-]+):(?!=)")  # a rule, not a := variable


def _make(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "-s", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def test_make_help_lists_every_target_with_its_comment() -> None:
    lines = (ROOT / "Makefile").read_text().splitlines()
    targets = [m.group(1) for line in lines if (m := TARGET.match(line)) and not line.startswith(".")]
    undocumented = [line for line in lines if TARGET.match(line) and "## " not in line]
    assert undocumented == []
    done = _make("help")
    assert done.returncode == 0
    listed = [line.split()[1] for line in done.stdout.splitlines()]
    assert sorted(listed) == sorted(targets)
    assert all(len(line.split()) > 2 for line in done.stdout.splitlines())  # each with its comment


def test_plain_make_prints_the_help() -> None:
    assert _make().stdout == _make("help").stdout


def test_make_reset_data_wipes_var_and_keeps_the_venv(tmp_path: Path) -> None:
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "var" / "master").mkdir(parents=True)
    (tmp_path / "var" / "master" / "00000000000000000000.snap").write_text("data")
    (tmp_path / "var" / "service.log").write_text("{}\n")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").write_text("")
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "constraints.txt").write_text("")
    done = _make("reset-data", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "var").exists()
    assert (tmp_path / ".venv" / "bin" / "python").exists()
