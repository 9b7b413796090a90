"""Client threads that load the cluster through the service and record a history.

* **set** — SESSION_CREATE of new sessions (ids chosen here): at the end every
  acknowledged one must exist.
* **register** — read-modify-write of a few hot sessions: SESSION_GET (its
  result: the rev and the log's last element), then SESSION_UPDATE with
  ``expected_rev`` (kept in ``meta``) and ``data = {"log": the log read + [this
  op's id]}``. The final session's log is the whole chain of applied updates in
  order (Jepsen's list-append on one key), so an acknowledged update must be in
  it at the position its new revision says, and a failed one must not be.
* **counter** — COUNTER_ADD of 1: acknowledged ≤ final ≤ acknowledged + unknown,
  and no two acknowledged adds returned the same value.
* **cache** — CACHE_PUT of new keys, an *asynchronous* space: lost ones are
  counted, not failed (what we do not guarantee).

Every write carries an idempotency key and is tried up to ``ATTEMPTS`` times
while each refusal says "not executed", or the key makes a repeat safe: what
the client library does with ``retries``, done here so that each attempt's
answer lands in the history (the library raises only the last one).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import uuid
from typing import Any

from smartcache.client import Client, Reply
from smartcache.wire import REGISTRY
from smartcache.wire.errors import RequestError, RequestTimeout
from tests.faults.history import FAIL, OK, UNKNOWN, Attempt, History, Op

ATTEMPTS = 3
BACKOFF_S = (0.1, 0.3)
#: the client waits longer than the service's lifetime (2 s for these types): the service answers first
ATTEMPT_TIMEOUT_S = 3.0
PAUSE_S = 0.02  # between one worker's operations: the machine has 2 cores and other tests run on it
NOT_EXECUTED = frozenset(e for e, done in REGISTRY.executed.items() if done == "no")
SESSION_TTL_S = 3600


class Worker(threading.Thread):
    """One client (its own socket) of one service, doing one workload until stopped."""

    workload = ""

    def __init__(self, *, index: int, endpoint: str, service: str, history: History, stop: threading.Event) -> None:
        super().__init__(daemon=True, name=f"{self.workload}-{index}")
        self.index = index
        self.endpoint = endpoint
        self.service = service
        self.history = history
        self.stopping = stop
        self.paused = threading.Event()  # set: the worker idles (a scenario that needs quiet)
        self.seq = itertools.count(1)

    def run(self) -> None:
        with Client(self.endpoint, timeout_s=ATTEMPT_TIMEOUT_S) as client:
            while not self.stopping.is_set():
                if self.paused.is_set():
                    time.sleep(0.05)
                    continue
                self.step(client)
                time.sleep(PAUSE_S)

    def step(self, client: Client) -> None:
        raise NotImplementedError

    def op(self, workload: str, key: str, value: Any) -> Op:
        return Op(self.name, self.service, workload, key, value, invoked=self.history.now())

    def perform(
        self,
        client: Client,
        op: Op,
        type_name: str,
        body: dict[str, Any] | None,
        *,
        session_id: uuid.UUID | None = None,
        keyed: bool = True,
    ) -> Reply | None:
        """Attempts under one idempotency key; the reply, or None with op.outcome fail/unknown set."""
        if keyed:
            body = {**(body or {}), "idempotency_key": uuid.uuid4().hex}
        maybe_applied = False
        for n in range(ATTEMPTS):
            sent = self.history.now()
            try:
                reply = client.call(type_name, body, session_id=session_id)
            except RequestTimeout:
                answer, message = "TIMEOUT", "no reply in time"
            except RequestError as e:
                answer, message = e.transport_error, str(e)[:200]
            else:
                op.attempts.append(Attempt(sent, self.history.now(), reply.status))
                op.completed = self.history.now()
                return reply
            op.attempts.append(Attempt(sent, self.history.now(), answer, message))
            if answer not in NOT_EXECUTED:
                maybe_applied = True
                if not keyed and op.write:
                    break  # a repeat without a key could apply twice
            if n + 1 < ATTEMPTS:
                time.sleep(BACKOFF_S[min(n, len(BACKOFF_S) - 1)])
        op.completed = self.history.now()
        op.outcome = UNKNOWN if maybe_applied and op.write else FAIL
        op.error = op.attempts[-1].answer
        return None

    def settle(self, op: Op, reply: Reply | None, ok_statuses: tuple[str, ...] = ("OK",)) -> None:
        """Outcome from a definite reply: ok for ok_statuses, else fail (the status says nothing changed)."""
        if reply is not None:
            if reply.status in ok_statuses:
                op.outcome = OK
            else:
                op.outcome, op.error = FAIL, reply.status
        self.history.add(op)


class SetWorker(Worker):
    workload = "set"

    def __init__(self, *, client_id: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.client_id = client_id

    def step(self, client: Client) -> None:
        sid = uuid.uuid4()
        op = self.op("set", self.client_id, str(sid))
        body = {"client_id": self.client_id, "ttl_s": SESSION_TTL_S, "data": {"n": next(self.seq)}}
        reply = self.perform(client, op, "SESSION_CREATE", body, session_id=sid)
        if reply is not None:
            op.result = reply.status
        self.settle(op, reply, ("OK", "ALREADY_EXISTS"))  # ALREADY_EXISTS: it exists, as asked (not expected)


class RegisterWorker(Worker):
    workload = "register"

    def __init__(self, *, sessions: list[str], **kw: Any) -> None:
        super().__init__(**kw)
        self.sessions = sessions

    def step(self, client: Client) -> None:
        sid = random.choice(self.sessions)
        read = self.op("read", sid, None)
        got = self.perform(client, read, "SESSION_GET", None, session_id=uuid.UUID(sid), keyed=False)
        if got is None or got.status != "OK" or not isinstance(got.body.get("data"), dict):
            self.settle(read, got)
            return
        log = got.body["data"]["log"]
        read.result = (got.body["rev"], log[-1] if log else None)  # what the linearizability check reads
        self.settle(read, got)
        op_id = self.index * 1_000_000 + next(self.seq)
        op = self.op("register", sid, op_id)
        op.meta["prev"] = log[-1] if log else None
        op.meta["expected_rev"] = got.body["rev"]
        body = {"data": {"log": [*log, op_id]}, "expected_rev": got.body["rev"]}
        reply = self.perform(client, op, "SESSION_UPDATE", body, session_id=uuid.UUID(sid))
        if reply is not None:
            op.result = reply.body.get("rev")
        self.settle(op, reply)


class CounterWorker(Worker):
    workload = "counter"

    def __init__(self, *, counter: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.counter = counter

    def step(self, client: Client) -> None:
        op = self.op("counter", self.counter, 1)
        reply = self.perform(client, op, "COUNTER_ADD", {"name": self.counter, "delta": 1})
        if reply is not None:
            op.result = reply.body.get("value")
        self.settle(op, reply)


class CacheWorker(Worker):
    workload = "cache"

    def step(self, client: Client) -> None:
        key = f"c{self.index}-{next(self.seq)}"
        op = self.op("cache", key, key)
        reply = self.perform(client, op, "CACHE_PUT", {"key": key, "data": key, "ttl_s": SESSION_TTL_S})
        self.settle(op, reply)


def create_hot_sessions(endpoint: str, n: int, client_id: str) -> list[str]:
    """n sessions with data {"log": []} (rev 1), created before the load starts."""
    out = []
    with Client(endpoint, timeout_s=ATTEMPT_TIMEOUT_S, retries=5) as client:
        for _ in range(n):
            sid = uuid.uuid4()
            reply = client.session_create(client_id, data={"log": []}, ttl_s=SESSION_TTL_S, session_id=sid)
            if reply.status != "OK":
                raise AssertionError(f"hot session not created: {reply.status} {reply.body}")
            out.append(str(sid))
    return out
