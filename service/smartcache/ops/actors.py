"""Who asks for an operator action, and why: what the audit writes with every entry (smartcache.ops.audit).

Needs no connector (the CLI checks a reason and builds the actor before anything is asked, with
the client alone installed too). Who is never a secret:

* the CLI's operator: its CURVE public key (z85, ``curve:<key>``) when it has one, else
  ``cli:<login>@<host> as <Tarantool operator user>``;
* the console: ``console:<the first 12 hex of the SHA-256 of its token>``, never the token;
* a program that called smartcache.ops without an actor (make run's set-up, tests, load tests):
  :data:`UNATTENDED`.
"""

from __future__ import annotations

import hashlib
import socket
from dataclasses import dataclass

#: the longest reason storage keeps (sc.audit_write refuses a longer one: callers check it before acting)
MAX_REASON_BYTES = 1024


@dataclass(frozen=True)
class Actor:
    """Who asks and why: written with both entries of every operation."""

    who: str
    reason: str


def cli_who(operator_user: str, login: str, host: str, curve_public: str | None = None) -> str:
    """The CLI's operator: its CURVE public key (z85) when it has one, else ``cli:<login>@<host> as <user>``."""
    if curve_public:
        return f"curve:{curve_public}"
    return f"cli:{login}@{host} as {operator_user}"


def token_id(token: str) -> str:
    """A token named without being given away: the first 12 hex of its SHA-256."""
    return hashlib.sha256(token.encode()).hexdigest()[:12]


def console_who(token: str) -> str:
    return f"console:{token_id(token)}"


#: who a program that called an operation without an actor is written as (make run's set-up, tests, load tests)
UNATTENDED = Actor(
    who=f"unattended@{socket.gethostname()}", reason="no operator: a program called smartcache.ops without one"
)
