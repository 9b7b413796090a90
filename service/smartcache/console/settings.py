"""The console's settings: the command line first, then the environment, read once at start-up.

The operator token guards the actions (switchover, rejoin) and the reveal of
session data: ``SMARTCACHE_CONSOLE_TOKEN``, or the content of the file
``SMARTCACHE_CONSOLE_TOKEN_FILE`` names (a secrets file), or else the
service's ``SMARTCACHE_METRICS_TOKEN`` (or ``_FILE``). Without one the
console is read-only; in production (``SMARTCACHE_ENV=production``, the
service's variable) it refuses to start (exit 2).

Tarantool is asked as the operator user, like ``smartcache-cli cluster``:
``SMARTCACHE_OPERATOR_USER`` (default operator) and
``SMARTCACHE_OPERATOR_PASSWORD`` or ``_FILE`` (development default operator).
Sessions are read from the instances' operator HTTP (sessions.py), whose data
routes want the instances' own ``SC_HTTP_TOKEN`` (or ``SC_HTTP_TOKEN_FILE``)
when they have one: the console reads the same variable.

The variables are read with the service's reader (smartcache.settings.Environment: a value is
stripped, an empty one is unset, a secret comes from the variable or its ``_FILE``, never both),
and every one that is wrong is named at once.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from smartcache.ops import etcd
from smartcache.ops.access import Access
from smartcache.settings import Environment, SettingsError
from smartcache.wire.ports import (
    CLUSTER_VARIABLE,
    CONSOLE_PORT,
    METRICS_PORT,
    default_endpoint,
    default_etcd,
    default_events_endpoint,
    default_tarantool,
    port_offset,
)

__all__ = [
    "ANSWER_TIMEOUT_S",
    "EXIT_BAD",
    "LISTEN_VARIABLE",
    "POLL_S",
    "SCRAPE_S",
    "SERVICES_VARIABLE",
    "STORAGE_POLL_S",
    "TOKEN_VARIABLES",
    "WINDOW_S",
    "Service",
    "Settings",
    "SettingsError",
    "from_args",
    "parse_listen",
    "parse_service",
    "parser",
    "token_of",
]

LISTEN_VARIABLE = "SMARTCACHE_CONSOLE_LISTEN"
SERVICES_VARIABLE = "SMARTCACHE_CONSOLE_SERVICES"
TOKEN_VARIABLES = ("SMARTCACHE_CONSOLE_TOKEN", "SMARTCACHE_METRICS_TOKEN")
#: the same without the prefix, as smartcache.settings.Environment names them
_TOKENS = tuple(name.removeprefix("SMARTCACHE_") for name in TOKEN_VARIABLES)
#: how often the page's parts are asked (the storage cluster four times as often, and the page polls twice a
#: second: a new leader shows within about 0.75 s of its election), and how long one answer is waited for
POLL_S = 1.0
STORAGE_POLL_S = 0.25
ANSWER_TIMEOUT_S = 2.0
#: how often each service's /metrics is scraped, and how far back the rates go
SCRAPE_S = 3.0
WINDOW_S = 15 * 60.0
EXIT_BAD = 2


@dataclass(frozen=True)
class Service:
    """One service instance: its ZeroMQ endpoint (INFO) and its metrics and health base URL."""

    name: str
    endpoint: str
    metrics_url: str


@dataclass(frozen=True)
class Settings:
    host: str
    port: int
    access: Access = field(repr=False)
    services: tuple[Service, ...]
    publishers: str
    token: str = field(default="", repr=False)
    metrics_token: str = field(default="", repr=False)
    #: the instances' SC_HTTP_TOKEN, for their operator HTTP's data routes ("": they have none)
    http_token: str = field(default="", repr=False)
    production: bool = False
    poll_s: float = POLL_S
    storage_poll_s: float = STORAGE_POLL_S
    answer_timeout_s: float = ANSWER_TIMEOUT_S
    scrape_s: float = SCRAPE_S
    window_s: float = WINDOW_S


def token_of(env: Mapping[str, str] | Environment) -> str:
    """The operator token: the console's own (or its file), else the metrics token (or its file); SettingsError
    when one of them is set twice or its file cannot be read."""
    r = env if isinstance(env, Environment) else Environment(env)
    for name in _TOKENS:
        if token := r.secret(name, ""):
            break
    r.check()
    return token


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise SettingsError(f"--listen {text!r}: HOST:PORT, e.g. 127.0.0.1:{CONSOLE_PORT}")
    return host or "127.0.0.1", int(port)


def parse_service(text: str, n: int) -> Service:
    """``ENDPOINT=METRICS_URL`` (tcp://127.0.0.1:5555=http://127.0.0.1:9105)."""
    endpoint, sep, url = text.partition("=")
    if not sep or not endpoint.strip() or not url.strip():
        raise SettingsError(
            f"--service {text!r}: ENDPOINT=METRICS_URL, e.g. tcp://127.0.0.1:5555=http://127.0.0.1:9105"
        )
    return Service(f"service-{n}", endpoint.strip(), url.strip().rstrip("/"))


def parser() -> argparse.ArgumentParser:
    offset = port_offset()
    p = argparse.ArgumentParser(
        prog="smartcache-console",
        description="The operator's console: topology, services, rates, sessions, events, the audit log and the "
        "actions (switchover, rejoin, reveal of session data, log out everywhere) in a browser. Read-only without "
        "the operator token ($SMARTCACHE_CONSOLE_TOKEN or _FILE, else $SMARTCACHE_METRICS_TOKEN); in production "
        "($SMARTCACHE_ENV=production) it needs one. Sessions are read from the instances' operator HTTP: with their "
        "SC_HTTP_TOKEN (or _FILE) set, set it here too.",
    )
    p.add_argument(
        "--listen",
        default=os.environ.get(LISTEN_VARIABLE) or f"127.0.0.1:{CONSOLE_PORT + offset}",
        metavar="HOST:PORT",
        help=f"where the page is served (default: ${LISTEN_VARIABLE}, else 127.0.0.1:{CONSOLE_PORT} + "
        "$SMARTCACHE_PORT_OFFSET; now %(default)s)",
    )
    p.add_argument(
        "--tarantool", default=default_tarantool(), metavar="HOST:PORT,...", help="every instance (%(default)s)"
    )
    p.add_argument("--etcd", default=default_etcd(), metavar="URL,...", help="etcd's client endpoints (%(default)s)")
    p.add_argument("--cluster", default=os.environ.get(CLUSTER_VARIABLE) or None, metavar="NAME", help="SC_CLUSTER")
    default_services = os.environ.get(SERVICES_VARIABLE) or (
        f"{default_endpoint()}=http://127.0.0.1:{METRICS_PORT + offset}"
    )
    p.add_argument(
        "--service",
        action="append",
        metavar="ENDPOINT=METRICS_URL",
        help=f"a service instance (repeat for each; default: ${SERVICES_VARIABLE}, comma-separated, else "
        f"{default_services})",
    )
    p.add_argument(
        "--publishers",
        default=default_events_endpoint(),
        metavar="ENDPOINT,...",
        help="the services' events sockets (%(default)s)",
    )
    p.add_argument("--scrape-s", type=float, default=SCRAPE_S, metavar="S", help="how often /metrics is scraped")
    p.add_argument("--timeout", type=float, default=ANSWER_TIMEOUT_S, metavar="S", help="per answer waited for")
    p.set_defaults(default_services=default_services)
    return p


def from_args(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """The settings, or SettingsError naming what is wrong (production without a token included)."""
    r = Environment(os.environ if env is None else env)
    a = parser().parse_args(argv)
    host, port = parse_listen(a.listen)
    texts = a.service or [s for s in a.default_services.split(",") if s.strip()]
    services = tuple(parse_service(t, n) for n, t in enumerate(texts, 1))
    token = token_of(r)
    production = r.get("ENV", "", str) == "production"  # the service's variable; checked by the service
    if production and not token:
        raise SettingsError(
            "production (SMARTCACHE_ENV=production) needs the operator token: set SMARTCACHE_CONSOLE_TOKEN, "
            "SMARTCACHE_CONSOLE_TOKEN_FILE (a secrets file) or SMARTCACHE_METRICS_TOKEN"
        )
    access = Access(
        addresses=[x.strip() for x in a.tarantool.split(",") if x.strip()],
        user=r.get("OPERATOR_USER", "operator", str),
        password=r.secret("OPERATOR_PASSWORD", "operator"),
        timeout_s=a.timeout,
        etcd=etcd.endpoints_of(a.etcd),
        cluster=a.cluster,
    )
    metrics_token = r.secret("METRICS_TOKEN", "")
    tarantool_env = Environment(os.environ if env is None else env, prefix="SC_")
    http_token = tarantool_env.secret("HTTP_TOKEN", "")
    r.check()
    tarantool_env.check()
    return Settings(
        host=host,
        port=port,
        access=access,
        services=services,
        publishers=a.publishers,
        token=token,
        metrics_token=metrics_token,
        http_token=http_token,
        production=production,
        answer_timeout_s=a.timeout,
        scrape_s=a.scrape_s,
    )
