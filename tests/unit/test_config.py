"""Settings come from the environment only, with named defaults and precise errors."""

from pathlib import Path

import pytest
import zmq.auth

from smartcache.server.config import DEFAULT_QUEUE_CAPACITY, DEFAULT_WORKERS, Settings, unknown_variables
from smartcache.settings import SettingsError


def test_defaults_without_environment() -> None:
    s = Settings.from_env({})
    assert (s.workers, s.queue_capacity, s.listen, s.tarantool) == (
        DEFAULT_WORKERS,
        DEFAULT_QUEUE_CAPACITY,
        "tcp://127.0.0.1:5555",
        ("127.0.0.1:3301",),
    )
    assert s.bulkheads["SESSION_GET"] == DEFAULT_WORKERS
    assert s.bulkheads["PRODUCTS_GET"] == DEFAULT_WORKERS // 2


def test_values_are_read_and_bulkheads_overridden() -> None:
    s = Settings.from_env(
        {
            "SMARTCACHE_WORKERS": "10",
            "SMARTCACHE_BULKHEADS": "PRODUCTS_GET=3, CACHE_GET=7",
            "SMARTCACHE_TARANTOOL": "10.0.0.1:3301, 10.0.0.2:3301",
            "SMARTCACHE_PRODUCTS_MAX_AGE": "1=60,2=600",
            "SMARTCACHE_PREWARM_TYPES": "1,2",
        }
    )
    assert (s.bulkheads["PRODUCTS_GET"], s.bulkheads["CACHE_GET"], s.bulkheads["APP_START"]) == (3, 7, 2)
    assert s.tarantool == ("10.0.0.1:3301", "10.0.0.2:3301")
    assert (s.max_age_ms(1), s.max_age_ms(2), s.max_age_ms(3)) == (60_000, 600_000, 300_000)
    assert s.prewarm_types == (1, 2)


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("SMARTCACHE_METRICS_PORT", "0", 0),  # any free port
        ("SMARTCACHE_METRICS_PORT", "65535", 65535),
        ("SMARTCACHE_METRICS_ADDR", "::", "::"),
        ("SMARTCACHE_METRICS_ADDR", "metrics.internal", "metrics.internal"),
        ("SMARTCACHE_LISTEN", "tcp://*:5555", "tcp://*:5555"),
        ("SMARTCACHE_LISTEN", "tcp://127.0.0.1:*", "tcp://127.0.0.1:*"),
        ("SMARTCACHE_LISTEN", "tcp://[::1]:5555", "tcp://[::1]:5555"),
        ("SMARTCACHE_LISTEN", "tcp://eth0:5555", "tcp://eth0:5555"),
        ("SMARTCACHE_LISTEN", "ipc:///tmp/smartcache.sock", "ipc:///tmp/smartcache.sock"),
        ("SMARTCACHE_LISTEN", "ipc://@smartcache", "ipc://@smartcache"),
        ("SMARTCACHE_TARANTOOL", "tarantool-1:3301,[::1]:3302", ("tarantool-1:3301", "[::1]:3302")),
        ("SMARTCACHE_BACKEND_URL", "https://core.bank.example:8443/api/", "https://core.bank.example:8443/api/"),
        (
            "SMARTCACHE_BACKEND_TEMPLATE",
            "{base}/p?client={client_id}&t={data_type}",
            "{base}/p?client={client_id}&t={data_type}",
        ),
        ("SMARTCACHE_LOG_LEVEL", "DEBUG", "debug"),
        ("SMARTCACHE_INSTANCE_ID", "pod-7.zone_a:1", "pod-7.zone_a:1"),
        ("SMARTCACHE_WORKER_THREADS", "100", 100),
        ("SMARTCACHE_DRAIN_TIMEOUT_S", "0", 0.0),
        ("SMARTCACHE_PROCESSES", "4", 4),
        ("SMARTCACHE_ROUTING_HOPS", "2", 2),
    ],
)
def test_good_values_are_accepted(name: str, value: str, expected: object) -> None:
    assert getattr(Settings.from_env({name: value}), name.removeprefix("SMARTCACHE_").lower()) == expected


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"SMARTCACHE_WORKERS": "many"}, "SMARTCACHE_WORKERS"),
        ({"SMARTCACHE_WORKERS": "0"}, "SMARTCACHE_WORKERS"),
        ({"SMARTCACHE_QUEUE_CAPACITY": "-1"}, "SMARTCACHE_QUEUE_CAPACITY"),
        ({"SMARTCACHE_BULKHEADS": "NOPE=3"}, "SMARTCACHE_BULKHEADS"),
        ({"SMARTCACHE_BULKHEADS": "CACHE_GET=0"}, "SMARTCACHE_BULKHEADS"),
        ({"SMARTCACHE_LOG_LEVEL": "loud"}, "SMARTCACHE_LOG_LEVEL"),
        ({"SMARTCACHE_PREWARM_TYPES": "1,x"}, "SMARTCACHE_PREWARM_TYPES"),
        ({"SMARTCACHE_PREWARM_TYPES": "1,1"}, "SMARTCACHE_PREWARM_TYPES"),
        ({"SMARTCACHE_PREWARM_TYPES": "0"}, "SMARTCACHE_PREWARM_TYPES"),
        ({"SMARTCACHE_PRODUCTS_MAX_AGE": "1"}, "SMARTCACHE_PRODUCTS_MAX_AGE"),
        ({"SMARTCACHE_PRODUCTS_MAX_AGE": "1=-5"}, "SMARTCACHE_PRODUCTS_MAX_AGE"),
        ({"SMARTCACHE_METRICS_PORT": "99999"}, "SMARTCACHE_METRICS_PORT"),
        ({"SMARTCACHE_METRICS_PORT": "-1"}, "SMARTCACHE_METRICS_PORT"),
        ({"SMARTCACHE_METRICS_PORT": "http"}, "SMARTCACHE_METRICS_PORT"),
        ({"SMARTCACHE_METRICS_ADDR": "not an address"}, "SMARTCACHE_METRICS_ADDR"),
        ({"SMARTCACHE_LISTEN": "127.0.0.1:5555"}, "SMARTCACHE_LISTEN"),
        ({"SMARTCACHE_LISTEN": "udp://127.0.0.1:5555"}, "SMARTCACHE_LISTEN"),
        ({"SMARTCACHE_LISTEN": "tcp://127.0.0.1"}, "SMARTCACHE_LISTEN"),
        ({"SMARTCACHE_LISTEN": "tcp://127.0.0.1:70000"}, "SMARTCACHE_LISTEN"),
        ({"SMARTCACHE_LISTEN": "ipc:///no/such/directory/s.sock"}, "SMARTCACHE_LISTEN"),
        ({"SMARTCACHE_LISTEN": "ipc:///tmp/" + "x" * 120}, "SMARTCACHE_LISTEN"),
        ({"SMARTCACHE_TARANTOOL": "127.0.0.1"}, "SMARTCACHE_TARANTOOL"),
        ({"SMARTCACHE_TARANTOOL": "127.0.0.1:3301,127.0.0.1:0"}, "SMARTCACHE_TARANTOOL"),
        ({"SMARTCACHE_TARANTOOL": ","}, "SMARTCACHE_TARANTOOL"),
        ({"SMARTCACHE_BACKEND_URL": "ftp://core:21"}, "SMARTCACHE_BACKEND_URL"),
        ({"SMARTCACHE_BACKEND_URL": "core.bank:8080"}, "SMARTCACHE_BACKEND_URL"),
        ({"SMARTCACHE_BACKEND_URL": "http://core:99999"}, "SMARTCACHE_BACKEND_URL"),
        ({"SMARTCACHE_BACKEND_TEMPLATE": "{base}/clients/{client_id}"}, "SMARTCACHE_BACKEND_TEMPLATE"),
        ({"SMARTCACHE_BACKEND_TEMPLATE": "{base}/{client_id}/{data_type}/{tenant}"}, "SMARTCACHE_BACKEND_TEMPLATE"),
        ({"SMARTCACHE_DRAIN_TIMEOUT_S": "nan"}, "SMARTCACHE_DRAIN_TIMEOUT_S"),
        ({"SMARTCACHE_DRAIN_TIMEOUT_S": "inf"}, "SMARTCACHE_DRAIN_TIMEOUT_S"),
        ({"SMARTCACHE_STORAGE_CONNECT_TIMEOUT_S": "0"}, "SMARTCACHE_STORAGE_CONNECT_TIMEOUT_S"),
        ({"SMARTCACHE_BACKEND_RETRIES": "-1"}, "SMARTCACHE_BACKEND_RETRIES"),
        ({"SMARTCACHE_BACKEND_MAX_CONNECTIONS": "0"}, "SMARTCACHE_BACKEND_MAX_CONNECTIONS"),
        ({"SMARTCACHE_MAX_BODY_BYTES": "2000000"}, "SMARTCACHE_MAX_BODY_BYTES"),
        ({"SMARTCACHE_WORKERS": "4", "SMARTCACHE_WORKER_THREADS": "8"}, "SMARTCACHE_WORKER_THREADS"),
        ({"SMARTCACHE_INSTANCE_ID": "a/b"}, "SMARTCACHE_INSTANCE_ID"),
        ({"SMARTCACHE_PROCESSES": "0"}, "SMARTCACHE_PROCESSES"),
        ({"SMARTCACHE_PROCESSES": "65"}, "SMARTCACHE_PROCESSES"),
        ({"SMARTCACHE_PROCESSES": "two"}, "SMARTCACHE_PROCESSES"),
        ({"SMARTCACHE_ROUTING_HOPS": "3"}, "SMARTCACHE_ROUTING_HOPS"),
        ({"SMARTCACHE_INSTANCE_ID": "x" * 129}, "SMARTCACHE_INSTANCE_ID"),
        ({"SMARTCACHE_CLUSTER": "prod"}, "SMARTCACHE_CLUSTER needs SMARTCACHE_ETCD"),
        ({"SMARTCACHE_CLUSTER": "a/b", "SMARTCACHE_ETCD": "http://etcd:2379"}, "SMARTCACHE_CLUSTER"),
        ({"SMARTCACHE_CLUSTER": "prod", "SMARTCACHE_ETCD": "ftp://etcd:2379"}, "SMARTCACHE_ETCD"),
        ({"SMARTCACHE_CLUSTER": "prod", "SMARTCACHE_ETCD": "http://etcd"}, "SMARTCACHE_ETCD"),
        ({"SMARTCACHE_CLUSTER": "prod", "SMARTCACHE_ETCD": "http://etcd:2379/v3"}, "SMARTCACHE_ETCD"),
        # a prewarm lease must outlive the backend call with its retries, and Tarantool grants at most 60 s
        ({"SMARTCACHE_BACKEND_TIMEOUT_S": "30", "SMARTCACHE_BACKEND_RETRIES": "2"}, "SMARTCACHE_BACKEND_RETRIES"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], names: str) -> None:
    with pytest.raises(SettingsError, match=names):
        Settings.from_env(env)


