"""The pages say what the code does: every number a page states that the code also holds, checked.

Each number has one home in the code (ports in ``service/smartcache/wire/ports.py``, the service's
variables in ``service/smartcache/server/config.py``, Tarantool's in ``lua/smartcache/config.lua``,
what a target installs and how long it may run in the Makefile, the Compose stack's ports and
defaults in ``docker-compose.yml``) and, where a page states it, one home in the docs (a
target's duration: docs/development.md's target table). This reads the files, never runs
anything, and fails naming the page and what disagrees: fix the page (or the code), not this.
Run by ``make lint`` and with the unit tests.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from smartcache.devstack import stack as devstack
from smartcache.server import config
from smartcache.wire import ports

ROOT = Path(__file__).resolve().parents[2]
#: every page whose relative links must resolve
PAGES = sorted(
    [
        "README.md",
        "SECURITY.md",
        "docker/README.md",
        "lua/README.md",
        "proto/PROTOCOL.md",
        *(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
    ]
)
#: a Debian package a target installs, as the pages name it in backticks
PACKAGE = re.compile(r"`([a-z0-9][a-z0-9.+-]+)`")
#: a fenced code block
FENCED = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[^\n]*$", re.MULTILINE | re.DOTALL)
#: a duration as the pages and the Makefile's help state one: "about 6 min", "takes 2 min", "took 4 min"
DURATION = re.compile(r"\b(?:about|takes?|took) (\d[\d.,]*(?:-\d[\d.,]*)? ?(?:min|s|h))\b")


def read(path: str) -> str:
    return (ROOT / path).read_text()


def without_code(text: str) -> str:
    """The text with fenced code blocks and inline code spans blanked (their brackets are no links)."""
    text = FENCED.sub("", text)
    return re.sub(r"`[^`\n]*`", "``", text)


def section(text: str, heading: str) -> str:
    """From the heading line whose title is ``heading`` to the next heading of its level or above."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"(#+) (.*)", line)
        if m and m.group(2).strip() == heading:
            level = len(m.group(1))
            end = next(
                (j for j in range(i + 1, len(lines)) if re.match(rf"#{{1,{level}}} ", lines[j])),
                len(lines),
            )
            return "\n".join(lines[i:end])
    raise AssertionError(f"no heading {heading!r}")


def rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row in ``text`` (header rows included, separators not)."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith("|") or re.fullmatch(r"\|[\s|:-]+\|", line):
            continue
        cells = re.split(r"(?<!\\)\|", line[1:-1] if line.endswith("|") else line[1:])
        out.append([c.strip() for c in cells])
    return out


def port_numbers(text: str) -> set[int]:
    """Every TCP port a text names: four- and five-digit numbers, ranges like 3301-3303 expanded."""
    found: set[int] = set()
    for m in re.finditer(r"\b(\d{4,5})(?:\s*(?:-|–|…|\.\.)\s*(\d{4,5}))?\b", text):
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) else first
        found.update(range(first, last + 1))
    return found


def variables(text: str, prefix: str) -> set[str]:
    """Every variable name with ``prefix`` a text names; ``X_1..3`` stands for X_1, X_2 and X_3."""
    names = set()
    for m in re.finditer(rf"\b({prefix}[A-Z0-9]+(?:_[A-Z0-9]+)*?)(?:_(\d)\.\.(\d))?\b", text):
        if m.group(2):
            names.update(f"{m.group(1)}_{n}" for n in range(int(m.group(2)), int(m.group(3)) + 1))
        else:
            names.add(m.group(1))
    return names


# --- ports: service/smartcache/wire/ports.py -------------------------------------------------------------

#: every port make run listens on, and what SMARTCACHE_PORT_OFFSET moves
MAKE_RUN_PORTS = {
    ports.LISTEN_PORT,
    ports.EVENTS_PORT,
    ports.METRICS_PORT,
    ports.CONSOLE_PORT,
    *ports.TARANTOOL_PORTS,
    *ports.TARANTOOL_HTTP_PORTS,
    *ports.ETCD_PORTS,
    *ports.ETCD_PEER_PORTS,
    ports.BACKEND_PORT,
}
#: the ports smartcache-cli's defaults point at (default_endpoint, _events_endpoint, _tarantool, _etcd)
CLI_PORTS = {ports.LISTEN_PORT, ports.EVENTS_PORT, *ports.TARANTOOL_PORTS, *ports.ETCD_PORTS}
#: the variables make run reads for its ports
MAKE_RUN_PORT_VARIABLES = {*devstack.DEFAULT_PORTS, "SMARTCACHE_LISTEN", "SMARTCACHE_EVENTS_LISTEN"}


