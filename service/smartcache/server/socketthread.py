"""A thread role that owns ZeroMQ sockets: they are bound on its own thread before ``start`` returns.

The broker and the ``--processes`` proxy share this lifecycle: ``start`` runs the thread and waits
until it has bound its sockets (raising the error when it could not), words to its inproc PAIR
control socket tell it to stop (safe from any thread: the sending socket is made and closed here),
``join`` and ``is_alive`` as a thread's. Sockets never cross threads: the role's are made in its
``run``, which calls :meth:`bound` once they are, or after setting ``error``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import zmq

#: how long a control word waits to be delivered
CONTROL_LINGER_MS = 1000


class SocketThread:
    """``start``, ``join``, ``is_alive``; ``send_control`` for the subclass's ``stop``."""

    def __init__(self, *, context: zmq.Context[Any], name: str, run: Callable[[], None]) -> None:
        self._ctx = context
        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._bound = threading.Event()
        self._control_endpoint = f"inproc://{name}-control-{id(self)}"
        self.error: BaseException | None = None

    def start(self) -> None:
        """Start the thread and wait until its sockets are bound (raises if binding failed)."""
        self._thread.start()
        self._bound.wait()
        if self.error is not None:
            raise self.error

    def bound(self) -> None:
        """On the role's thread: the sockets are bound, or ``error`` says why not."""
        self._bound.set()

    def send_control(self, word: bytes) -> None:
        """One word to the control socket the role bound on ``_control_endpoint``."""
        sock = self._ctx.socket(zmq.PAIR)
        try:
            sock.connect(self._control_endpoint)
            sock.send(word)
        finally:
            sock.close(linger=CONTROL_LINGER_MS)

    def join(self, timeout_s: float | None = None) -> None:
        self._thread.join(timeout_s)

    def is_alive(self) -> bool:
        return self._thread.is_alive()
