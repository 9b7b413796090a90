"""smartcache-cli's arguments: what cannot be meant is refused with the argument named, before anything is sent.

The types: argparse calls each with the text given and prints ``argument --timeout: <the
message>``; then the checks of DATA and --set, which need the whole command line. A refusal
is a usage error (exit 2, BAD_ARGUMENT). Issue 36: ``--timeout -1`` and an empty client id
were sent as given.
"""

from __future__ import annotations

import argparse
import json
import math
import uuid
from collections.abc import Callable

from smartcache.wire import sessionkeys


def session_id(text: str) -> uuid.UUID:
    """A session id: UUID text, as session-create prints it."""
    try:
        return uuid.UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a session id (UUID text, as session-create prints)"
        ) from None


def seconds(text: str) -> float:
    """A duration in seconds: a finite number above 0 (``--timeout 0.5``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text}")
    return value


def identifier(what: str, example: str) -> Callable[[str], str]:
    """A type for an id the service keys by (a client id, a device id): any text but an empty or blank one."""

    def parse(text: str) -> str:
        if not text.strip():
            empty = "empty" if not text else "blank"
            raise argparse.ArgumentTypeError(f"the {what} is {empty}: give one, e.g. {example}")
        return text

    parse.__name__ = what  # argparse names the type in some of its messages
    return parse


def parse_data(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """DATA is JSON unless --raw: a typo in JSON must not be stored as a string silently."""
    text = getattr(a, "data", None)
    if text is None or a.raw:
        return
    try:
        a.data = json.loads(text)
    except json.JSONDecodeError as e:
        p.error(f"DATA is not valid JSON ({e}); quote a string as '\"text\"' or pass --raw to send it as is")


def parse_set(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """session-update --set: a JSON object; one of DATA or --set/--unset."""
    text = getattr(a, "set", None)
    if a.command != "session-update":
        return
    if (a.data is None) == (text is None and a.unset is None):
        p.error("session-update takes DATA, or --set / --unset, not both and not neither")
    if text is None:
        return
    try:
        a.set = json.loads(text)
    except json.JSONDecodeError as e:
        p.error(f"--set is not valid JSON ({e})")
    if not isinstance(a.set, dict):
        p.error("--set must be a JSON object: '{\"attribute\": value}'")


def parse_delete(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """session-delete: the session id (log out), or --handle with --client (sign out a device); a handle that is
    not one is refused saying why (a session id given as --handle included)."""
    if a.command != "session-delete":
        return
    if (a.session is None) == (a.handle is None) or (a.handle is None) != (a.client is None):
        p.error("session-delete takes UUID (the session's id), or --handle with --client (a session of that client)")
    if a.handle is not None:
        try:
            sessionkeys.stored_of(a.handle)
        except sessionkeys.NotAHandle as e:
            p.error(f"--handle: {e}")
