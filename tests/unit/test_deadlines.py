"""The deadline budget keeps the order its module states, and the storage side agrees with it."""

from __future__ import annotations

import re
from pathlib import Path

from smartcache.server import deadlines as d
from smartcache.wire import REGISTRY

ROOT = Path(__file__).resolve().parents[2]
LUA_CONFIG = ROOT / "lua" / "smartcache" / "config.lua"


def lua_constant(name: str) -> float:
    """``M.NAME = <number>`` in lua/smartcache/config.lua (the storage side of the budget)."""
    found = re.findall(rf"^M\.{name} = ([0-9.]+)\s*(?:--.*)?$", LUA_CONFIG.read_text(), re.M)
    assert len(found) == 1, f"{name}: expected one definition in {LUA_CONFIG}, found {found}"
    return float(found[0])


def test_the_storage_side_margins_are_the_ones_the_budget_names() -> None:
    assert lua_constant("ANSWER_MARGIN_S") == d.LUA_ANSWER_MARGIN_S
    assert lua_constant("WAIT_MARGIN_MS") / 1000 == d.LUA_WAIT_MARGIN_S


def test_a_waiting_handler_stops_before_storage_cuts_its_wait() -> None:
    """The handler's own TIMEOUT comes first; storage's cut is only the backstop."""
    assert 0 < d.LUA_WAIT_MARGIN_S < d.HANDLER_WAIT_MARGIN_S


def test_waits_for_storage_end_before_the_sweep_can_answer_for_them() -> None:
    """STORAGE_UNAVAILABLE and WRITE_PENDING, which say why, come before the sweep's EXPIRED."""
    assert d.STORAGE_ANSWER_MARGIN_S >= d.DEADLINE_SWEEP_S
    assert d.LUA_ANSWER_MARGIN_S >= d.DEADLINE_SWEEP_S
    assert d.HANDLER_WAIT_MARGIN_S < d.STORAGE_ANSWER_MARGIN_S


def test_the_worker_answers_a_late_message_long_before_the_watchdog_does() -> None:
    assert d.DEADLINE_SWEEP_S < d.WATCHDOG_PERIOD_S <= d.WATCHDOG_GRACE_S


def test_every_margin_is_small_beside_the_shortest_lifetime() -> None:
    """A margin is a sliver of a message's life: none may eat a tenth of the shortest one."""
    shortest_s = min(t.lifetime_ms for t in REGISTRY.types.values()) / 1000
    margins = (d.HANDLER_WAIT_MARGIN_S, d.STORAGE_ANSWER_MARGIN_S, d.LUA_ANSWER_MARGIN_S, d.DEADLINE_SWEEP_S)
    assert max(margins) <= shortest_s / 10


def test_the_process_waits_longer_than_each_part_may_take_to_stop() -> None:
    assert d.JOIN_MARGIN_S > d.STOP_GRACE_S > 0
    assert d.NO_DEADLINE_WAIT_S > d.STORAGE_ANSWER_MARGIN_S
