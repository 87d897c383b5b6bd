"""A pause that accepts early answers, in one delivery run in the test's thread.

The body answers its own pause before it reaches it, as a return page that beats the
task does (the same race on real processes and both stores is
tests/faults/test_early_answer_race.py, on a real worker tests/integration/test_pauses.py):
the pause takes the answer and the body goes on in the same delivery, once. Its twin
writes the pause over the answer, and the execution waits for one that already came.
A pause name with a ``:`` cannot take early answers, and says so.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
from celery import Celery

from celery_agboss import ConfigurationError, PaymentTask, answer_pause
from celery_agboss.app import AGBoss
from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.log_events import PAUSE_EARLY_ANSWER_DROPPED
from celery_agboss.core.protections import PAUSE_WRITTEN_OVER_AN_EARLY_ANSWER
from celery_agboss.testing import sabotage


def _returning_early(app: Celery, name: str, accept_early: bool) -> Any:
    """A task whose return page answers its pause before the body reaches it."""

    @app.task(base=PaymentTask, bind=True, name=f"early.{uuid.uuid4().hex[:8]}")  # type: ignore[untyped-decorator]
    def checkout(self: PaymentTask) -> Any:
        kept = answer_pause(app, f"{self.request.id}:{name}", {"source": "return-page"})
        assert kept is False, "kept for the pause: nothing to publish again"
        return {"answer": self.pause(name, {"payment": "pi_1"}, accept_early=accept_early)}

    return checkout


def test_an_answer_before_the_pause_is_taken_by_it_and_the_body_goes_on(
    agboss_app: Celery,
) -> None:
    checkout = _returning_early(agboss_app, "3ds", accept_early=True)
    task_id = f"order-{uuid.uuid4().hex}"
    result = checkout.apply(task_id=task_id).get()
    assert result == {"answer": {"source": "return-page"}}
    record = AGBoss.of(agboss_app).executions.read_execution(task_id)
    assert record is not None and record.state is ExecutionState.COMPLETED
    assert record.deliveries == 1


def test_a_pause_written_over_an_early_answer_waits_for_an_answer_that_came(
    agboss_app: Celery,
) -> None:
    """The twin: the pause does not look for an answer that came first."""
    checkout = _returning_early(agboss_app, "3ds", accept_early=True)
    task_id = f"order-{uuid.uuid4().hex}"
    with sabotage(PAUSE_WRITTEN_OVER_AN_EARLY_ANSWER):
        checkout.apply(task_id=task_id)
    record = AGBoss.of(agboss_app).executions.read_execution(task_id)
    assert record is not None and record.state is ExecutionState.PAUSED


def test_an_approval_does_not_take_an_answer_given_before_it(
    agboss_app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    checkout = _returning_early(agboss_app, "approve", accept_early=False)
    task_id = f"order-{uuid.uuid4().hex}"
    with caplog.at_level(logging.WARNING, logger="celery_agboss"):
        checkout.apply(task_id=task_id)
    record = AGBoss.of(agboss_app).executions.read_execution(task_id)
    assert record is not None and record.state is ExecutionState.PAUSED
    assert any(getattr(r, "event", None) == PAUSE_EARLY_ANSWER_DROPPED for r in caplog.records)


def test_a_pause_name_with_a_colon_cannot_take_early_answers(agboss_app: Celery) -> None:
    @agboss_app.task(base=PaymentTask, bind=True, name="early.colon")  # type: ignore[untyped-decorator]
    def checkout(self: PaymentTask) -> Any:
        return self.pause("3ds:step-1", accept_early=True)

    with pytest.raises(ConfigurationError, match="without one"):
        checkout.apply(task_id=f"order-{uuid.uuid4().hex}").get()