def test_make_run_listens_on_the_ports_of_ports_py() -> None:
    assert set(devstack.DEFAULT_PORTS.values()) | {devstack.DEFAULT_LISTEN_PORT, devstack.DEFAULT_EVENTS_PORT} == (
        MAKE_RUN_PORTS
    )


def test_the_readme_lists_every_port_make_run_opens_and_no_other() -> None:
    table = "\n".join(" ".join(r) for r in rows(section(read("README.md"), "What `make run` starts")))
    assert port_numbers(table) == MAKE_RUN_PORTS


def test_the_readme_names_every_variable_that_moves_a_port_of_make_run() -> None:
    named = variables(section(read("README.md"), "What `make run` starts"), "")
    assert (MAKE_RUN_PORT_VARIABLES | {ports.PORT_OFFSET_VARIABLE}) - named == set(), "README: What make run starts"


def test_the_readmes_python_example_follows_the_port_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example's endpoint is make run's service port, moved by SMARTCACHE_PORT_OFFSET as make run moves it."""
    (example,) = re.findall(r"```python\n(.*?)```", read("README.md"), re.DOTALL)
    (line,) = [line for line in example.splitlines() if line.startswith("ENDPOINT = ")]
    assert ports.PORT_OFFSET_VARIABLE in example.split(line)[0], "say a word about the offset beside the endpoint"
    for offset in ("", "0", "7", "1000"):
        monkeypatch.setenv(ports.PORT_OFFSET_VARIABLE, offset)
        namespace: dict[str, object] = {}
        exec("import os\n" + line, namespace)  # the README's own line, read from the repository
        assert namespace["ENDPOINT"] == f"tcp://127.0.0.1:{ports.LISTEN_PORT + int(offset or 0)}"


def test_development_md_make_run_table_has_every_port_and_variable() -> None:
    table = rows(section(read("docs/development.md"), "make run"))[1:]
    assert port_numbers(" ".join(r[2] for r in table)) == MAKE_RUN_PORTS
    named = set().union(*(variables(r[1], "") for r in table))
    assert named == MAKE_RUN_PORT_VARIABLES


def test_configuration_md_port_offset_row_lists_what_make_run_and_the_cli_move() -> None:
    row = next(r for r in rows(read("docs/configuration.md")) if r[0] == f"`{ports.PORT_OFFSET_VARIABLE}`")
    make_run, _, cli = row[3].partition("the CLI's")
    assert port_numbers(make_run) == MAKE_RUN_PORTS
    assert port_numbers(cli) == CLI_PORTS
    assert f"0..{devstack.MAX_PORT_OFFSET}" in row[2]


def test_configuration_md_names_every_variable_that_moves_a_port_of_make_run() -> None:
    assert variables(read("docs/configuration.md"), "") >= MAKE_RUN_PORT_VARIABLES


def test_configuration_md_defaults_of_the_endpoints_are_the_ports_of_ports_py() -> None:
    table = [r for r in rows(read("docs/configuration.md")) if len(r) > 1]
    defaults = {r[0].strip("`"): r[1] for r in table}
    assert port_numbers(defaults["SMARTCACHE_LISTEN"]) == {ports.LISTEN_PORT}
    assert port_numbers(defaults["SMARTCACHE_EVENTS_LISTEN"]) == {ports.EVENTS_PORT}
    assert port_numbers(defaults["SMARTCACHE_METRICS_PORT"]) == {ports.METRICS_PORT}
    assert port_numbers(defaults[ports.ENDPOINT_VARIABLE]) == {ports.LISTEN_PORT}
    assert port_numbers(defaults[ports.EVENTS_ENDPOINT_VARIABLE]) == {ports.EVENTS_PORT}
    assert port_numbers(defaults[ports.ETCD_VARIABLE]) == set(ports.ETCD_PORTS)
    service, cli = (r[1] for r in table if r[0] == f"`{ports.TARANTOOL_VARIABLE}`")
    assert port_numbers(service) == port_numbers(config.DEFAULT_TARANTOOL)
    assert port_numbers(cli) == set(ports.TARANTOOL_PORTS)


# --- the service's variables: service/smartcache/server/config.py -----------------------------------------


def service_variables() -> set[str]:
    """Every SMARTCACHE_* variable the service reads: the keys _Env.get is asked for while building Settings."""
    env = config._Env({})
    config._build(env)
    return env.read


def configuration_tables() -> tuple[set[str], set[str]]:
    """The variables of docs/configuration.md's two tables: the service's, and other programs'."""
    text = read("docs/configuration.md")
    service, _, others = text.partition("Read by other programs")
    first = {n for r in rows(service)[1:] for n in variables(r[0], "SMARTCACHE_")}
    second = {n for r in rows(others)[1:] for n in variables(r[0], "SMARTCACHE_")}
    return first, second


