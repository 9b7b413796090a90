"""The README's Python example runs as a newcomer would paste it: against a running service, unchanged
but for the endpoint line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import Running

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readmes_client_example_runs_against_the_service(svc: Running, tmp_path: Path) -> None:
    (example,) = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    # its endpoint line is make run's port moved by SMARTCACHE_PORT_OFFSET (tests/unit/test_docs.py checks it)
    (line,) = [line for line in example.splitlines() if line.startswith("ENDPOINT = ")]
    script = tmp_path / "example.py"
    (events,) = [line for line in example.splitlines() if line.startswith("EVENTS = ")]
    assert svc.service.events is not None
    example = example.replace(events, f"EVENTS = {svc.service.events.endpoint!r}")
    script.write_text(example.replace(line, f"ENDPOINT = {svc.endpoint!r}"))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "{'step': 1}"
    assert lines[1] == "{'amount': 100, 'to': 'DE89...'}"
    assert lines[2] == "no wizard state yet"
    assert lines[3] == "{'step': 1}"
    assert lines[4] == "[" + ", ".join(["<Status.OK: 'OK'>"] * 10) + "]"
