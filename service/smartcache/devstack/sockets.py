"""Which ports are free, and who listens on one (Linux /proc): make run's checks and the tests' free ports.

A child is ready only when the process we started is the one listening on its ports
(`listens`: /proc/net/tcp and /proc/<pid>/fd; psutil would do it too, but is not worth a
dependency for one function), so another program answering on the same port can never pass
for it. A port is free when a server could bind it now, binding as the servers do
(SO_REUSEADDR: a TIME-WAIT they could bind over does not count).
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import threading
from pathlib import Path

_TCP_LISTEN = "0A"  # socket states in /proc/net/tcp
_TCP_TIME_WAIT = "06"
_TCP_CLOSE = "07"  # bound, neither listening nor connected

#: ports free_port handed out in this process: never twice
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()
_random = random.Random()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (Linux's default if unreadable)."""
    with contextlib.suppress(OSError, ValueError):
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    return 32768, 60999


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now, below the ephemeral range, not handed out before here.

    Below the ephemeral range because a port the kernel chose (bind to 0) is one it may give, a moment
    later, to an outgoing connection of any process as its local port: a server started on it then
    fails with "Address already in use" (it did, once in CI: make run's metrics port was taken by a
    connection between the children it had just started). Ports below the range are only ever taken
    by a bind that names them.
    """
    highest = ephemeral_range()[0] - 1
    with _handed_out_lock:
        while True:
            port = _random.randint(10_000, highest)
            if port in _handed_out:
                continue
            with socket.socket() as s:  # no SO_REUSEADDR: a port in TIME_WAIT is not taken either
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could bind host:port now: a bind with SO_REUSEADDR, as Tarantool, etcd, ZeroMQ and
    Python's servers all set it.

    So a port held only by TIME-WAIT sockets that had SO_REUSEADDR (a server's accepted connections, closed
    by the server first) is free, and one held by a TIME-WAIT socket without it (the local end of an outgoing
    connection, most often on a port of the ephemeral range) is not: Linux lets a bind pass a TIME-WAIT socket
    only when both set the flag. Measured here (Linux 6.18, Tarantool 2.6.0): Tarantool's bind fails on the
    second kind ("failed to bind ... Address already in use") and passes on the first, as this check says
    (tests/integration/test_devstack.py).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def tcp_states(port: int) -> set[str]:
    """The states of the TCP sockets whose local port is port (Linux: /proc/net/tcp*, this network namespace)."""
    states = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for row in Path(table).read_text().splitlines()[1:]:
                f = row.split()
                if int(f[1].rsplit(":", 1)[1], 16) == port:
                    states.add(f[3])
    return states


def port_holders(port: int) -> str:
    """What holds a port that port_is_free finds taken, in words."""
    states = tcp_states(port)
    if _TCP_LISTEN in states:
        return "a listening socket, another make run?"
    if states - {_TCP_TIME_WAIT, _TCP_CLOSE}:
        return "the local end of a connection"
    if _TCP_TIME_WAIT in states:
        return "TIME-WAIT sockets of closed connections that did not set SO_REUSEADDR (outgoing ones), gone within 60 s"
    return "a socket bound to it" if states else "a socket /proc/net/tcp does not show (gone since?)"


def listens(pid: int, port: int) -> bool:
    """Whether process pid holds a listening TCP socket on port (Linux: /proc/net/tcp* and /proc/<pid>/fd)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for row in Path(table).read_text().splitlines()[1:]:
                f = row.split()
                if f[3] == _TCP_LISTEN and int(f[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{f[9]}]")
    if not inodes:
        return False
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) in inodes:
                    return True
    return False
