"""Moved: the etcd client is :mod:`smartcache.ops.etcd` (issue 36). This name stays only while code outside the CLI
still imports it (make run's stack in smartcache.devstack, console/settings.py); import smartcache.ops.etcd instead.
"""

from smartcache.ops.etcd import (
    ASK_TIMEOUT_S,
    EtcdUnavailable,
    ask_member,
    create,
    endpoints_of,
    member_list,
    put_if,
    read,
    read_revision,
    status,
)

__all__ = [
    "ASK_TIMEOUT_S",
    "EtcdUnavailable",
    "ask_member",
    "create",
    "endpoints_of",
    "member_list",
    "put_if",
    "read",
    "read_revision",
    "status",
]
