"""The Lua modules require one another in the declared directions, as the Python import contracts do.

Every ``require('smartcache...')`` under lua/ is read (comments and strings other than the argument
skipped) and checked against the layout below, which lua/README.md draws:

- **core** modules (``CORE``) require only core modules: everything stands on them;
- a **room** (``ROOMS``: ``smartcache/<room>/``) is reached from outside only through its facade,
  ``smartcache/<room>.lua``. Its modules require core modules, their own room's modules, and the
  facades of the rooms it is declared to use (``ROOMS[room]``, a graph without cycles); never their
  own facade (a load cycle) and never the instance;
- a facade requires its room's modules, core modules and the facades its room may use;
- the **instance** (``INSTANCE``: the registration point api.lua and its api/ folder, run time,
  stats, expiry, the operator HTTP) wires the rooms together: core modules, facades, one another;
  api/'s modules only from api.lua and api/;
- init.lua, the entry point, requires what the instance may, and nobody requires it.

A module that is in none of these (a new file) fails too: put it in a room, or declare it here.
Reads files only; the unit tests run it (``make test-unit``, ``make test``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LUA = ROOT / "lua"

#: the modules every other stands on
CORE = frozenset(
    {"util", "config", "compat", "schema", "quorum", "memory", "disk", "digest", "etcd", "idempotency", "audit"}
)
#: what wires the rooms into one instance (api's own folder, api/, belongs to it)
INSTANCE = frozenset({"api", "runtime", "stats", "expiry", "http"})
#: each room, and the rooms whose facades its modules may require
ROOMS: dict[str, frozenset[str]] = {
    "events": frozenset(),
    "sharding": frozenset({"events"}),
    "sessions": frozenset({"sharding", "events"}),
    "coordination": frozenset({"sharding"}),
    "failover": frozenset(),
}

REQUIRE = re.compile(r"""\brequire\s*\(?\s*(['"])(smartcache(?:\.\w+)*)\1""")


@dataclass(frozen=True)
class Module:
    name: str  # smartcache.sessions.reads, or init
    kind: str  # core, instance, api (api/'s modules), facade, room, entry
    room: str | None = None


def classify(name: str) -> Module | None:
    """Where a module stands, or None when the layout does not declare it."""
    if name == "init":
        return Module(name, "entry")
    parts = name.split(".")
    if parts[0] != "smartcache" or len(parts) < 2:
        return None
    first = parts[1]
    if len(parts) == 2:
        if first in CORE:
            return Module(name, "core")
        if first in INSTANCE:
            return Module(name, "instance")
        if first in ROOMS:
            return Module(name, "facade", first)
        return None
    if first == "api":
        return Module(name, "api")
    if first in ROOMS:
        return Module(name, "room", first)
    return None


def module_name(path: Path) -> str:
    rel = path.relative_to(LUA).with_suffix("")
    return "init" if rel == Path("init") else ".".join(rel.parts)


LONG_BRACKET = re.compile(r"(--)?\[(=*)\[")  # a long comment, or a long string
REQUIRE_CALL = re.compile(r"\brequire\s*\(?\s*$")  # what comes just before a require's argument


def code_only(text: str) -> str:
    """The text with comments and long strings blanked, and every string blanked but a require's argument.

    Line breaks are kept, so that a position in it is on the same line as in the file."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        long = LONG_BRACKET.match(text, i)
        if long or text.startswith("--", i):
            if long:
                close = text.find(f"]{long.group(2)}]", i)
                end = n if close < 0 else close + len(long.group(2)) + 2
            else:
                end = text.find("\n", i)
                end = n if end < 0 else end
            out.append("\n" * text.count("\n", i, end))
            i = end
        elif text[i] in "'\"":
            quote, j = text[i], i + 1
            while j < n and text[j] not in (quote, "\n"):
                j += 2 if text[j] == "\\" else 1
            argument = REQUIRE_CALL.search("".join(out[-12:])) is not None
            out.append(text[i : j + 1] if argument else quote * 2)
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def requires(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every require of a smartcache module in the file."""
    text = code_only(path.read_text())
    return [(text.count("\n", 0, m.start()) + 1, m.group(2)) for m in REQUIRE.finditer(text)]


def lua_files() -> list[Path]:
    return sorted(LUA.rglob("*.lua"))


def why_not(importer: Module, imported: Module) -> str | None:
    """None when importer may require imported; else the direction it breaks."""
    kind, room = imported.kind, imported.room
    if imported.kind == "entry":
        return "nothing requires the entry point"
    if importer.kind == "core":
        return None if kind == "core" else "a core module requires only core modules"
    if importer.kind == "room":
        assert importer.room is not None
        if kind == "core" or (kind == "room" and room == importer.room):
            return None
        if kind == "facade" and room == importer.room:
            return f"a module of {importer.room}/ requires its neighbours, not its own facade (a load cycle)"
        if kind == "facade" and room in ROOMS[importer.room]:
            return None
        if kind == "room":
            return f"{room}/'s modules are reached through its facade, smartcache.{room}"
        if kind == "facade":
            return f"{importer.room}/ is not declared to use {room} (ROOMS)"
        return f"a room ({importer.room}/) never requires the instance that wires it"
    if importer.kind == "facade":
        assert importer.room is not None
        if kind == "core" or (kind == "room" and room == importer.room):
            return None
        if kind == "facade" and room in ROOMS[importer.room]:
            return None
        if kind == "room":
            return f"{room}/'s modules are reached through its facade, smartcache.{room}"
        return f"the {importer.room} facade requires its room, core modules and the facades its room may use"
    # the instance, api/ and the entry point
    if kind in ("core", "facade", "instance"):
        return None
    if kind == "api":
        if importer.name == "smartcache.api" or importer.kind == "api":
            return None
        return "api/'s modules are required by api.lua alone (the one registration point)"
    return f"{room}/'s modules are reached through its facade, smartcache.{room}"


def test_every_lua_module_is_placed_in_the_layout() -> None:
    unplaced = [str(p.relative_to(ROOT)) for p in lua_files() if classify(module_name(p)) is None]
    assert unplaced == [], "declare each in CORE, INSTANCE or a room (tests/unit/test_lua_layers.py)"


def test_every_room_has_its_facade_and_its_folder() -> None:
    for room in ROOMS:
        assert (LUA / "smartcache" / f"{room}.lua").is_file(), room
        assert (LUA / "smartcache" / room).is_dir(), room


def test_the_rooms_use_one_another_without_a_cycle() -> None:
    done: set[str] = set()

    def visit(room: str, path: tuple[str, ...]) -> None:
        assert room not in path, " -> ".join((*path, room))
        if room not in done:
            for used in ROOMS[room]:
                visit(used, (*path, room))
            done.add(room)

    for room in ROOMS:
        visit(room, ())


def test_every_required_smartcache_module_is_a_file() -> None:
    missing = [
        f"{p.relative_to(ROOT)}:{line}: {name}"
        for p in lua_files()
        for line, name in requires(p)
        if not (LUA / (name.replace(".", "/") + ".lua")).is_file()
    ]
    assert missing == []


@pytest.mark.parametrize("path", lua_files(), ids=lambda p: str(p.relative_to(LUA)))
def test_requires_follow_the_directions(path: Path) -> None:
    importer = classify(module_name(path))
    if importer is None:
        pytest.skip("not placed (test_every_lua_module_is_placed_in_the_layout says so)")
    broken = []
    for line, name in requires(path):
        imported = classify(name)
        why = "not in the layout" if imported is None else why_not(importer, imported)
        if why is not None:
            broken.append(f"lua/{path.relative_to(LUA)}:{line}: require('{name}'): {why}")
    assert broken == []


def test_the_check_reads_requires_as_lua_does() -> None:
    """Requires in comments and strings are no requires; both quotes and the call without parentheses are."""
    text = code_only(
        "local a = require('smartcache.util') -- require('smartcache.api')\n"
        '--[[ require("smartcache.http") ]] local s = "require(\'smartcache.stats\')"\n'
        'local b = require "smartcache.config"\n'
    )
    assert [m.group(2) for m in REQUIRE.finditer(text)] == ["smartcache.util", "smartcache.config"]
