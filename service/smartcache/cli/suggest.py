"""'Did you mean': a mistyped command, operation or option answered with the names it is close to.

argparse's own ``suggest_on_error`` comes with Python 3.14; we support 3.11, so this does
the same with difflib over the names the parser knows: for a choice (a command, an
operation), the choices of that argument; for an option argparse did not recognise, the
options of the parser and of every subcommand chosen on the line (``cluster statsu`` ->
``status``; ``cluster status --jsn`` -> ``--json``). Nothing is suggested when nothing is
close (difflib's ratio under :data:`CUTOFF`).
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable, Sequence

#: difflib's similarity a name must reach to be suggested (its default: 'sesion-get' is 0.95 of 'session-get')
CUTOFF = 0.6
#: at most this many names suggested
MOST = 3


def close(value: str, names: Iterable[str]) -> list[str]:
    """The known names closest to value, best first."""
    return difflib.get_close_matches(value, list(names), n=MOST, cutoff=CUTOFF)


def did_you_mean(names: Sequence[str]) -> str:
    """'did you mean X?', 'did you mean X or Y?', 'did you mean X, Y or Z?'; '' when there is none."""
    if not names:
        return ""
    return f"did you mean {names[0]}?" if len(names) == 1 else f"did you mean {', '.join(names[:-1])} or {names[-1]}?"


def invalid_choice(value: str, choices: Iterable[str]) -> str | None:
    """argparse's 'invalid choice' message with a suggestion instead of the whole list, or None when nothing is
    close (argparse's own message, which lists every choice, is better then)."""
    names = close(value, choices)
    if not names:
        return None
    return f"invalid choice: {value!r} ({did_you_mean(names)} '--help' lists them all)"


def options_chosen(parser: argparse.ArgumentParser, namespace: argparse.Namespace) -> dict[str, str | None]:
    """Every option string of parser and of the subcommands chosen in namespace (cluster, then its operation...),
    each with the subcommand chosen after the parser it belongs to (None: the last one's): such an option is
    given before that subcommand, and only there (``smartcache-cli --timeout 1 ping``)."""
    chosen: str | None = None
    below: dict[str, str | None] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            name = getattr(namespace, action.dest, None)
            sub = action.choices.get(name) if isinstance(name, str) else None
            if isinstance(sub, argparse.ArgumentParser):
                chosen, below = name, options_chosen(sub, namespace)
    own = {option: chosen for action in parser._actions for option in action.option_strings}
    return {**own, **below}


def unrecognized(parser: argparse.ArgumentParser, namespace: argparse.Namespace, extras: Sequence[str]) -> str:
    """argparse's 'unrecognized arguments' message, each unknown option followed by the options it is close to
    (one that goes before a subcommand says so: ``ping --timeout 1`` is refused, ``--timeout 1 ping`` taken)."""
    known = options_chosen(parser, namespace)
    words = []
    for extra in extras:
        names = close(extra.split("=", 1)[0], known) if extra.startswith("-") else []
        shown = [n if known[n] is None else f"{n}, given before {known[n]}" for n in names]
        words.append(f"{extra} ({did_you_mean(shown)})" if names else extra)
    return "unrecognized arguments: " + " ".join(words)