def test_configuration_md_lists_every_variable_the_service_reads_and_no_other() -> None:
    first, _ = configuration_tables()
    assert service_variables() - first == set(), "read by config.py, missing in docs/configuration.md"
    assert first - service_variables() == set(), "in docs/configuration.md's first table, not read by config.py"


def documented_default(cell: str) -> str | float | None:
    """A default as a table states it: a number, a `literal`, empty (or unset) as ""; None for prose."""
    value = cell.strip()
    if value in ("empty", "unset"):
        return ""
    if re.fullmatch(r"`[^`]*`", value):
        return value.strip("`")
    if re.fullmatch(r"-?\d+(\.\d+)?", value):
        return float(value)
    return None


def test_configuration_md_defaults_are_the_settings_defaults() -> None:
    settings = config.Settings()
    service, _, _ = read("docs/configuration.md").partition("Read by other programs")
    compared = 0
    for r in rows(service)[1:]:
        names = [n for n in re.findall(r"`(SMARTCACHE_[A-Z0-9_]+)`", r[0]) if not n.endswith("_FILE")]
        values = r[1].split(" / ")
        field = [n.removeprefix(config.PREFIX).lower() for n in names]
        if len(values) != len(names) or not all(hasattr(settings, f) for f in field):
            continue
        for name, f, cell in zip(names, field, values, strict=True):
            doc, code = documented_default(cell), getattr(settings, f)
            if doc is None or f == "instance_id":
                continue
            if isinstance(code, tuple):
                code = ",".join(map(str, code))
            elif isinstance(code, dict):
                code = code or ""
            elif isinstance(code, bool | int | float) and isinstance(doc, float):
                code = float(code)
            assert doc == code, f"docs/configuration.md: {name} defaults to {cell}, config.py to {code!r}"
            compared += 1
    assert compared >= 25


def test_configuration_md_lists_every_variable_of_other_programs() -> None:
    _, second = configuration_tables()
    assert config.OTHER_PROGRAMS_VARIABLES - second == set(), "OTHER_PROGRAMS_VARIABLES missing in the second table"
    assert second - config.OTHER_PROGRAMS_VARIABLES - service_variables() == set(), "read by nobody"


def compose_variables() -> set[str]:
    text = read("docker-compose.yml") + read("docker/compose.secrets.yml")
    return set(re.findall(r"\$\{([A-Z0-9_]+)", text))


@pytest.mark.parametrize("page", PAGES)
def test_every_smartcache_variable_a_page_names_is_read_by_someone(page: str) -> None:
    known = service_variables() | config.OTHER_PROGRAMS_VARIABLES | compose_variables()
    named = variables(read(page), "SMARTCACHE_")
    assert named - known == set(), f"{page} names variables nobody reads"


# --- Tarantool's variables: lua/smartcache/config.lua ----------------------------------------------


def lua_variables() -> tuple[set[str], set[str]]:
    """The SC_* variables config.lua reads, and the _FILE variants of its secrets."""
    text = read("lua/smartcache/config.lua")
    read_ = set(re.findall(r"env_(?:string|number|secret|bool)\(\s*'(SC_[A-Z0-9_]+)'", text))
    files = {f"{n}_FILE" for n in re.findall(r"env_secret\(\s*'(SC_[A-Z0-9_]+)'", text)}
    return read_, files


