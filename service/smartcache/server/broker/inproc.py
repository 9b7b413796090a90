"""The inproc protocol between the broker and its workers (``inproc://workers``).

Both directions batch: one ZeroMQ frame (a msgpack array of byte strings,
``pack``) carries every item ready at that moment, which saves several socket
calls per message (the inproc hop cost more than the work).

Broker to worker: ``[identity, batch]``, the batch in groups of 3::

    ticket, header, body                 one message for one free slot

Worker to broker: one batch frame, in groups of 4::

    [READY, slots:u32, "", ""]           credit: this many slots are free
    [REPLY, ticket, header, body]        reply to send to the client; frees the slot
    [MISS, ticket, header, body]         a REPLY saying a session is not live (the NOT_FOUND throttle, misses.py)
    [DONE, ticket, "", ""]               done, nothing to send (NO_REPLY); frees the slot
    [FAIL, ticket, error, message]       answer with this transport error; frees the slot
    [ENQUEUE, header, body, ""]          queue a new internal message (prewarm fetches)

Every ticket the broker hands out comes back exactly once as REPLY, DONE or
FAIL (the worker guarantees it; the broker's watchdog counts what did not).

A worker on the broker's own event loop (the default, ``worker_threads = 0``)
speaks the same items without the socket: a :class:`Direct` link hands each
batch over as the list itself, so no batch is packed, sent, woken up for and
unpacked (measured: the socket hop was about a tenth of the service's CPU per
request at W=16).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import msgpack

ENDPOINT = "inproc://workers"
READY, REPLY, MISS, DONE, FAIL, ENQUEUE = b"READY", b"R", b"M", b"D", b"F", b"Q"
#: ticket frame: holder sequence number, milliseconds of lifetime left
TICKET = struct.Struct("!QI")
CREDIT = struct.Struct("!I")
#: fields per item: broker -> worker, worker -> broker
TO_WORKER, TO_BROKER = 3, 4


def pack(items: list[bytes]) -> bytes:
    """Many byte strings in one frame (a msgpack array): one socket call instead of one per frame."""
    return msgpack.packb(items, use_bin_type=True)  # type: ignore[no-any-return]


def unpack(frame: bytes) -> list[bytes]:
    return msgpack.unpackb(frame, raw=True, use_list=True)  # type: ignore[no-any-return]


class Direct:
    """The worker link without a socket, for a worker on the broker's loop: the same batches, as lists.

    The worker sets ``to_worker`` (take a batch from the broker) when it is
    made; the broker sets ``to_broker`` (take a worker's batch, under the
    worker's identity) before the worker runs. Both are called on the one
    loop, never from inside each other: the broker hands batches over in its
    turn, the worker answers from a callback of its own.
    """

    def __init__(self, identity: bytes, to_worker: Callable[[list[bytes]], None]) -> None:
        self.identity = identity
        self.to_worker = to_worker
        self.to_broker: Callable[[bytes, list[bytes]], None] | None = None

    def send(self, items: list[bytes]) -> None:
        """A batch from the worker to the broker."""
        if self.to_broker is None:
            raise RuntimeError(f"worker {self.identity!r}: direct link used before the broker attached it")
        self.to_broker(self.identity, items)