def test_every_bad_variable_is_named_at_once() -> None:
    with pytest.raises(SettingsError) as e:
        Settings.from_env({"SMARTCACHE_METRICS_PORT": "99999", "SMARTCACHE_LISTEN": "127.0.0.1:5555"})
    assert "SMARTCACHE_METRICS_PORT='99999'" in str(e.value)
    assert "SMARTCACHE_LISTEN='127.0.0.1:5555'" in str(e.value)


def test_empty_value_means_the_default() -> None:
    assert Settings.from_env({"SMARTCACHE_METRICS_PORT": ""}).metrics_port == 9105


def test_lease_outlives_a_backend_call_with_its_retries() -> None:
    s = Settings.from_env({"SMARTCACHE_BACKEND_TIMEOUT_S": "2", "SMARTCACHE_BACKEND_RETRIES": "1"})
    assert s.lease_ms > 2 * 2000


def test_redacted_hides_secrets_and_shows_the_rest() -> None:
    s = Settings.from_env({"SMARTCACHE_TARANTOOL_PASSWORD": "hunter2-secret", "SMARTCACHE_WORKERS": "7"})
    shown = s.redacted()
    assert shown["tarantool_password"] == "***"
    assert "hunter2-secret" not in repr(shown)
    assert (shown["workers"], shown["tarantool_user"]) == (7, "smartcache")