def test_lua_readme_environment_lists_every_variable_config_lua_reads_and_no_other() -> None:
    read_, files = lua_variables()
    table = rows(section(read("lua/README.md"), "Environment"))[1:]
    first = set().union(*(variables(r[0], "SC_") for r in table))
    anywhere = set().union(*(variables(" ".join(r), "SC_") for r in table))
    assert read_ - anywhere == set(), "read by config.lua, missing in lua/README.md's Environment table"
    assert first - read_ - files == set(), "a row of lua/README.md's Environment table, not read by config.lua"
    assert anywhere - read_ - files == set(), "named in lua/README.md's Environment table, read by nobody"


def lua_defaults() -> dict[str, str | float]:
    """The SC_* defaults config.lua states as literals: numbers (products of numbers too) and strings."""
    out: dict[str, str | float] = {}
    text = read("lua/smartcache/config.lua")
    for name, default in re.findall(r"env_(?:number|string|secret|bool)\(\s*'(SC_[A-Z0-9_]+)',\s*([^()]*?)\)", text):
        if re.fullmatch(r"[\d.]+(?:\s*\*\s*[\d.]+)*", default):
            product = 1.0
            for factor in default.split("*"):
                product *= float(factor)
            out[name] = product
        elif re.fullmatch(r"'[^']*'|true|false", default):
            out[name] = default.strip("'")
    return out


def test_lua_readme_environment_defaults_are_config_lua_s() -> None:
    defaults = lua_defaults()
    compared = 0
    for r in rows(section(read("lua/README.md"), "Environment")):
        names = re.findall(r"`(SC_[A-Z0-9_]+)`", r[0])
        values = r[1].split(" / ") if len(r) > 1 else []
        if not names or len(values) != len(names):
            continue
        for name, cell in zip(names, values, strict=True):
            doc = documented_default(cell)
            if doc is None or name not in defaults:
                continue
            assert doc == defaults[name], f"lua/README.md: {name} defaults to {cell}, config.lua to {defaults[name]!r}"
            compared += 1
    assert compared >= 40


def test_lua_readme_deadline_constants_are_config_lua_s() -> None:
    code = dict(re.findall(r"^M\.([A-Z_]+) = ([\d.]+)\s*$", read("lua/smartcache/config.lua"), re.MULTILINE))
    table = rows(section(read("lua/README.md"), "The deadline budget, storage side"))[1:]
    documented = {r[0].strip("`"): r[1] for r in table}
    assert {n: float(v) for n, v in documented.items()} == {n: float(v) for n, v in code.items()}


@pytest.mark.parametrize("page", PAGES)
def test_every_sc_variable_a_page_names_is_read_by_someone(page: str) -> None:
    read_, files = lua_variables()
    named = variables(read(page), "SC_")
    assert named - read_ - files - set(devstack.DEFAULT_PORTS) == set(), f"{page} names variables nobody reads"


# --- the targets: the Makefile and docs/development.md's table --------------------------------------


def makefile_rules() -> dict[str, tuple[str, str, str]]:
    """target -> (prerequisites, help text, recipe) of every rule of the Makefile."""
    out: dict[str, tuple[str, str, str]] = {}
    current = None
    for line in read("Makefile").splitlines():
        m = re.match(r"^([$()A-Za-z_-]+):(?!=)\s*([^#]*?)\s*(?:## (.*))?$", line)
        if m:
            current = m.group(1)
            out[current] = (m.group(2), m.group(3) or "", "")
        elif line.startswith("\t") and current:
            prereqs, help_, recipe = out[current]
            out[current] = (prereqs, help_, recipe + line + "\n")
        elif not line.startswith("\t"):
            current = None
    return out


def apt_packages(recipe: str) -> set[str]:
    """The Debian packages a recipe (or the script it runs) installs when missing, or downloads."""
    found = set(re.findall(r'missing="\$+missing ([a-z0-9.+-]+)"', recipe))
    found |= set(re.findall(r"download -qq ([a-z0-9.+-]+)", recipe))
    for script in re.findall(r"bash (\S+\.sh)", recipe):
        found |= apt_packages(read(script))
    return found


