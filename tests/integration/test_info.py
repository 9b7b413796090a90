"""`smartcache-cli info`: the service says what it is and does, like redis-cli INFO."""

from __future__ import annotations

import json
import subprocess
import sys

from smartcache.devstack.stack import Tarantool
from tests.conftest import running_service, service_settings


def test_info_shows_version_settings_without_secrets_queue_workers_storage_and_counts(storage: Tarantool) -> None:
    settings = service_settings(storage, tarantool_password="smartcache")
    with running_service(settings) as r:
        assert r.client.device_bind("dev-info", "client-info").ok
        out = subprocess.run(
            [sys.executable, "-m", "smartcache.cli", "--endpoint", r.endpoint, "info"],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert out.returncode == 0, out.stdout + out.stderr
    info = json.loads(out.stdout)
    assert info["status"] == "OK"
    assert info["version"]
    assert info["uptime_s"] >= 0
    assert info["settings"]["tarantool_password"] == "***"
    assert "smartcache" not in json.dumps(info["settings"]["tarantool_password"])
    assert info["settings"]["workers"] == settings.workers
    assert info["queue"]["capacity"] == settings.queue_capacity
    assert info["workers"]["slots"] == settings.workers
    assert info["workers"]["busy"] >= 1  # the INFO message itself
    (instance,) = info["storage"]
    assert (instance["address"], instance["state"], instance["leader"]) == (storage.address, "up", True)
    assert info["messages"]["device_bind"]["ok"] >= 1
    assert info["storage_stats"]["schema_version"] >= 2
    assert "device" in info["storage_stats"]["spaces"]
