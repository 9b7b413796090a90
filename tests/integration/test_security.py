"""CURVE on the client socket, per-key permissions, abuse limits, secrets and production mode."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import zmq
import zmq.auth

from smartcache.client import Client, CurveKeys
from smartcache.devstack.stack import Tarantool, free_port
from smartcache.wire.errors import RequestError, RequestTimeout
from smartcache.wire.keys import create_key_pair
from tests.conftest import Running, running_service, service_settings
from tests.helpers import eventually, metric


@dataclasses.dataclass
class Keys:
    server: Path  # the service's pair (.key_secret) and public (.key)
    clients: Path  # the allow-list directory
    spare: Path  # client pairs not (yet) in the allow-list

    def client(self, name: str, permissions: str | None = None, *, allowed: bool = True) -> CurveKeys:
        """A client key pair; its public key is put in the allow-list unless allowed=False."""
        _, secret = create_key_pair(self.spare, name, permissions)
        if allowed:
            self.allow(name)
        return CurveKeys.from_files(self.server / "smartcache.key", secret)

    def allow(self, name: str) -> None:
        (self.clients / f"{name}.key").write_text((self.spare / f"{name}.key").read_text())

    def revoke(self, name: str) -> None:
        (self.clients / f"{name}.key").unlink()


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    k = Keys(tmp_path / "server", tmp_path / "clients", tmp_path / "spare")
    for d in (k.server, k.clients, k.spare):
        d.mkdir()
    zmq.auth.create_certificates(k.server, "smartcache")
    return k


@pytest.fixture
def curve_svc(storage: Tarantool, keys: Keys) -> Iterator[Running]:
    settings = service_settings(
        storage,
        curve_secret_key_file=str(keys.server / "smartcache.key_secret"),
        curve_clients_dir=str(keys.clients),
    )
    # The fixture's own client is plain text: it must not get through (checked below).
    with running_service(settings) as r:
        yield r


def test_a_client_with_an_allowed_key_is_served(curve_svc: Running, keys: Keys) -> None:
    with Client(curve_svc.endpoint, curve=keys.client("front-1"), timeout_s=5) as c:
        sid = c.session_create("client-curve").session_id
        assert c.session_get(sid).ok


def test_unknown_key_plain_text_and_wrong_server_key_get_nothing_processed(curve_svc: Running, keys: Keys) -> None:
    before = metric(curve_svc.metrics_url, "smartcache_messages_total")
    unknown = keys.client("stranger", allowed=False)
    wrong_server = dataclasses.replace(keys.client("front-2"), server_public=zmq.curve_keypair()[0])
    for curve in (unknown, None, wrong_server):
        with Client(curve_svc.endpoint, curve=curve, timeout_s=1) as c, pytest.raises(RequestTimeout):
            c.ping()
    assert metric(curve_svc.metrics_url, "smartcache_messages_total") == before  # not one frame processed
    assert metric(curve_svc.metrics_url, "smartcache_auth_failures_total", {"reason": "unknown_key"}) >= 1
    eventually(lambda: metric(curve_svc.metrics_url, "smartcache_auth_failures_total", {"reason": "handshake"}) >= 1)


def test_a_read_only_key_is_forbidden_to_write(curve_svc: Running, keys: Keys) -> None:
    with Client(curve_svc.endpoint, curve=keys.client("reader", "@read"), timeout_s=5) as c:
        assert c.device_lookup("dev-ro").status == "NOT_FOUND"
        with pytest.raises(RequestError) as e:
            c.device_bind("dev-ro", "client-ro")
        assert e.value.transport_error == "FORBIDDEN"
        with pytest.raises(RequestError) as e:
            c.info()  # @operator only
        assert e.value.transport_error == "FORBIDDEN"
        assert c.ping().ok  # always allowed


def test_removing_a_key_stops_it_at_once_and_adding_one_keeps_other_clients(curve_svc: Running, keys: Keys) -> None:
    with (
        Client(curve_svc.endpoint, curve=keys.client("stays"), timeout_s=5) as stays,
        Client(curve_svc.endpoint, curve=keys.client("goes"), timeout_s=5) as goes,
    ):
        assert stays.ping().ok
        assert goes.ping().ok
        keys.revoke("goes")
        curve_svc.service.reload_keys()  # what SIGHUP does (the process test below sends a real one)
        with pytest.raises(RequestError) as e:
            goes.device_lookup("d")
        assert e.value.transport_error == "FORBIDDEN"  # its open connection no longer carries a valid key
        late = keys.client("late", allowed=False)
        keys.allow("late")
        curve_svc.service.reload_keys()
        with Client(curve_svc.endpoint, curve=late, timeout_s=5) as c:
            assert c.device_lookup("d").status == "NOT_FOUND"
        assert stays.device_lookup("d").status == "NOT_FOUND"  # never dropped


def test_sighup_reloads_the_keys_of_the_real_process(storage: Tarantool, keys: Keys, tmp_path: Path) -> None:
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SMARTCACHE_")},
        "SMARTCACHE_LISTEN": f"tcp://127.0.0.1:{port}",
        "SMARTCACHE_TARANTOOL": storage.address,
        "SMARTCACHE_METRICS_PORT": "0",
        "SMARTCACHE_CURVE_SECRET_KEY_FILE": str(keys.server / "smartcache.key_secret"),
        "SMARTCACHE_CURVE_CLIENTS_DIR": str(keys.clients),
    }
    first = keys.client("first")
    log_path = tmp_path / "svc.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "smartcache.server"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        endpoint = f"tcp://127.0.0.1:{port}"
        with Client(endpoint, curve=first, timeout_s=1) as c:
            eventually(lambda: _answers(c), timeout_s=20, what="service up")
            second = keys.client("second", allowed=False)
            keys.allow("second")
            os.kill(proc.pid, signal.SIGHUP)
            with Client(endpoint, curve=second, timeout_s=1) as c2:
                eventually(lambda: _answers(c2), what="new key accepted after SIGHUP")
            assert c.ping().ok
        assert b"client_keys_loaded" in log_path.read_bytes()
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 0


def _answers(c: Client) -> bool:
    try:
        return c.ping().ok
    except RequestError:
        return False


# -- abuse limits ----------------------------------------------------------------------


def test_garbage_at_full_speed_is_answered_at_a_bounded_rate_and_others_are_still_served(storage: Tarantool) -> None:
    settings = service_settings(storage, bad_input_per_peer_per_s=50, bad_input_per_s=1000)
    with running_service(settings) as r:
        ctx = zmq.Context.instance()
        flood = ctx.socket(zmq.DEALER)
        flood.setsockopt(zmq.LINGER, 0)
        flood.connect(r.endpoint)
        try:
            for _ in range(2000):
                flood.send_multipart([b"garbage", b""])
            assert r.client.device_lookup("still-served").status == "NOT_FOUND"
            eventually(lambda: metric(r.metrics_url, "smartcache_bad_input_total", {"error": "bad_header"}) == 2000)
            answered = 0
            while flood.poll(200):
                flood.recv_multipart()
                answered += 1
        finally:
            flood.close()
        assert 0 < answered <= 200  # a burst of 50, then 50/s: far fewer than 2000
        assert metric(r.metrics_url, "smartcache_bad_input_throttled_total") == 2000 - answered


# -- secrets and production mode ---------------------------------------------------------


def test_secrets_never_appear_in_logs_info_metrics_or_the_process_title(storage: Tarantool, tmp_path: Path) -> None:
    secret_file = tmp_path / "metrics.token"
    secret_file.write_text("t0ken-never-shown\n")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SMARTCACHE_")},
        "SMARTCACHE_LISTEN": f"tcp://127.0.0.1:{free_port()}",
        "SMARTCACHE_TARANTOOL": storage.address,
        "SMARTCACHE_METRICS_PORT": str(free_port()),
        "SMARTCACHE_METRICS_TOKEN_FILE": str(secret_file),
    }
    log_path = tmp_path / "svc.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "smartcache.server"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        endpoint, metrics = env["SMARTCACHE_LISTEN"], f"http://127.0.0.1:{env['SMARTCACHE_METRICS_PORT']}/metrics"
        with Client(endpoint, timeout_s=1) as c:
            eventually(lambda: _answers(c), timeout_s=20, what="service up")
            info = json.dumps(c.info().body)
        assert httpx.get(metrics).status_code == 401
        scraped = httpx.get(metrics, headers={"Authorization": "Bearer t0ken-never-shown"})
        assert scraped.status_code == 200
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(30)
    for where, text in (("log", log_path.read_text()), ("info", info), ("metrics", scraped.text), ("argv", cmdline)):
        assert "t0ken-never-shown" not in str(text), where
    assert '"metrics_token": "***"' in info


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({}, "SMARTCACHE_TARANTOOL_PASSWORD"),
        ({"SMARTCACHE_TARANTOOL_PASSWORD": "real"}, "SMARTCACHE_CURVE_SECRET_KEY_FILE"),
        (
            {"SMARTCACHE_TARANTOOL_PASSWORD": "real", "SMARTCACHE_INSECURE": "1", "SMARTCACHE_METRICS_ADDR": "0.0.0.0"},
            "SMARTCACHE_METRICS_TOKEN",
        ),
    ],
    ids=["default password", "no CURVE", "metrics exposed without a token"],
)
def test_production_mode_refuses_each_unsafe_default(env: dict[str, str], named: str) -> None:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SMARTCACHE_")}
    full.update({"SMARTCACHE_ENV": "production", "SMARTCACHE_METRICS_PORT": "0", **env})
    done = subprocess.run(
        [sys.executable, "-m", "smartcache.server"], env=full, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 2
    assert "bad_settings" in done.stdout
    assert named in done.stdout


def test_production_mode_starts_when_everything_is_set(storage: Tarantool, keys: Keys) -> None:
    settings = service_settings(
        storage,
        env="production",
        tarantool_password="smartcache",  # the test instance's; production refuses it only from the environment
        curve_secret_key_file=str(keys.server / "smartcache.key_secret"),
        curve_clients_dir=str(keys.clients),
    )
    with running_service(settings) as r, Client(r.endpoint, curve=keys.client("prod"), timeout_s=5) as c:
        assert c.ping().ok