def target_packages() -> dict[str, set[str]]:
    """make target -> the Debian packages its own recipe installs (lint: through $(PROMTOOL))."""
    rules = makefile_rules()
    out = {t: apt_packages(recipe) for t, (_, _, recipe) in rules.items() if not t.startswith("$")}
    for target, (prereqs, _, _) in rules.items():
        for file_rule in re.findall(r"\$\([A-Z]+\)", prereqs):
            out[target] = out.get(target, set()) | apt_packages(rules[file_rule][2])
    return out


def extra_python_packages(recipe: str) -> set[str]:
    """The Python packages of the extras a recipe installs beyond `dev` (make fuzz: atheris)."""
    extras = tomllib.loads(read("pyproject.toml"))["project"]["optional-dependencies"]
    found = set()
    for spec in re.findall(r"-e '\.\[([a-z,]+)\]'", recipe):
        for extra in spec.split(","):
            if extra != "dev":
                found |= {re.split(r"[<>=!~ \[;]", d)[0] for d in extras[extra]}
    return found


def development_targets() -> dict[str, list[str]]:
    """target -> its row of docs/development.md's target table: what it does, installs, takes."""
    table = rows(section(read("docs/development.md"), "Targets"))[1:]
    return {r[0].removeprefix("`make ").removesuffix("`"): r[1:] for r in table}


def test_development_md_has_one_row_per_target_of_the_makefile() -> None:
    targets = {t for t in makefile_rules() if not t.startswith(("$", "."))}
    assert set(development_targets()) == targets


def test_development_md_names_what_each_target_installs() -> None:
    every_package = set().union(*target_packages().values())
    rules = makefile_rules()
    for target, (_, installs, _) in development_targets().items():
        named = set(PACKAGE.findall(installs)) & every_package
        assert named == target_packages().get(target, set()), f"docs/development.md, make {target}: {installs}"
        prereqs = rules[target][0].split()
        if "venv" in prereqs:
            assert "what `venv` installs" in installs, f"make {target} installs what venv does"
        elif "sysdeps" in prereqs:
            assert "what `sysdeps` installs" in installs, f"make {target} installs what sysdeps does"
        elif not named:
            assert installs == "nothing" or target == "sysdeps", f"make {target}: {installs}"
        for package in extra_python_packages(rules[target][2]):
            assert package in installs, f"make {target} installs {package}"


def test_the_readme_names_what_the_targets_install() -> None:
    readme = read("README.md")
    packages = target_packages()
    every_package = set().union(*packages.values())
    first = readme[: readme.index("\n## ")]
    assert set(PACKAGE.findall(first)) & every_package == packages["sysdeps"], "README, before its first section"
    others = section(readme, "Targets")
    rest = set().union(*(p for t, p in packages.items() if t != "sysdeps"))
    assert set(PACKAGE.findall(others)) & every_package == rest, "README, Targets"


def test_the_readme_gives_a_duration_for_each_target_that_takes_one() -> None:
    """The README's Targets table: a row for every target whose docs/development.md row gives a duration."""
    stated = " ".join(" ".join(r) for r in rows(section(read("README.md"), "Targets")))
    for target, row in development_targets().items():
        if DURATION.search(row[2]):
            assert f"`make {target}`" in stated, f"README, Targets: no row for make {target} ({row[2]})"


def test_development_md_dependencies_name_every_debian_package_a_target_installs() -> None:
    text = section(read("docs/development.md"), "Dependencies, and why these")
    debian = text[text.index("Debian packages:") :]
    for package in set().union(*target_packages().values()):
        assert f"`{package}`" in debian, f"docs/development.md, Dependencies: {package}"


def test_each_duration_the_makefile_help_states_is_development_md_s() -> None:
    takes = {t: row[2] for t, row in development_targets().items()}
    for target, (_, help_, _) in makefile_rules().items():
        for duration in DURATION.findall(help_):
            assert duration in takes[target], f"Makefile help of {target} says {duration}: {takes[target]}"


@pytest.mark.parametrize("page", [p for p in PAGES if p != "docs/development.md"])
def test_no_page_states_another_duration_of_a_target(page: str) -> None:
    takes = {t: row[2] for t, row in development_targets().items()}
    for line in read(page).splitlines():
        for target in re.findall(r"make ([a-z-]+)", line):
            for duration in DURATION.findall(line):
                if target in takes:
                    assert duration in takes[target], f"{page}: make {target} {duration}? {takes[target]}"


