"""Early answers across processes: a 3-D Secure answer racing the pause it answers.

One process reaches ``self.pause("3ds", accept_early=True)`` under the execution's lease,
another answers that pause, each on a store connection of its own; a barrier pair puts
the answer's commit just before the pause's write, just after it, or at the same instant
(then the execution row, which both lock first, orders them). Whichever way, the answer
is used once and never lost: the pause takes an answer that came first and the delivery
goes on; an answer that came second answers the stored pause and moves the execution to
``WAITING``. The twin writes the pause without reading, under that lock, whether an
answer came first: the answer that came first is written over, and the execution waits
``PAUSED`` for an answer its answerer was told was kept.
"""

from __future__ import annotations

import multiprocessing
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from celery_agboss.core.executions import ExecutionMessage, ExecutionState
from celery_agboss.core.protections import PAUSE_WRITTEN_OVER_AN_EARLY_ANSWER
from celery_agboss.store.execution_store import SQLAlchemyExecutionStore
from celery_agboss.store.pauses import ANSWERED
from celery_agboss.store.schema_executions import pauses
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from tests.faults import workers

TOGETHER_ROUNDS = 6
TTL_MS = 120_000
REPORT_SECONDS = 60.0

pytestmark = pytest.mark.timeout(300)


def _race(store_url: str, sabotage: Sequence[str], together: int) -> list[dict[str, Any]]:
    """Play every round; one row per round: its mode, both sides' reports, and what the
    store holds afterwards (the pause's status and answer, the execution's state)."""
    store = SQLAlchemyStore(store_url)
    executions = SQLAlchemyExecutionStore(store)
    modes = ["answer-first", "pause-first"] + ["together"] * together
    rounds = []
    try:
        for number, mode in enumerate(modes):
            execution_id = f"early-{number}-{uuid.uuid4().hex[:10]}"
            message = ExecutionMessage(execution_id, "shop.checkout_3ds", "[]", "{}", "{}")
            assert executions.record_requested(message)
            started = executions.start_delivery(message, f"holder-{execution_id}", TTL_MS, 3)
            assert started.grant is not None
            rounds.append((number, started.grant.lease, mode))
        reports = _play(store_url, rounds, sabotage)
        played = []
        for number, lease, mode in rounds:
            with store.engine.connect() as conn:
                status, answer = conn.execute(
                    pauses.select()
                    .with_only_columns(pauses.c.status, pauses.c.answer)
                    .where(pauses.c.id == f"{lease.scope}:3ds")
                ).one()
            record = executions.read_execution(lease.scope)
            assert record is not None
            played.append(
                {
                    "mode": mode,
                    "pause": reports[("pause", number)],
                    "answer": reports[("answer", number)],
                    "status": status,
                    "stored_answer": answer,
                    "state": record.state,
                }
            )
        return played
    finally:
        store.close()


def _play(
    store_url: str, rounds: list[tuple[int, Any, str]], sabotage: Sequence[str]
) -> dict[tuple[str, int], dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")
    start, middle = ctx.Barrier(2), ctx.Barrier(2)
    results = ctx.Queue()
    with workers.sabotage_allowed_in_children(bool(sabotage)):
        processes = [
            ctx.Process(
                target=workers.early_answer_side,
                args=(side, store_url, rounds, list(sabotage), start, middle, results),
                daemon=True,
            )
            for side in ("pause", "answer")
        ]
        reports: dict[tuple[str, int], dict[str, Any]] = {}
        try:
            for process in processes:
                process.start()
            for _ in range(2 * len(rounds)):
                row = workers.next_row(
                    results, REPORT_SECONDS, f"only {len(reports)} of {2 * len(rounds)} reported"
                )
                assert row["error"] is None, f"the {row['side']} side failed:\n{row['error']}"
                reports[(row["side"], row["round"])] = row
        finally:
            start.abort()
            middle.abort()
            workers.stop_all(processes)
    return reports


def _answer_lost(row: dict[str, Any]) -> bool:
    """The answerer was told its answer counted, and the execution still waits for one."""
    return "refused" not in row["answer"] and row["state"] is ExecutionState.PAUSED


def test_an_answer_racing_its_pause_is_used_once_whichever_commits_first(store_url: str) -> None:
    played = _race(store_url, [], TOGETHER_ROUNDS)
    for row in played:
        assert "refused" not in row["answer"], row
        assert row["status"] == ANSWERED and row["stored_answer"] == '"authenticated"', row
        if row["pause"]["taken"]:
            # The answer came first: kept early, taken by the pause, the delivery goes on.
            assert row["answer"]["early"] is True, row
            assert row["pause"]["answer"] == '"authenticated"', row
            assert row["state"] is ExecutionState.RUNNING, row
        else:
            # The pause came first: the answer answered it, the execution is due again.
            assert row["answer"]["early"] is False, row
            assert row["state"] is ExecutionState.WAITING, row
    by_mode = {row["mode"]: row["pause"]["taken"] for row in played if row["mode"] != "together"}
    assert by_mode == {"answer-first": True, "pause-first": False}


def test_a_pause_written_over_an_early_answer_loses_it(store_url: str) -> None:
    """The twin: the answer that came first is overwritten by the pending pause. (Its
    same-instant rounds are left out: without the lock, one side may also fail on the
    pause row's primary key, which is not the loss this twin shows.)"""
    played = _race(store_url, [PAUSE_WRITTEN_OVER_AN_EARLY_ANSWER], 0)
    (first,) = [row for row in played if row["mode"] == "answer-first"]
    assert first["answer"] == {**first["answer"], "early": True}
    assert _answer_lost(first), first
    assert first["status"] == "PENDING" and first["stored_answer"] is None