def test_unknown_smartcache_variables_are_reported() -> None:
    env = {"SMARTCACHE_WORKER": "5", "SMARTCACHE_WORKERS": "5", "SMARTCACHE_ENDPOINT": "tcp://x:1", "HOME": "/root"}
    assert unknown_variables(env) == ["SMARTCACHE_WORKER"]


def test_redacted_says_which_secrets_are_unset() -> None:
    """INFO and the start-up log show "unset" for an empty secret and "***" for a set one, never a value."""
    shown = Settings.from_env({"SMARTCACHE_METRICS_TOKEN": "t0ken"}).redacted()
    assert shown["metrics_token"] == "***"
    assert shown["curve_secret_key_file"] == "unset"


def test_discovery_takes_the_etcd_endpoints_and_the_cluster_and_no_default_instance() -> None:
    s = Settings.from_env({"SMARTCACHE_ETCD": "etcd-1:2379, http://etcd-2:2379/", "SMARTCACHE_CLUSTER": "prod"})
    assert s.discovery
    assert (s.etcd, s.cluster, s.tarantool) == (("http://etcd-1:2379", "http://etcd-2:2379"), "prod", ())


def test_with_discovery_a_static_list_is_what_the_service_starts_with() -> None:
    s = Settings.from_env(
        {"SMARTCACHE_ETCD": "http://etcd:2379", "SMARTCACHE_CLUSTER": "prod", "SMARTCACHE_TARANTOOL": "t1:3301"}
    )
    assert (s.discovery, s.tarantool) == (True, ("t1:3301",))


