"""A worker on its loop: READY at once, exactly one REPLY, DONE or FAIL per ticket whatever the handler does."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from structlog.testing import capture_logs

from smartcache.server.broker import inproc
from smartcache.server.config import Settings
from smartcache.server.handlers import Context, Handler, Request
from smartcache.server.handlers.devices import HANDLERS as DEVICES
from smartcache.server.metrics import Metrics
from smartcache.server.work import workers
from smartcache.server.work.workers import Worker
from smartcache.wire import (
    FLAG_NO_REPLY,
    NO_SESSION,
    STATUS,
    Header,
    decode_body,
    decode_header,
    encode_header,
)
from smartcache.wire.errors import StorageUnavailable
from tests.unit.stubs import SESSION, StubStorage, body, header, sample, until

SLOTS = 4
Item = tuple[bytes, bytes, bytes, bytes]


@dataclass
class BrokerSide:
    """The broker's end of the worker's direct link: every batch the worker sends, kept."""

    batches: list[list[bytes]] = field(default_factory=list)

    def __call__(self, wid: bytes, items: list[bytes]) -> None:
        assert wid == b"w0"
        assert len(items) % inproc.TO_BROKER == 0
        self.batches.append(list(items))

    @property
    def items(self) -> list[Item]:
        return [(b[i], b[i + 1], b[i + 2], b[i + 3]) for b in self.batches for i in range(0, len(b), inproc.TO_BROKER)]

    def answers(self, ticket: bytes) -> list[Item]:
        """Every REPLY, DONE or FAIL for this ticket."""
        return [it for it in self.items if it[0] in (inproc.REPLY, inproc.DONE, inproc.FAIL) and it[1] == ticket]

    async def answer(self, ticket: bytes) -> Item:
        """Its answer, once it comes."""
        await until(lambda: self.answers(ticket), what=f"an answer for ticket {inproc.TICKET.unpack(ticket)}")
        return self.answers(ticket)[0]


@dataclass
class Running:
    worker: Worker
    broker: BrokerSide
    storage: StubStorage
    metrics: Metrics
    task: asyncio.Task[None]

    def give(self, *messages: tuple[bytes, bytes, bytes]) -> list[bytes]:
        """Hand the worker one batch, as the broker does; returns the tickets."""
        self.worker.link.to_worker([f for m in messages for f in m])  # type: ignore[union-attr]
        return [m[0] for m in messages]

    async def stop(self) -> None:
        self.worker.stop()
        await asyncio.wait_for(self.task, timeout=workers.STOP_GRACE_S + 5)


_seq = iter(range(1, 10**9))


def message(
    type_name: str = "DEVICE_LOOKUP",
    fields: Mapping[str, Any] | None = None,
    *,
    left_ms: int = 2000,
    **header_fields: Any,
) -> tuple[bytes, bytes, bytes]:
    """(ticket, header, body) of one message as the broker hands it out."""
    seq = next(_seq)
    header_fields.setdefault("request_id", seq)
    fields = {"device_id": "d-1"} if fields is None else fields
    return inproc.TICKET.pack(seq, left_ms), header(type_name, **header_fields), body(fields)


@contextlib.asynccontextmanager
async def running(
    handlers: Mapping[str, Handler], storage: StubStorage | None = None, slots: int = SLOTS
) -> AsyncIterator[Running]:
    """A direct worker on this loop with a stub storage, READY announced; stopped (and awaited) after."""
    storage = storage or StubStorage()
    metrics = Metrics()
    worker = Worker(
        index=0,
        slots=slots,
        settings=Settings(),
        context=None,  # type: ignore[arg-type]  # a direct worker makes no socket
        metrics=metrics,
        handlers=dict(handlers),
        direct=True,
        storage=lambda: storage,  # type: ignore[arg-type,return-value]
    )
    broker = BrokerSide()
    assert worker.link is not None
    worker.link.to_broker = broker
    task = asyncio.create_task(worker.run())
    r = Running(worker, broker, storage, metrics, task)
    await until(lambda: broker.items or task.done(), what="READY")
    try:
        yield r
    finally:
        if not task.done():
            await r.stop()


def scenario(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def returning(result: dict[str, Any]) -> Handler:
    async def handler(req: Request, ctx: Context) -> dict[str, Any]:
        return dict(result)

    return handler


async def forever(req: Request, ctx: Context) -> dict[str, Any]:
    """A handler that never answers by itself (it waits without touching storage)."""
    await asyncio.get_running_loop().create_future()
    raise AssertionError("unreachable")


# -- start --------------------------------------------------------------------------------


def test_a_worker_announces_ready_with_its_slots_at_once_even_with_storage_down() -> None:
    async def test() -> None:
        storage = StubStorage(connected=False)
        async with running({}, storage, slots=7) as r:
            assert r.broker.items == [(inproc.READY, inproc.CREDIT.pack(7), b"", b"")]
            assert storage.started

    scenario(test)


# -- one answer per ticket ------------------------------------------------------------------


def test_each_message_of_a_batch_gets_exactly_one_reply_for_its_ticket() -> None:
    async def test() -> None:
        storage = StubStorage(default={"status": "OK", "client_id": "c-1"})
        async with running(DEVICES, storage) as r:
            tickets = r.give(*(message(request_id=rid) for rid in (11, 12, 13)))
            for ticket, rid in zip(tickets, (11, 12, 13), strict=True):
                kind, _, h, b = await r.broker.answer(ticket)
                assert kind == inproc.REPLY
                assert decode_header(h).request_id == rid
                assert decode_body(b) == {"status": STATUS["OK"], "client_id": "c-1"}
            await r.stop()
            assert all(len(r.broker.answers(t)) == 1 for t in tickets)
            assert sample(r.metrics.messages, type="device_lookup", outcome="ok") == 3

    scenario(test)


def test_a_mixed_batch_gets_exactly_one_answer_per_ticket_on_every_path() -> None:
    async def broken(req: Request, ctx: Context) -> dict[str, Any]:
        raise RuntimeError("bug")

    async def test() -> None:
        handlers = {
            "DEVICE_LOOKUP": returning({"status": "OK"}),
            "CACHE_GET": broken,
            "SESSION_LIST": forever,
            "DEVICE_BIND": DEVICES["DEVICE_BIND"],  # through storage, which hangs
        }
        async with running(handlers, StubStorage().will_hang()) as r:
            batch = {
                "reply": message(),
                "internal": message("CACHE_GET", {"key": "k"}),
                "expired": message("SESSION_LIST", {"client_id": "c-1"}, left_ms=30),
                "outcome unknown": message("DEVICE_BIND", {"device_id": "d-1", "client_id": "c-1"}, left_ms=30),
                "done": message(flags=FLAG_NO_REPLY),
            }
            r.give(*batch.values())
            got = {name: await r.broker.answer(m[0]) for name, m in batch.items()}
            await r.stop()
            assert {name: (a[0], a[2] if a[0] == inproc.FAIL else b"") for name, a in got.items()} == {
                "reply": (inproc.REPLY, b""),
                "internal": (inproc.FAIL, b"INTERNAL"),
                "expired": (inproc.FAIL, b"EXPIRED"),
                "outcome unknown": (inproc.FAIL, b"OUTCOME_UNKNOWN"),
                "done": (inproc.DONE, b""),
            }
            assert all(len(r.broker.answers(m[0])) == 1 for m in batch.values())

    scenario(test)


def test_answers_ready_in_the_same_loop_turn_leave_in_one_batch() -> None:
    async def test() -> None:
        async with running({"DEVICE_LOOKUP": returning({"status": "OK"})}) as r:
            tickets = r.give(message(), message(), message())
            await r.broker.answer(tickets[-1])
            assert len(r.broker.batches) == 2  # READY, then the three answers together
            assert len(r.broker.batches[1]) == 3 * inproc.TO_BROKER
            assert {it[1] for it in r.broker.items[1:]} == set(tickets)

    scenario(test)


def test_a_bad_request_is_a_reply_not_a_failure() -> None:
    async def test() -> None:
        async with running(DEVICES) as r:
            [ticket] = r.give(message(fields={}))
            kind, _, _, b = await r.broker.answer(ticket)
            assert kind == inproc.REPLY
            assert decode_body(b)["status"] == STATUS["BAD_REQUEST"]
            assert r.storage.calls == []

    scenario(test)


def test_a_storage_failure_is_answered_fail_with_its_transport_error() -> None:
    async def test() -> None:
        storage = StubStorage().will_raise(StorageUnavailable("no leader"))
        async with running(DEVICES, storage) as r:
            [ticket] = r.give(message())
            assert await r.broker.answer(ticket) == (inproc.FAIL, ticket, b"STORAGE_UNAVAILABLE", b"no leader")

    scenario(test)


def test_a_handler_that_raises_is_answered_internal_with_an_error_id_and_no_request_data() -> None:
    async def broken(req: Request, ctx: Context) -> dict[str, Any]:
        raise RuntimeError(f"cannot serve {req.body['device_id']}")

    async def test() -> None:
        async with running({"DEVICE_LOOKUP": broken}) as r:
            with capture_logs() as logs:
                [ticket] = r.give(message(fields={"device_id": "secret-device-42"}, request_id=99))
                kind, _, error, text = await r.broker.answer(ticket)
            assert (kind, error) == (inproc.FAIL, b"INTERNAL")
            found = re.fullmatch(rb"internal error ([0-9a-f]{12})", text)
            assert found is not None, text
            assert b"secret-device-42" not in text
            [logged] = [e for e in logs if e["event"] == "handler_failed"]
            assert logged["error_id"] == found[1].decode()  # the client's error id finds the log line
            assert logged["request_id"] == 99
            assert sample(r.metrics.internal_errors) == 1

    scenario(test)


def test_a_message_whose_answer_cannot_be_built_is_still_answered_internal() -> None:
    async def test() -> None:
        async with running(DEVICES) as r:
            # A type id the registry does not know (the broker never lets one through): even naming it fails.
            ticket = inproc.TICKET.pack(next(_seq), 2000)
            r.give((ticket, encode_header(Header.request(999, request_id=1)), body()))
            kind, _, error, _ = await r.broker.answer(ticket)
            assert (kind, error) == (inproc.FAIL, b"INTERNAL")

    scenario(test)


def test_a_message_that_never_reached_storage_is_answered_expired_at_its_deadline() -> None:
    async def test() -> None:
        async with running({"DEVICE_LOOKUP": forever}) as r:
            [ticket] = r.give(message(left_ms=30))
            kind, _, error, _ = await r.broker.answer(ticket)
            assert (kind, error) == (inproc.FAIL, b"EXPIRED")
            assert r.storage.calls == []

    scenario(test)


def test_a_message_cancelled_while_storage_had_it_is_answered_outcome_unknown() -> None:
    async def test() -> None:
        storage = StubStorage().will_hang()
        async with running(DEVICES, storage) as r:
            [ticket] = r.give(message(left_ms=30))
            kind, _, error, _ = await r.broker.answer(ticket)
            assert (kind, error) == (inproc.FAIL, b"OUTCOME_UNKNOWN")
            [call] = storage.calls
            assert call.job is not None
            assert (call.job.sent, call.job.returned) == (1, 1)  # the cancelled call counts as returned
            assert storage.hanging == 0

    scenario(test)


def test_the_deadline_sweep_leaves_messages_with_time_left_alone() -> None:
    async def test() -> None:
        gate = asyncio.Event()

        async def gated(req: Request, ctx: Context) -> dict[str, Any]:
            await gate.wait()
            return {"status": "OK"}

        async with running({"DEVICE_LOOKUP": gated, "CACHE_GET": forever}) as r:
            [long_lived] = r.give(message(left_ms=60_000))
            [short] = r.give(message("CACHE_GET", {"key": "k"}, left_ms=30))
            await r.broker.answer(short)  # swept
            assert r.broker.answers(long_lived) == []
            gate.set()
            assert (await r.broker.answer(long_lived))[0] == inproc.REPLY

    scenario(test)


def test_a_no_reply_message_is_answered_done() -> None:
    async def test() -> None:
        async with running({"DEVICE_LOOKUP": returning({"status": "OK"})}) as r:
            [ticket] = r.give(message(flags=FLAG_NO_REPLY))
            assert await r.broker.answer(ticket) == (inproc.DONE, ticket, b"", b"")
            assert sample(r.metrics.messages, type="device_lookup", outcome="ok") == 1

    scenario(test)


# -- internal messages ----------------------------------------------------------------------


def test_enqueue_sends_an_enqueue_item_with_a_header_and_body_of_its_own() -> None:
    async def test() -> None:
        async def prewarming(req: Request, ctx: Context) -> dict[str, Any]:
            ctx.enqueue("PREWARM_FETCH", {"client_id": "c-1", "data_type": 2}, SESSION)
            return {"status": "OK"}

        async with running({"DEVICE_LOOKUP": prewarming}) as r:
            [ticket] = r.give(message())
            await r.broker.answer(ticket)
            [(_, h, b, empty)] = [it for it in r.broker.items if it[0] == inproc.ENQUEUE]
            fetch = decode_header(h)
            assert (fetch.type, fetch.session_id, fetch.flags, fetch.request_id) == (90, SESSION, 0, 1)
            assert decode_body(b) == {"client_id": "c-1", "data_type": 2}
            assert empty == b""
            r.worker.enqueue("PREWARM_FETCH", {"client_id": "c-2", "data_type": 1})
            await until(lambda: len([it for it in r.broker.items if it[0] == inproc.ENQUEUE]) == 2)
            second = decode_header([it for it in r.broker.items if it[0] == inproc.ENQUEUE][1][1])
            assert (second.request_id, second.session_id) == (2, NO_SESSION)  # numbered per worker

    scenario(test)


# -- stop ------------------------------------------------------------------------------------


def test_stop_lets_a_running_message_end_and_sends_its_answer_before_closing_storage() -> None:
    async def test() -> None:
        started, gate = asyncio.Event(), asyncio.Event()

        async def slow(req: Request, ctx: Context) -> dict[str, Any]:
            started.set()
            await gate.wait()
            return {"status": "OK"}

        async with running({"DEVICE_LOOKUP": slow}) as r:
            [ticket] = r.give(message())
            await started.wait()
            r.worker.stop()
            # Worker has no public "stopping": its private event says the stop began.
            await until(lambda: r.worker._stopping is not None and r.worker._stopping.is_set(), what="stop begun")
            assert not r.task.done()
            assert not r.storage.closed  # waiting for the running message
            gate.set()
            await asyncio.wait_for(r.task, timeout=workers.STOP_GRACE_S)
            assert r.broker.answers(ticket)[0][0] == inproc.REPLY
            assert r.storage.closed

    scenario(test)


def test_stop_waits_no_longer_than_its_grace_for_a_message_that_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "STOP_GRACE_S", 0.05)

    async def test() -> None:
        started = asyncio.Event()

        async def hangs(req: Request, ctx: Context) -> dict[str, Any]:
            started.set()
            return await forever(req, ctx)

        async with running({"DEVICE_LOOKUP": hangs}) as r:
            r.give(message(left_ms=60_000))
            await started.wait()
            r.worker.stop()
            await until(r.task.done, what="run returned")
            assert r.storage.closed

    scenario(test)
