"""The inproc protocol between the broker and its workers (``inproc://workers``).

Both directions batch: one ZeroMQ frame (a msgpack array of byte strings,
``pack``) carries every item ready at that moment, which saves several socket
calls per message (the inproc hop cost more than the work).

Broker to worker: ``[identity, batch]``, the batch in groups of 3::

    ticket, header, body                 one message for one free slot

Worker to broker: one batch frame, in groups of 4::

    [READY, slots:u32, "", ""]           credit: this many slots are free
    [REPLY, ticket, header, body]        reply to send to the client; frees the slot
    [DONE, ticket, "", ""]               done, nothing to send (NO_REPLY); frees the slot
    [FAIL, ticket, error, message]       answer with this transport error; frees the slot
    [ENQUEUE, header, body, ""]          queue a new internal message (prewarm fetches)

Every ticket the broker hands out comes back exactly once as REPLY, DONE or
FAIL (the worker guarantees it; the broker's watchdog counts what did not).
"""

from __future__ import annotations

import struct

import msgpack

ENDPOINT = "inproc://workers"
READY, REPLY, DONE, FAIL, ENQUEUE = b"READY", b"R", b"D", b"F", b"Q"
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
