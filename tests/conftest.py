"""Fixtures: one per real component, started on free 127.0.0.1 ports and stopped by PID."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import tarantool

from service.devstack import Tarantool


@contextlib.contextmanager
def connect(instance: Tarantool, user: str = "smartcache", password: str = "smartcache") -> Iterator[tarantool.Connection]:
    """A connector connection as the service user (execute on procedures only), closed after use."""
    conn = tarantool.connect("127.0.0.1", instance.port, user=user, password=password)
    try:
        yield conn
    finally:
        conn.close()


def call(conn: tarantool.Connection, proc: str, *args: object) -> dict:
    """Call a stored procedure; returns its result map."""
    return conn.call(f"sc.{proc}", list(args)).data[0]


@pytest.fixture(scope="session")
def storage_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Tarantool, Tarantool]]:
    """A master and a read-only replica replicating from it."""
    base = tmp_path_factory.mktemp("pair")
    master = Tarantool.create("master", base)
    replica = Tarantool.create("replica", base, read_only=True, replication=[master.address])
    try:
        master.start()
        master.wait_ready()
        replica.start()
        replica.wait_ready()
        yield master, replica
    finally:
        replica.stop()
        master.stop()


@pytest.fixture
def fresh_master(tmp_path: Path) -> Iterator[Tarantool]:
    """A master of its own, for tests that stop or break it."""
    master = Tarantool.create("master", tmp_path)
    try:
        master.start()
        master.wait_ready()
        yield master
    finally:
        master.stop()