def test_development_md_states_the_makefile_s_limits() -> None:
    makefile = read("Makefile")
    targets = development_targets()
    faults = re.search(r"timeout --kill-after=(\d+) (\d+) \$\(PY\) -m tests\.faults", makefile)
    assert faults, "the Makefile's test-faults timeout"
    kill_after, limit = int(faults.group(1)), int(faults.group(2))
    assert f"stopped after {limit:,} s (killed {kill_after} s later)" in targets["test-faults"][0]
    fuzz = re.search(r"^FUZZ_SECONDS \?= (\d+)", makefile, re.MULTILINE)
    assert fuzz
    assert f"({fuzz.group(1)} s)" in targets["fuzz"][2]
    lock = re.search(r"Lock::Timeout=(\d+)", makefile)
    assert lock
    assert f"up to {lock.group(1)} s" in targets["sysdeps"][1]


def test_development_md_counts_the_fault_scenarios() -> None:
    from tests.faults.scenarios import SCENARIOS  # the suite's own list: rows made in loops count too

    assert f"the {len(SCENARIOS)} fault scenarios" in development_targets()["test-faults"][0]


# --- the distribution's name: pyproject.toml's [project] name ---------------------------------------

#: names on the package index that belong to other projects: `smartcache` is a Redis helper of 2016
#: (source only, so installing it runs its setup code)
TAKEN_NAMES = {"smartcache"}
#: a pip install command as the pages and the programs' messages write one, up to where the command ends
PIP_INSTALL = re.compile(r"pip install ([^`\n|\"#;)]*)")
#: pip options that take a value (the value is no requirement)
PIP_OPTIONS_WITH_VALUE = {"-c", "--constraint", "-r", "--requirement", "-w", "--wheel-dir", "-t", "--target", "-i"}


