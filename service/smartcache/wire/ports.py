"""The default ports: the one table the service's defaults, ``make run`` and ``smartcache-cli`` share.

``make run`` starts every process on these ports, each moved by
``$SMARTCACHE_PORT_OFFSET`` (to run a second stack beside the first), and
smartcache-cli talks to that stack by default: the same variable moves its
default endpoints too. A deployment sets its endpoints explicitly
(``SMARTCACHE_ENDPOINT``, ``SMARTCACHE_EVENTS_ENDPOINT``, ``SMARTCACHE_TARANTOOL``,
``SMARTCACHE_ETCD``).
"""

from __future__ import annotations

import os

PORT_OFFSET_VARIABLE = "SMARTCACHE_PORT_OFFSET"
ENDPOINT_VARIABLE = "SMARTCACHE_ENDPOINT"
EVENTS_ENDPOINT_VARIABLE = "SMARTCACHE_EVENTS_ENDPOINT"
TARANTOOL_VARIABLE = "SMARTCACHE_TARANTOOL"
ETCD_VARIABLE = "SMARTCACHE_ETCD"
#: the storage cluster's name (its etcd prefix, Tarantool's SC_CLUSTER): the service's discovery, the CLI
CLUSTER_VARIABLE = "SMARTCACHE_CLUSTER"

#: the service's ZeroMQ endpoint for front servers (SMARTCACHE_LISTEN)
LISTEN_PORT = 5555
#: the service's events PUB socket (SMARTCACHE_EVENTS_LISTEN)
EVENTS_PORT = 5556
#: Prometheus metrics and /health (SMARTCACHE_METRICS_PORT)
METRICS_PORT = 9105
#: the operator's console, smartcache-console (--listen; make run's SMARTCACHE_CONSOLE_PORT)
CONSOLE_PORT = 9110
#: make run's three Tarantool instances: binary protocol, and each one's HTTP endpoint
TARANTOOL_PORTS = (3301, 3302, 3303)
TARANTOOL_HTTP_PORTS = (8301, 8302, 8303)
#: make run's three etcd members: each one's client port (what SC_ETCD lists) and peer port (raft)
#: member n on 2n79 and 2n80 (etcd's own defaults for the first)
ETCD_PORTS = (2379, 2479, 2579)
ETCD_PEER_PORTS = (2380, 2480, 2580)
#: make run's simulated core backend
BACKEND_PORT = 8090


#: the highest offset that keeps every default port above within 1..65535 (make run's check uses it too)
MAX_PORT_OFFSET = 65535 - max(
    LISTEN_PORT, EVENTS_PORT, METRICS_PORT, CONSOLE_PORT, BACKEND_PORT,
    *TARANTOOL_PORTS, *TARANTOOL_HTTP_PORTS, *ETCD_PORTS, *ETCD_PEER_PORTS,
)  # fmt: skip


class PortOffsetError(ValueError):
    """``$SMARTCACHE_PORT_OFFSET`` is not a whole number 0..MAX_PORT_OFFSET; the message says what it is and what
    is expected. The programs refuse to start on it (exit 2) rather than ignore it or use ports past 65535."""


def port_offset() -> int:
    """``$SMARTCACHE_PORT_OFFSET`` as a number: 0 when unset or empty; raises PortOffsetError when it is not a
    whole number 0..MAX_PORT_OFFSET (``abc`` was ignored, ``99999`` moved 5555 to 105554)."""
    text = os.environ.get(PORT_OFFSET_VARIABLE, "").strip()
    if not text:
        return 0
    if not text.isdecimal() or int(text) > MAX_PORT_OFFSET:
        raise PortOffsetError(
            f"{PORT_OFFSET_VARIABLE}={text!r}: a whole number 0..{MAX_PORT_OFFSET} is expected (it is added to every "
            f"default port, the highest of which is {65535 - MAX_PORT_OFFSET}: ports end at 65535)"
        )
    return int(text)


def default_endpoint() -> str:
    """``$SMARTCACHE_ENDPOINT``, else make run's: port 5555 + ``$SMARTCACHE_PORT_OFFSET``."""
    return os.environ.get(ENDPOINT_VARIABLE) or f"tcp://127.0.0.1:{LISTEN_PORT + port_offset()}"


def default_events_endpoint() -> str:
    """``$SMARTCACHE_EVENTS_ENDPOINT``, else make run's: port 5556 + ``$SMARTCACHE_PORT_OFFSET``."""
    return os.environ.get(EVENTS_ENDPOINT_VARIABLE) or f"tcp://127.0.0.1:{EVENTS_PORT + port_offset()}"


def default_tarantool() -> str:
    """``$SMARTCACHE_TARANTOOL``, else make run's three instances (3301-3303 + ``$SMARTCACHE_PORT_OFFSET``)."""
    offset = port_offset()
    return os.environ.get(TARANTOOL_VARIABLE) or ",".join(f"127.0.0.1:{p + offset}" for p in TARANTOOL_PORTS)


def default_etcd() -> str:
    """``$SMARTCACHE_ETCD``, else make run's three members (2379, 2479, 2579 + ``$SMARTCACHE_PORT_OFFSET``)."""
    offset = port_offset()
    return os.environ.get(ETCD_VARIABLE) or ",".join(f"http://127.0.0.1:{p + offset}" for p in ETCD_PORTS)
