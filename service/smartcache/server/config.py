"""Settings: built once from environment variables at start-up and passed down.

Nothing else in the service reads the environment. Every variable, its default,
its range and its meaning are listed in docs/configuration.md.

Every value is checked here, at start, so that a bad one stops the service with
one ``bad_settings`` line naming the variable, rather than a traceback from
deep inside ZeroMQ, prometheus_client or the storage connector later. Every
bad variable is reported at once, so one restart fixes them all: the reader
(`smartcache.settings.Environment`) and the parsers of common values are the
ones the console reads its variables with.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from smartcache.server.parsers import (
    parse_bulkheads,
    parse_data_types,
    parse_directory,
    parse_instance_id,
    parse_log_level,
    parse_max_ages,
    parse_secret_key_file,
    parse_template,
    zmq_endpoint,
)
from smartcache.settings import (
    PREFIX,
    Environment,
    SettingsError,
    parse_bool,
    parse_cluster_name,
    parse_environment,
    parse_etcd_endpoints,
    parse_host,
    parse_host_port_list,
    parse_http_url,
    parse_integer,
    parse_port,
    parse_seconds,
)
from smartcache.wire import REGISTRY, ports

DEFAULT_LISTEN = f"tcp://127.0.0.1:{ports.LISTEN_PORT}"
#: the events PUB socket (issue 16); "none" turns the publisher off
DEFAULT_EVENTS_LISTEN = f"tcp://127.0.0.1:{ports.EVENTS_PORT}"
DEFAULT_TARANTOOL = f"127.0.0.1:{ports.TARANTOOL_PORTS[0]}"
DEFAULT_WORKERS = 100
DEFAULT_WORKER_THREADS = 0  # 0: workers share the broker's event loop (measured fastest)
DEFAULT_QUEUE_CAPACITY = 3000
DEFAULT_METRICS_PORT = ports.METRICS_PORT
DEFAULT_METRICS_ADDR = "127.0.0.1"
DEFAULT_BACKEND_URL = "http://127.0.0.1:8090"
DEFAULT_DRAIN_TIMEOUT_S = 10.0
DEFAULT_STORAGE_CONNECT_TIMEOUT_S = 2.0
DEFAULT_LOG_LEVEL = "info"
DEFAULT_BACKEND_TEMPLATE = "{base}/clients/{client_id}/products/{data_type}"
DEFAULT_BACKEND_CONNECT_TIMEOUT_S = 1.0
DEFAULT_BACKEND_TIMEOUT_S = 5.0
DEFAULT_BACKEND_RETRIES = 2
DEFAULT_BACKEND_MAX_CONNECTIONS = 100
DEFAULT_PREWARM_TYPES = (1, 2, 3, 4)  # accounts, cards, deposits, loans
DEFAULT_PRODUCTS_MAX_AGE_S = 300.0
LEASE_MARGIN_S = 2.0
#: Tarantool refuses longer prewarm leases (lua/smartcache/config.lua, SC_MAX_WAIT_S)
MAX_LEASE_S = 60.0
#: the development default password: production mode refuses it
DEVELOPMENT_PASSWORD = "smartcache"  # noqa: S105 - the documented local default, refused in production
#: bad input answered per second, per client connection and in all (beyond: dropped unanswered, counted)
DEFAULT_BAD_INPUT_PER_PEER_PER_S = 100
DEFAULT_BAD_INPUT_PER_S = 1000
#: NOT_FOUND answers about sessions per second per peer; beyond, its requests naming a session are refused
#: QUEUE_FULL until its second ends (guessing a session id: PROTOCOL.md 4)
DEFAULT_NOT_FOUND_PER_PEER_PER_S = 1000
#: service processes behind one endpoint (service/smartcache/server/processes.py); 1 is the single process, no proxy
DEFAULT_PROCESSES = 1
MAX_PROCESSES = 64
#: routing frames before the client's own identity: 1 from a client, 2 behind the --processes proxy
DEFAULT_ROUTING_HOPS = 1
MAX_ROUTING_HOPS = 2
#: how a secret that is not set shows in redacted settings (set ones show "***")
UNSET = "unset"
#: settings whose value is never logged (session_rekey, a mode, is not a key)
SECRET = re.compile(r"password|token|secret|(?<!re)key", re.IGNORECASE)
#: SMARTCACHE_SESSION_REKEY: off (the default), or lazy while existing data is moved to stored ids
#: (docs/operations.md, "Sessions stored by their raw id: the rekey")
SESSION_REKEY_MODES = ("off", "lazy")
#: the key outside production when none is given: not secret (a warning says so at start)
ZERO_SESSION_KEY = bytes(32)
#: SMARTCACHE_* variables read by other programs (smartcache-cli, make run), not by the service
OTHER_PROGRAMS_VARIABLES = frozenset(
    {
        ports.ENDPOINT_VARIABLE,
        ports.EVENTS_ENDPOINT_VARIABLE,
        ports.PORT_OFFSET_VARIABLE,
        "SMARTCACHE_OPERATOR_USER",
        "SMARTCACHE_OPERATOR_PASSWORD",
        "SMARTCACHE_OPERATOR_PASSWORD_FILE",
        "SMARTCACHE_CURVE_SERVER_KEY_FILE",
        "SMARTCACHE_CURVE_KEY_FILE",
        "SMARTCACHE_VAR",
        "SMARTCACHE_SHARDS",  # make run: service/smartcache/devstack/plan.py SHARDS_VARIABLE
        "SMARTCACHE_PROTOCOL",
        # the operator's console (service/smartcache/console/settings.py); make run's port for it
        "SMARTCACHE_CONSOLE_LISTEN",
        "SMARTCACHE_CONSOLE_SERVICES",
        "SMARTCACHE_CONSOLE_TOKEN",
        "SMARTCACHE_CONSOLE_TOKEN_FILE",
        "SMARTCACHE_CONSOLE_PORT",
    }
)


@dataclass(frozen=True, slots=True)
class Settings:
    listen: str = DEFAULT_LISTEN
    #: the instances to start with (with discovery: until etcd first answers; empty if not given)
    tarantool: tuple[str, ...] = (DEFAULT_TARANTOOL,)
    #: discovery (service/smartcache/server/storage/discovery.py): etcd's client URLs and the cluster's name
    #: (SC_CLUSTER); both set or neither
    etcd: tuple[str, ...] = ()
    cluster: str = ""
    tarantool_user: str = "smartcache"
    tarantool_password: str = DEVELOPMENT_PASSWORD
    workers: int = DEFAULT_WORKERS
    worker_threads: int = DEFAULT_WORKER_THREADS
    queue_capacity: int = DEFAULT_QUEUE_CAPACITY
    metrics_addr: str = DEFAULT_METRICS_ADDR
    metrics_port: int = DEFAULT_METRICS_PORT
    backend_url: str = DEFAULT_BACKEND_URL
    log_level: str = DEFAULT_LOG_LEVEL
    max_body_bytes: int = REGISTRY.max_body_bytes
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    storage_connect_timeout_s: float = DEFAULT_STORAGE_CONNECT_TIMEOUT_S
    instance_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    #: message type name -> most workers busy with it at once
    bulkheads: Mapping[str, int] = field(default_factory=dict)
    backend_template: str = DEFAULT_BACKEND_TEMPLATE
    backend_connect_timeout_s: float = DEFAULT_BACKEND_CONNECT_TIMEOUT_S
    backend_timeout_s: float = DEFAULT_BACKEND_TIMEOUT_S
    backend_retries: int = DEFAULT_BACKEND_RETRIES
    backend_max_connections: int = DEFAULT_BACKEND_MAX_CONNECTIONS
    prewarm_types: tuple[int, ...] = DEFAULT_PREWARM_TYPES
    #: data type -> seconds a prewarmed answer stays fresh (others: products_max_age_s)
    products_max_age: Mapping[int, float] = field(default_factory=dict)
    products_max_age_s: float = DEFAULT_PRODUCTS_MAX_AGE_S
    #: "production" refuses development defaults (see check_production)
    env: str = "development"
    #: production without CURVE, explicitly
    insecure: bool = False
    #: the server's CURVE key pair (zmq certificate file with the secret key); empty: CURVE off
    curve_secret_key_file: str = ""
    #: allowed client public keys, one zmq certificate file each (permissions in its metadata)
    curve_clients_dir: str = ""
    #: bearer token required on /metrics (empty: none)
    metrics_token: str = ""
    bad_input_per_peer_per_s: int = DEFAULT_BAD_INPUT_PER_PEER_PER_S
    bad_input_per_s: int = DEFAULT_BAD_INPUT_PER_S
    not_found_per_peer_per_s: int = DEFAULT_NOT_FOUND_PER_PEER_PER_S
    #: where the event log is published (ZeroMQ PUB); "" = no publisher
    events_listen: str = DEFAULT_EVENTS_LISTEN
    #: service processes behind settings.listen (--processes N); above 1 this process is their parent
    processes: int = DEFAULT_PROCESSES
    #: routing frames a message arrives with before the client's identity (2 in a child of --processes)
    routing_hops: int = DEFAULT_ROUTING_HOPS
    #: the cluster's session key (SMARTCACHE_SESSION_KEY or _FILE): storage keys sessions by HMAC-SHA256 of
    #: the client's id under it (smartcache.wire.sessionkeys); b"": unset, the all-zero key (not in production)
    session_key: bytes = field(default=b"", repr=False)
    #: "lazy": a session not found by its stored id is asked for once more by its raw id, and renamed
    session_rekey: str = "off"

    @property
    def curve(self) -> bool:
        return bool(self.curve_secret_key_file)

    @property
    def discovery(self) -> bool:
        """The instances come from etcd (SMARTCACHE_ETCD and SMARTCACHE_CLUSTER)."""
        return bool(self.etcd and self.cluster)

    @property
    def derive_key(self) -> bytes:
        """The key stored ids are derived with: the session key, or the all-zero one when none is set."""
        return self.session_key or ZERO_SESSION_KEY

    def max_age_ms(self, data_type: int) -> int:
        return int(self.products_max_age.get(data_type, self.products_max_age_s) * 1000)

    @property
    def lease_ms(self) -> int:
        """A prewarm lease outlives one backend call with its retries, plus a margin."""
        return int(_lease_s(self.backend_timeout_s, self.backend_retries) * 1000)

    def redacted(self) -> dict[str, Any]:
        """Every setting by name, for the start-up log and INFO: a secret (password, token, secret, key) as
        "***" when set and "unset" when empty, so that the reader sees which are in use, never their value."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if SECRET.search(f.name):
                out[f.name] = "***" if value not in ("", b"", None) else UNSET
            else:
                out[f.name] = dict(value) if isinstance(value, Mapping) else value
        return out

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read SMARTCACHE_* variables; raises SettingsError naming every bad one."""
        r = Environment(os.environ if env is None else env)
        settings = _build(r)
        r.check()
        return settings


#: the reader the settings are built with (tests/unit/test_docs.py builds them with an empty one to list every
#: variable the service reads)
_Env = Environment


def unknown_variables(env: Mapping[str, str] | None = None) -> list[str]:
    """SMARTCACHE_* variables nobody reads: most likely a typo worth a warning."""
    e = os.environ if env is None else env
    r = Environment(e)
    _build(r)
    return sorted(n for n in e if n.startswith(PREFIX) and n not in r.read and n not in OTHER_PROGRAMS_VARIABLES)


def _build(r: Environment) -> Settings:
    workers = r.get("WORKERS", DEFAULT_WORKERS, parse_integer(1))
    backend_url = r.get("BACKEND_URL", DEFAULT_BACKEND_URL, parse_http_url)
    backend_timeout_s = r.get("BACKEND_TIMEOUT_S", DEFAULT_BACKEND_TIMEOUT_S, parse_seconds(0.01))
    backend_retries = r.get("BACKEND_RETRIES", DEFAULT_BACKEND_RETRIES, parse_integer(0, 10))
    if _lease_s(backend_timeout_s, backend_retries) > MAX_LEASE_S:
        r.fail(
            f"{PREFIX}BACKEND_TIMEOUT_S={backend_timeout_s} x (1 + {PREFIX}BACKEND_RETRIES={backend_retries})"
            f" + {LEASE_MARGIN_S} s must be at most {MAX_LEASE_S} s (the longest prewarm lease Tarantool grants)"
        )
    etcd, cluster = _discovery(r)
    settings = Settings(
        listen=r.get("LISTEN", DEFAULT_LISTEN, zmq_endpoint),
        tarantool=r.get("TARANTOOL", () if cluster else (DEFAULT_TARANTOOL,), parse_host_port_list),
        etcd=etcd,
        cluster=cluster,
        tarantool_user=r.get("TARANTOOL_USER", "smartcache", str),
        tarantool_password=r.secret("TARANTOOL_PASSWORD", DEVELOPMENT_PASSWORD),
        workers=workers,
        worker_threads=r.get("WORKER_THREADS", DEFAULT_WORKER_THREADS, parse_integer(0, workers, "SMARTCACHE_WORKERS")),
        queue_capacity=r.get("QUEUE_CAPACITY", DEFAULT_QUEUE_CAPACITY, parse_integer(1)),
        metrics_addr=r.get("METRICS_ADDR", DEFAULT_METRICS_ADDR, parse_host),
        metrics_port=r.get("METRICS_PORT", DEFAULT_METRICS_PORT, parse_port(allow_any=True)),
        backend_url=backend_url,
        log_level=r.get("LOG_LEVEL", DEFAULT_LOG_LEVEL, parse_log_level),
        max_body_bytes=r.get("MAX_BODY_BYTES", REGISTRY.max_body_bytes, parse_integer(64, REGISTRY.max_body_bytes)),
        drain_timeout_s=r.get("DRAIN_TIMEOUT_S", DEFAULT_DRAIN_TIMEOUT_S, parse_seconds(0)),
        storage_connect_timeout_s=r.get(
            "STORAGE_CONNECT_TIMEOUT_S", DEFAULT_STORAGE_CONNECT_TIMEOUT_S, parse_seconds(0.1)
        ),
        instance_id=r.get("INSTANCE_ID", f"{socket.gethostname()}-{os.getpid()}", parse_instance_id),
        bulkheads=r.get("BULKHEADS", parse_bulkheads("", workers), lambda spec: parse_bulkheads(spec, workers)),
        backend_template=r.get("BACKEND_TEMPLATE", DEFAULT_BACKEND_TEMPLATE, lambda t: parse_template(t, backend_url)),
        backend_connect_timeout_s=r.get(
            "BACKEND_CONNECT_TIMEOUT_S", DEFAULT_BACKEND_CONNECT_TIMEOUT_S, parse_seconds(0.01)
        ),
        backend_timeout_s=backend_timeout_s,
        backend_retries=backend_retries,
        backend_max_connections=r.get("BACKEND_MAX_CONNECTIONS", DEFAULT_BACKEND_MAX_CONNECTIONS, parse_integer(1)),
        prewarm_types=r.get("PREWARM_TYPES", DEFAULT_PREWARM_TYPES, parse_data_types),
        products_max_age=r.get("PRODUCTS_MAX_AGE", {}, parse_max_ages),
        products_max_age_s=r.get("PRODUCTS_MAX_AGE_S", DEFAULT_PRODUCTS_MAX_AGE_S, parse_seconds(0)),
        env=r.get("ENV", "development", parse_environment),
        insecure=r.get("INSECURE", False, parse_bool),
        curve_secret_key_file=r.get("CURVE_SECRET_KEY_FILE", "", parse_secret_key_file),
        curve_clients_dir=r.get("CURVE_CLIENTS_DIR", "", parse_directory),
        metrics_token=r.secret("METRICS_TOKEN", ""),
        bad_input_per_peer_per_s=r.get("BAD_INPUT_PER_PEER_PER_S", DEFAULT_BAD_INPUT_PER_PEER_PER_S, parse_integer(1)),
        bad_input_per_s=r.get("BAD_INPUT_PER_S", DEFAULT_BAD_INPUT_PER_S, parse_integer(1)),
        not_found_per_peer_per_s=r.get("NOT_FOUND_PER_PEER_PER_S", DEFAULT_NOT_FOUND_PER_PEER_PER_S, parse_integer(1)),
        events_listen=r.get("EVENTS_LISTEN", DEFAULT_EVENTS_LISTEN, parse_events_listen),
        processes=r.get("PROCESSES", DEFAULT_PROCESSES, parse_integer(1, MAX_PROCESSES)),
        routing_hops=r.get("ROUTING_HOPS", DEFAULT_ROUTING_HOPS, parse_integer(1, MAX_ROUTING_HOPS)),
        session_key=r.session_key(),
        session_rekey=r.get("SESSION_REKEY", "off", parse_session_rekey),
    )
    _check_security(r, settings)
    if settings.events_listen == settings.listen and not settings.listen.endswith((":0", ":*")):
        r.fail(f"{PREFIX}EVENTS_LISTEN={settings.events_listen!r} is {PREFIX}LISTEN too: give the events another")
    return settings


def _discovery(r: Environment) -> tuple[tuple[str, ...], str]:
    """SMARTCACHE_CLUSTER turns discovery on and needs SMARTCACHE_ETCD. SMARTCACHE_ETCD alone is the CLI's
    (smartcache-cli cluster status): the service then keeps to SMARTCACHE_TARANTOOL, as before."""
    raw_etcd = r.get(ports.ETCD_VARIABLE.removeprefix(PREFIX), "", str)
    cluster = r.get(ports.CLUSTER_VARIABLE.removeprefix(PREFIX), "", parse_cluster_name)
    if not cluster:
        return (), ""
    if not raw_etcd:
        r.fail(f"{ports.CLUSTER_VARIABLE} needs {ports.ETCD_VARIABLE}: the etcd endpoints to discover the instances in")
        return (), ""
    try:
        return parse_etcd_endpoints(raw_etcd), cluster
    except SettingsError as e:
        r.fail(f"{ports.ETCD_VARIABLE}={raw_etcd!r}: {e}")
        return (), ""


def parse_events_listen(raw: str) -> str:
    """SMARTCACHE_EVENTS_LISTEN: an endpoint to bind like SMARTCACHE_LISTEN, or "none" (no publisher)."""
    return "" if raw == "none" else zmq_endpoint(raw)


def parse_session_rekey(raw: str) -> str:
    """SMARTCACHE_SESSION_REKEY: off, or lazy (the migration of sessions stored by their raw id)."""
    if raw not in SESSION_REKEY_MODES:
        raise SettingsError(f"must be one of {', '.join(SESSION_REKEY_MODES)}")
    return raw


def _is_local(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _check_security(r: Environment, s: Settings) -> None:
    """CURVE needs both its files; production mode refuses every development default (SECURITY.md)."""
    if bool(s.curve_secret_key_file) != bool(s.curve_clients_dir):
        r.fail(f"{PREFIX}CURVE_SECRET_KEY_FILE and {PREFIX}CURVE_CLIENTS_DIR go together: set both or neither")
    if s.curve and s.processes > 1:
        r.fail(
            f"{PREFIX}PROCESSES={s.processes} (--processes) with {PREFIX}CURVE_SECRET_KEY_FILE: "
            "CURVE needs one process per endpoint (the processes' proxy cannot carry each client's key, "
            "which decides what it may send); unset one"
        )
    if s.env != "production":
        return
    if s.tarantool_password == DEVELOPMENT_PASSWORD:
        r.fail(f"production: {PREFIX}TARANTOOL_PASSWORD (or _FILE) is the development default; set a real one")
    if not s.curve and not s.insecure:
        r.fail(
            f"production: CURVE is off ({PREFIX}CURVE_SECRET_KEY_FILE unset); "
            f"set it, or {PREFIX}INSECURE=1 to run without encryption on purpose"
        )
    if not s.session_key and not any(e.startswith(f"{PREFIX}SESSION_KEY") for e in r.errors):  # else named bad
        r.fail(
            f"production: {PREFIX}SESSION_KEY (or _FILE) is unset: sessions would be stored under the all-zero key; "
            "set the cluster's key (64 hex characters, the same for every service instance: docs/operations.md)"
        )
    elif s.session_key == ZERO_SESSION_KEY:
        r.fail(f"production: {PREFIX}SESSION_KEY is all zeros, the development key; set a random one")
    if not _is_local(s.metrics_addr) and not s.metrics_token:
        r.fail(f"production: metrics on {s.metrics_addr} (not local) need {PREFIX}METRICS_TOKEN (or _FILE)")


def _lease_s(backend_timeout_s: float, backend_retries: int) -> float:
    return backend_timeout_s * (1 + backend_retries) + LEASE_MARGIN_S