def test_smartcache_etcd_alone_is_the_clis_and_changes_nothing_for_the_service() -> None:
    s = Settings.from_env({"SMARTCACHE_ETCD": "not even a url"})
    assert (s.discovery, s.etcd, s.tarantool) == (False, (), ("127.0.0.1:3301",))
    assert unknown_variables({"SMARTCACHE_ETCD": "x", "SMARTCACHE_CLUSTER": ""}) == []


def test_curve_with_more_than_one_process_is_refused_naming_both_settings(tmp_path: Path) -> None:
    _, secret = zmq.auth.create_certificates(str(tmp_path), "server")
    env = {"SMARTCACHE_CURVE_SECRET_KEY_FILE": secret, "SMARTCACHE_CURVE_CLIENTS_DIR": str(tmp_path)}
    assert Settings.from_env({**env, "SMARTCACHE_PROCESSES": "1"}).curve
    with pytest.raises(SettingsError) as e:
        Settings.from_env({**env, "SMARTCACHE_PROCESSES": "2"})
    assert "SMARTCACHE_PROCESSES=2 (--processes) with SMARTCACHE_CURVE_SECRET_KEY_FILE" in str(e.value)


KEY_HEX = "5e" * 32


def test_the_session_key_is_read_from_the_variable_or_its_file(tmp_path: Path) -> None:
    key_file = tmp_path / "session.key"
    key_file.write_text(KEY_HEX.upper() + "\n")
    assert Settings.from_env({"SMARTCACHE_SESSION_KEY": KEY_HEX}).session_key == bytes.fromhex(KEY_HEX)
    assert Settings.from_env({"SMARTCACHE_SESSION_KEY_FILE": str(key_file)}).derive_key == bytes.fromhex(KEY_HEX)


def test_without_a_session_key_the_all_zero_key_is_used_outside_production() -> None:
    s = Settings.from_env({})
    assert (s.session_key, s.derive_key, s.session_rekey) == (b"", bytes(32), "off")


@pytest.mark.parametrize("bad", ["abc", "zz" * 32, "5e" * 33], ids=["short", "not hex", "long"])
def test_a_bad_session_key_is_named_and_never_shown(bad: str) -> None:
    with pytest.raises(SettingsError) as e:
        Settings.from_env({"SMARTCACHE_SESSION_KEY": bad})
    assert "SMARTCACHE_SESSION_KEY" in str(e.value)
    assert bad not in str(e.value)


def test_the_session_key_is_never_shown_in_the_settings_log_info_or_repr() -> None:
    s = Settings.from_env({"SMARTCACHE_SESSION_KEY": KEY_HEX, "SMARTCACHE_SESSION_REKEY": "lazy"})
    shown = s.redacted()
    assert (shown["session_key"], shown["session_rekey"]) == ("***", "lazy")  # the mode is no secret
    assert Settings.from_env({}).redacted()["session_key"] == "unset"
    assert KEY_HEX not in repr(s)
    assert KEY_HEX not in str(shown)
    assert repr(bytes.fromhex(KEY_HEX)) not in repr(s)


@pytest.mark.parametrize(
    ("key", "named"),
    [(None, "SESSION_KEY (or _FILE) is unset"), ("00" * 32, "SESSION_KEY is all zeros")],
    ids=["unset", "all zeros"],
)
def test_production_refuses_to_start_without_a_real_session_key(key: str | None, named: str) -> None:
    env = {"SMARTCACHE_ENV": "production", "SMARTCACHE_TARANTOOL_PASSWORD": "real", "SMARTCACHE_INSECURE": "1"}
    if key is not None:
        env["SMARTCACHE_SESSION_KEY"] = key
    with pytest.raises(SettingsError) as e:
        Settings.from_env(env)
    assert named in str(e.value)
    assert Settings.from_env({**env, "SMARTCACHE_SESSION_KEY": KEY_HEX}).env == "production"


def test_session_rekey_is_off_or_lazy() -> None:
    with pytest.raises(SettingsError, match="SMARTCACHE_SESSION_REKEY='eager': must be one of off, lazy"):
        Settings.from_env({"SMARTCACHE_SESSION_REKEY": "eager"})