def canonical(name: str) -> str:
    """A distribution name as the package index compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def distribution() -> str:
    return str(tomllib.loads(read("pyproject.toml"))["project"]["name"])


def install_arguments(command: str) -> list[str]:
    """The requirements and paths of one ``pip install`` command: its options and their values left out."""
    args, skip = [], False
    for word in (w.strip("'\"") for w in command.split()):
        if word == "&&":
            break
        if skip or word in ("", "\\"):
            skip = False
        elif word in PIP_OPTIONS_WITH_VALUE:
            skip = True
        elif not word.startswith("-"):
            args.append(word)
    return args


def install_commands() -> list[tuple[str, str]]:
    """(file, arguments) of every pip install the pages, the Makefile, the Dockerfiles and the programs give."""
    files = [*PAGES, "Makefile", *(str(p.relative_to(ROOT)) for p in (ROOT / "docker").glob("*.Dockerfile"))]
    files += [str(p.relative_to(ROOT)) for p in (ROOT / "service").rglob("*.py")]
    return [(f, m.group(1)) for f in files for m in PIP_INSTALL.finditer(read(f))]


def test_the_distribution_name_is_not_another_projects() -> None:
    assert canonical(distribution()) not in TAKEN_NAMES, "pyproject.toml: that name on the package index is taken"


def test_every_documented_install_names_our_distribution_or_a_path() -> None:
    """A requirement named is ours (any extra); a wheel is ours by its file name; a directory is a checkout."""
    ours, wheel_prefix = canonical(distribution()), distribution().replace("-", "_") + "-"
    wrong = []
    for file, command in install_commands():
        for arg in install_arguments(command):
            bare = re.sub(r"\[[^\]]*\]$", "", arg)
            if bare.endswith(".whl"):
                ok = Path(bare).name.lower().startswith(wheel_prefix)
            elif bare.startswith((".", "/", "~", "<")) or "/" in bare:
                ok = True  # a checkout (or a requirements file's path after -r, skipped above)
            else:
                ok = canonical(re.split(r"[<>=!~;@ ]", bare)[0]) == ours
            if not ok:
                wrong.append(f"{file}: pip install {command.strip()}")
    assert not wrong, f"not our distribution ({distribution()}): " + "; ".join(wrong)


def test_the_readme_and_the_client_page_say_how_to_install_our_client() -> None:
    wheel = distribution().replace("-", "_")
    for page in ("README.md", "docs/client.md"):
        text = read(page)
        assert f"`{distribution()}`" in text, f"{page} names the distribution"
        commands = [c for f, c in install_commands() if f == page]
        assert any(install_arguments(c) == ["."] for c in commands), f"{page}: pip install . from a checkout"
        assert any(f"{wheel}-" in c and ".whl" in c for c in commands), f"{page}: pip install of the wheel"


# --- links -------------------------------------------------------------------------------------------


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file: each heading slugged (duplicates numbered), and explicit ids."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    text = FENCED.sub("", path.read_text())
    for m in re.finditer(r"^#+ (.*?)\s*#*$", text, re.MULTILINE):
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    found.update(re.findall(r"<a (?:name|id)=\"([^\"]+)\"", text))
    return found


def links(page: str) -> list[str]:
    text = without_code(read(page))
    inline = re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text)
    reference = re.findall(r"^\[[^\]]+\]:\s*(\S+)", text, re.MULTILINE)
    return [t for t in inline + reference if not re.match(r"[a-z][a-z+.-]*:", t)]


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_resolves_to_a_file_and_its_anchor(page: str) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (ROOT / page).parent / path if path else ROOT / page
        if not file.exists():
            broken.append(f"{target}: no file {file.relative_to(ROOT) if file.is_relative_to(ROOT) else file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{page}: " + "; ".join(broken)


# --- Docker: docker-compose.yml and the Dockerfiles ----------------------------------------------------


def published_ports() -> dict[str, list[tuple[str, int, int]]]:
    """compose service -> (variable, its default, container port) of every port it publishes."""
    out: dict[str, list[tuple[str, int, int]]] = {}
    service = ""
    for line in read("docker-compose.yml").splitlines():
        m = re.match(r"^  ([a-z0-9-]+):\s*$", line)
        if m:
            service = m.group(1)
        m = re.search(r'"\$\{PUBLISH_ADDR:-127\.0\.0\.1\}:\$\{([A-Z0-9_]+):-(\d+)\}:(\d+)"', line)
        if m:
            out.setdefault(service, []).append((m.group(1), int(m.group(2)), int(m.group(3))))
    return out


def test_docker_md_ports_table_is_docker_compose_yml_s() -> None:
    documented: dict[str, list[tuple[str, int, int]]] = {}
    for r in rows(section(read("docs/docker.md"), "Ports"))[1:]:
        pairs = re.findall(r"`([A-Z0-9_]+)` (\d+) → (\d+)", r[1])
        if pairs:
            documented[r[0].strip("`")] = [(v, int(h), int(c)) for v, h, c in pairs]
    assert documented == published_ports()


def test_docker_pages_events_and_client_endpoints_are_the_published_ones() -> None:
    published = published_ports()
    events_in = {c for s in published for v, _, c in published[s] if "EVENTS" in v}
    events_out = {h for s in published for v, h, _ in published[s] if "EVENTS" in v}
    zmq_out = {h for s in published for v, h, _ in published[s] if re.fullmatch(r"SERVICE_\d_PORT", v)}
    text = read("docker/README.md") + read("docs/docker.md")
    publishers = re.findall(r"(?:--publishers |publishers=\")(\S+?)[\")\s`]", text)
    assert publishers
    for endpoint in ",".join(publishers).split(","):
        host, _, port = endpoint.removeprefix("tcp://").partition(":")
        expected = events_out if host == "127.0.0.1" else events_in
        assert int(port) in expected, f"docker pages: {endpoint} is no events socket"
    clients = re.findall(r"Client\(\"([^\"]+)\"", text)
    endpoints = [e for spec in clients for e in spec.split(",") if re.fullmatch(r"tcp://127\.0\.0\.1:\d+", e)]
    assert endpoints
    for endpoint in endpoints:
        assert int(endpoint.rsplit(":", 1)[1]) in zmq_out, f"docker pages: {endpoint} is no service's ZeroMQ"


def compose_defaults() -> dict[str, str]:
    text = read("docker-compose.yml") + read("docker/compose.secrets.yml")
    found: dict[str, set[str]] = {}
    for name, default in re.findall(r"\$\{([A-Z0-9_]+):-([^}]*)\}", text):
        found.setdefault(name, set()).add(default)
    assert all(len(d) == 1 for d in found.values()), f"one default per variable: {found}"
    return {name: d.pop() for name, d in found.items()}


def test_docker_md_variables_are_docker_compose_yml_s_with_their_defaults() -> None:
    published = {v for s in published_ports().values() for v, _, _ in s}
    documented: dict[str, str] = {}
    for r in rows(section(read("docs/docker.md"), "Variables"))[1:]:
        names = re.findall(r"`([A-Z0-9_]+)`", r[0])
        if r[1] == "[Ports](#ports)":
            continue
        values = [v.strip().strip("`") for v in re.split(r" / ", r[1])]
        values = ["" if v.startswith("empty") else v for v in values]
        assert len(values) in (1, len(names)), f"docs/docker.md Variables: {r[0]}"
        documented.update(zip(names, values * len(names) if len(values) == 1 else values, strict=True))
    defaults = {n: d for n, d in compose_defaults().items() if n not in published}
    assert {n: documented.get(n) for n in defaults} == defaults
    assert set(documented) - compose_variables() == set(), "docs/docker.md Variables: not in the compose files"


def test_docker_md_says_what_the_images_set() -> None:
    env = {}
    for dockerfile in (ROOT / "docker").glob("*.Dockerfile"):
        env.update(re.findall(r"\b([A-Z][A-Z0-9_]+)=(\S+?)\s*\\?$", dockerfile.read_text(), re.MULTILINE))
    text = read("docs/docker.md")
    paragraph = text[text.index("The images set what differs inside a container") :]
    paragraph = paragraph[: paragraph.index("\n\n")]
    stated = re.findall(r"`([A-Z][A-Z0-9_]+)=([^`]+)`", paragraph)
    assert stated
    for name, value in stated:
        assert env.get(name) == value, f"docs/docker.md: {name}={value}, the Dockerfiles: {env.get(name)}"


def _rule(makefile: str, target: str) -> str:
    """The recipe of one Makefile target (its lines up to the next blank line)."""
    m = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n|\S.*\\\n)*)", makefile, re.M)
    assert m, f"no rule {target} in the Makefile"
    return m.group(1)


def test_make_lint_installs_no_prometheus_server() -> None:
    """docs/development.md: promtool is unpacked from Debian's package, which is not installed (installed, it
    enables and starts a Prometheus server on :9090)."""
    makefile = read("Makefile")
    promtool = _rule(makefile, "$(PROMTOOL)")
    assert "download -qq prometheus" in promtool
    assert "dpkg-deb -x" in promtool
    assert not re.search(r"install\b[^\n]*prometheus", promtool)
    sysdeps = _rule(makefile, "sysdeps")
    assert "prometheus" not in sysdeps
    assert "the package itself is not installed" in read("docs/development.md")


#: a test a page cites: ``tests/….py::name``, or ``::name`` after one (the same file)
CITED_TEST = re.compile(r"`(tests/[\w/]+\.py)?::(test_\w+)`")
#: a Lua tap test a page cites by its description: ``tests/lua/….lua` "description"``
CITED_TAP = re.compile(r'`(tests/lua/\w+\.lua)` "([^"]+)"')


def test_every_test_security_md_cites_exists() -> None:
    """SECURITY.md's "Security of sessions" shows each requirement by a test: a renamed test leaves it
    citing nothing."""
    text = (ROOT / "SECURITY.md").read_text()
    missing, cited, last = [], 0, None
    for m in CITED_TEST.finditer(text):
        path, name = m.group(1) or last, m.group(2)
        if path is None:
            missing.append(f"::{name} with no file before it")
            continue
        last, cited = path, cited + 1
        if not re.search(rf"^(async )?def {name}\(", (ROOT / path).read_text(), re.MULTILINE):
            missing.append(f"{path}::{name}")
    for path, description in CITED_TAP.findall(text):
        cited += 1
        if description not in (ROOT / path).read_text().replace("\\'", "'"):  # Lua's \' is a '
            missing.append(f'{path} "{description}"')
    assert cited >= 20
    assert not missing, f"SECURITY.md cites tests that do not exist: {missing}"
