"""What stops a move, and the check every step's answer goes through."""

from __future__ import annotations

from typing import Any


class MoveError(Exception):
    """A move cannot go on: a shard without a leader, or a step refused; the message says which. A move given up
    leaves the bucket active where it was; one past the source's send_done is the settler's to finish."""


class NotSharded(MoveError):
    """The cluster has no bucket map: nothing moves (``cluster init --shards`` makes one)."""


def ok(result: dict[str, Any], what: str) -> dict[str, Any]:
    """A storage procedure's answer that must be OK; else MoveError naming the step and its status."""
    if result.get("status") != "OK":
        raise MoveError(f"{what}: {result.get('status')}: {result.get('message') or result}")
    return result
