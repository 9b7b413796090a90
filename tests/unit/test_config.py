"""Settings come from the environment only, with named defaults and precise errors."""

import pytest

from service.config import DEFAULT_QUEUE_CAPACITY, DEFAULT_WORKERS, Settings, SettingsError


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
    ("env", "names"),
    [
        ({"SMARTCACHE_WORKERS": "many"}, "SMARTCACHE_WORKERS"),
        ({"SMARTCACHE_WORKERS": "0"}, "SMARTCACHE_WORKERS"),
        ({"SMARTCACHE_QUEUE_CAPACITY": "-1"}, "SMARTCACHE_QUEUE_CAPACITY"),
        ({"SMARTCACHE_BULKHEADS": "NOPE=3"}, "SMARTCACHE_BULKHEADS"),
        ({"SMARTCACHE_BULKHEADS": "CACHE_GET=0"}, "SMARTCACHE_BULKHEADS"),
        ({"SMARTCACHE_LOG_LEVEL": "loud"}, "SMARTCACHE_LOG_LEVEL"),
        ({"SMARTCACHE_PREWARM_TYPES": "1,x"}, "SMARTCACHE_PREWARM_TYPES"),
        ({"SMARTCACHE_PRODUCTS_MAX_AGE": "1"}, "SMARTCACHE_PRODUCTS_MAX_AGE"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], names: str) -> None:
    with pytest.raises(SettingsError, match=names):
        Settings.from_env(env)


def test_lease_outlives_a_backend_call_with_its_retries() -> None:
    s = Settings.from_env({"SMARTCACHE_BACKEND_TIMEOUT_S": "2", "SMARTCACHE_BACKEND_RETRIES": "1"})
    assert s.lease_ms > 2 * 2000
