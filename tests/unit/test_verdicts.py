"""A delivery's verdicts: a closed set, every member writing itself through its own verb."""

from __future__ import annotations

import typing
from typing import Any

from celery_agboss.core.executions import ExecutionMessage
from celery_agboss.delivery.verdicts import (
    Cancel,
    Fail,
    Finish,
    ForOperator,
    UndoWait,
    Verdict,
    Wait,
)

MESSAGE = ExecutionMessage(
    execution_id="e-1",
    task_name="shop.pay",
    args="[]",
    kwargs="{}",
    options="{}",
)

SAMPLES: dict[type[Any], tuple[Any, str, tuple[Any, ...]]] = {
    # member: (a verdict, the verb it must write, the arguments after the transaction)
    Finish: (Finish("RESULT"), "finish_in", ("RESULT", frozenset({"k-1"}))),
    Fail: (Fail("ERROR", "ValueError"), "fail_in", ("ERROR", "ValueError")),
    Wait: (Wait(1500, "retry", MESSAGE), "wait_in", (1500, "retry", MESSAGE)),
    UndoWait: (UndoWait(30000, "undo waits"), "undo_wait_in", (30000, "undo waits")),
    Cancel: (Cancel("revoked"), "cancel_in", ("revoked",)),
    ForOperator: (ForOperator("unreconciled"), "waiting_operator_in", ("unreconciled",)),
}


class RecordingExecutions:
    """Each ``*_in`` verb records its call and hands back a marker record."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        if not name.endswith("_in"):
            raise AttributeError(name)

        def verb(*args: Any) -> str:
            self.calls.append((name, args))
            return f"record of {name}"

        return verb


class FakeContext:
    def __init__(self) -> None:
        self.retries_authorised_in: list[object] = []

    def authorise_retries(self, tx: object) -> None:
        self.retries_authorised_in.append(tx)

    def reached_keys(self) -> frozenset[str]:
        return frozenset({"k-1"})


def test_every_member_of_the_verdict_type_has_a_sample_here() -> None:
    assert set(typing.get_args(Verdict)) == set(SAMPLES)


def test_every_verdict_writes_through_its_own_verb() -> None:
    verbs = set()
    for member, (verdict, verb, arguments) in SAMPLES.items():
        assert isinstance(verdict, member)
        executions, ctx, tx = RecordingExecutions(), FakeContext(), object()
        record = verdict.write_in(executions, ctx, tx)
        assert executions.calls == [(verb, (tx, *arguments))], member.__name__
        assert record == f"record of {verb}"
        verbs.add(verb)
    assert len(verbs) == len(SAMPLES)


def test_only_a_retry_the_body_asked_for_authorises_sending_its_failures_again() -> None:
    for member, (verdict, _, _) in SAMPLES.items():
        ctx, tx = FakeContext(), object()
        verdict.write_in(RecordingExecutions(), ctx, tx)
        assert ctx.retries_authorised_in == [], member.__name__
    ctx, tx = FakeContext(), object()
    Wait(1500, "retry", retry_asked=True).write_in(RecordingExecutions(), ctx, tx)
    assert ctx.retries_authorised_in == [tx]


def test_a_wait_without_a_message_writes_none() -> None:
    executions, tx = RecordingExecutions(), object()
    Wait(0, "rejected, requeued").write_in(executions, FakeContext(), tx)
    assert executions.calls == [("wait_in", (tx, 0, "rejected, requeued", None))]
