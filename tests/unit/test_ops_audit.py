"""smartcache.ops.audit: an operation is written before it acts and with its outcome, and does not act when its
first entry cannot be written; who is named without a secret (the places are fakes: no storage here)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest

from smartcache.ops import audit


class Storage:
    """Fake leaders: each place answers audit_write from `answers` (a status, or an exception to raise)."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.written: list[tuple[Any, ...]] = []

    def places(self) -> Iterator[tuple[str, audit.Caller]]:
        def caller(procedure: str, *args: Any) -> dict[str, Any]:
            assert procedure == "audit_write"
            answer = self.answers.pop(0) if self.answers else "OK"
            if isinstance(answer, BaseException):
                raise answer
            if answer != "OK":
                return {"status": answer, "message": "refused"}
            self.written.append(args)
            return {"status": "OK", "seq": len(self.written)}

        yield "", caller


ACTOR = audit.Actor("cli:alice@bastion as operator", "planned maintenance")


def test_an_operation_is_written_before_it_acts_and_with_its_outcome() -> None:
    storage = Storage()
    seen: list[int] = []

    def act() -> dict[str, Any]:
        seen.append(len(storage.written))
        return {"status": "OK", "pause_ms": 120, "members": ["a", "b"]}

    result = audit.audited(storage.places, ACTOR, "switchover", "127.0.0.1:3302", act, details={"timeout_ms": 5000})
    assert seen == [1], "the first entry was written before the action"
    (who, action, target, reason, asked), (*_, done) = storage.written
    assert (who, action, target, reason) == (ACTOR.who, "switchover", "127.0.0.1:3302", "planned maintenance")
    assert asked == {"timeout_ms": 5000, "phase": "asked"}
    assert done == {"phase": "done", "asked_seq": 1, "status": "OK", "pause_ms": 120}  # scalars only
    assert result["audit"] == {"asked": {"seq": 1}, "done": {"seq": 2}}
    assert result["status"] == "OK"


@pytest.mark.parametrize("refusal", ["NOT_LEADER", ConnectionRefusedError("refused")])
def test_an_operation_whose_first_entry_cannot_be_written_does_not_act(refusal: Any) -> None:
    acted: list[bool] = []
    result = audit.audited(Storage(refusal).places, ACTOR, "rejoin", "x", lambda: acted.append(True) or {})
    assert not acted
    assert result["status"] == "AUDIT_UNAVAILABLE"
    assert "rejoin not done: its audit entry could not be written" in result["message"]


def test_an_exception_of_the_action_is_recorded_as_its_outcome_and_raised_again() -> None:
    storage = Storage()

    def act() -> dict[str, Any]:
        raise RuntimeError("bucket 3 given up")

    with pytest.raises(RuntimeError):
        audit.audited(storage.places, ACTOR, "move", "bucket 3 to s2", act)
    done = storage.written[-1][-1]
    assert done["status"] == "ERROR"
    assert done["message"] == "RuntimeError: bucket 3 given up"


def test_an_outcome_that_cannot_be_written_is_said_in_the_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audit, "OUTCOME_WAIT_S", 0.05)
    monkeypatch.setattr(audit, "OUTCOME_POLL_S", 0.01)
    storage = Storage("OK", *["NOT_LEADER"] * 100)
    result = audit.audited(storage.places, ACTOR, "switchover", "", lambda: {"status": "OK"})
    assert result["status"] == "OK"
    assert result["audit"]["done"]["error"].startswith("the outcome was not recorded: leader: NOT_LEADER")


def test_who_names_a_curve_key_or_the_login_and_a_token_only_by_its_hash() -> None:
    assert audit.cli_who("operator", "alice", "bastion-1") == "cli:alice@bastion-1 as operator"
    assert audit.cli_who("operator", "alice", "bastion-1", "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7") == (
        "curve:rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
    )
    token = "s3cret-token"
    who = audit.console_who(token)
    assert who == "console:" + hashlib.sha256(token.encode()).hexdigest()[:12]
    assert token not in who
