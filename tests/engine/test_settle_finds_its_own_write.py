"""A settle whose compare-and-set reports a miss, although the intent already holds this
attempt's outcome (a store that re-ran the transaction after its own write, say), is
settled, not handed over: for a result and for a definite failure alike, one rule
(``core.settle._settle``). Before, only a result was checked; a definite failure so
found was reported as a hand-over, and the body never saw its decline."""

from __future__ import annotations

from typing import Any

import pytest

from celery_agboss.core import settle
from celery_agboss.core.outbound import Outcome
from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.testing.gateway import FakeGatewayError, FakeGatewayFault
from tests.engine.helpers import Shop, step_intent_key


@pytest.fixture(autouse=True)
def misses_after_writing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every settle goes through the fenced transaction, whose compare-and-set writes and
    then answers "missed"."""
    written = settle.holder_transition

    def write_then_miss(*args: Any, **kwargs: Any) -> bool:
        assert written(*args, **kwargs), "the settle's own write"
        return False

    monkeypatch.setattr(settle, "holder_transition_in_one", lambda *a, **k: False)
    monkeypatch.setattr(settle, "holder_transition", write_then_miss)


def _intent_status(shop: Shop) -> IntentStatus:
    record = shop.store.read_intent(step_intent_key(shop.settings, "task-1", "fake.charge"))
    assert record is not None
    return record.status


def test_a_result_found_written_by_its_own_attempt_is_settled(shop: Shop) -> None:
    with shop.start("task-1") as ctx:
        receipt = ctx.outbound(shop.charge_call(), {"amount": 1000})
        assert ctx.last_outcome is Outcome.SENT
    assert receipt["amount"] == 1000
    assert _intent_status(shop) is IntentStatus.COMPLETED


def test_a_definite_failure_found_written_by_its_own_attempt_reaches_the_body(
    shop: Shop,
) -> None:
    shop.gateway.inject_fault(FakeGatewayFault.DECLINE)
    with shop.start("task-1") as ctx, pytest.raises(FakeGatewayError):
        ctx.outbound(shop.charge_call(), {"amount": 1000})
    assert _intent_status(shop) is IntentStatus.FAILED
    assert len(shop.gateway.requests) == 1
