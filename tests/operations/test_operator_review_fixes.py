"""What a review of the operator's verbs found, fixed; each test fails on the code before.

- ``resolve --completed`` on an intent whose payment the gateway itself named (its answer
  came, only the result could not be stored) refuses a result that names another
  payment: the intent would say its order was paid by that charge, and a refund built
  from it would refund the other order's (twin ``operator-gateway-id-replaced``).
- ``cancel`` whose execution completes between the operator's checks and the store's
  lock is refused (``wrong-state``, exit non-zero), not reported as "cancel requested"
  with exit 0: nothing was cancelled and the payment stands (twin
  ``cancel-of-an-ended-execution-reported``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from celery_agboss import OutboundCall, Unknown
from celery_agboss.cli import EXIT_REFUSED
from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.outbound import CallContext
from celery_agboss.core.protections import (
    CANCEL_OF_AN_ENDED_EXECUTION_REPORTED,
    OPERATOR_GATEWAY_ID_REPLACED,
)
from celery_agboss.core.store_protocol import IntentRecord, IntentStatus
from celery_agboss.errors import OperatorRefusedError, OutboundCallResultNotStoredError
from celery_agboss.operator import resolve
from celery_agboss.testing.switches import sabotage
from tests.operations.cli import run
from tests.operations.world import TTL_SECONDS, World

# --- resolve --completed keeps the payment the gateway named -----------------------------


def _charged_with_its_result_lost(world: World) -> tuple[IntentRecord, dict[str, Any]]:
    """Order A is charged and the gateway answers, but the answer cannot be stored (it is
    not JSON): the intent is COMPLETED with the gateway's id, waiting for an operator.
    Order B is charged too; its receipt is what a careless operator pastes for A."""

    def send(call: CallContext) -> Any:
        receipt = world.gateway.charge(call.request["amount"], call.idempotency_key)
        return {**receipt, "settled_at": datetime.now(timezone.utc)}

    unstorable = world.agboss.register(
        OutboundCall(
            name="ops.charge_unstorable",
            send=send,
            reconcile=lambda call, lookup: Unknown("not needed here"),
            key_retention=timedelta(hours=24),
            transaction_id=lambda result: result.get("id"),
        )
    )
    a = world.publish("order-a")
    with pytest.raises(OutboundCallResultNotStoredError):
        world.start(a).outbound(unstorable, {"amount": 1000}, business_key="order:order-a")
    world.die()
    (intent,) = world.intents(a)
    assert intent.status is IntentStatus.COMPLETED and not intent.result_stored
    assert intent.gateway_transaction_id == world.gateway.payments[-1]["id"]
    b = world.publish("order-b")
    world.start(b).outbound(world.call, {"amount": 1000, "order": "order-b"})
    receipt_of_b = dict(world.gateway.payments[-1])
    assert receipt_of_b["id"] != intent.gateway_transaction_id
    return intent, receipt_of_b


def test_a_result_naming_another_payment_is_refused(world: World) -> None:
    intent, receipt_of_b = _charged_with_its_result_lost(world)
    with pytest.raises(OperatorRefusedError) as refused:
        resolve(world.app, intent.idempotency_key, completed=receipt_of_b, reason="dashboard")
    assert refused.value.code == "bad-input"
    assert intent.gateway_transaction_id in str(refused.value)
    after = world.agboss.store.read_intent(intent.idempotency_key)
    assert after is not None and not after.result_stored
    assert after.gateway_transaction_id == intent.gateway_transaction_id


def test_the_payments_own_result_is_taken(world: World) -> None:
    intent, _ = _charged_with_its_result_lost(world)
    own = next(p for p in world.gateway.payments if p["id"] == intent.gateway_transaction_id)
    resolve(world.app, intent.idempotency_key, completed=dict(own), reason="dashboard")
    after = world.agboss.store.read_intent(intent.idempotency_key)
    assert after is not None and after.result_stored and after.result["id"] == own["id"]


def test_twin_the_intent_then_says_order_a_was_paid_by_order_b_s_charge(world: World) -> None:
    intent, receipt_of_b = _charged_with_its_result_lost(world)
    with sabotage(OPERATOR_GATEWAY_ID_REPLACED):
        resolve(world.app, intent.idempotency_key, completed=receipt_of_b, reason="dashboard")
    after = world.agboss.store.read_intent(intent.idempotency_key)
    assert after is not None and after.gateway_transaction_id == receipt_of_b["id"]


# --- a cancel that meets the delivery's end ------------------------------------------------


@pytest.fixture
def completing_meanwhile(world: World, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An execution that charged; its delivery finishes and releases its lease while the
    operator's cancel is checking it (between its reads and the store's lock)."""
    execution_id = world.publish()
    ctx = world.start(execution_id)
    ctx.outbound(world.call, {"amount": 1000, "order": execution_id})
    store, executions = world.agboss.store, world.agboss.executions
    read_lease = store.read_lease
    finished: list[bool] = []

    def read_lease_as_the_delivery_ends(scope: str) -> Any:
        if scope == execution_id and not finished:
            with store.fenced(ctx.lease_ref, TTL_SECONDS * 1000) as tx:
                executions.release_in(tx, executions.finish_in(tx, '"ok"', ctx.reached_keys()))
                tx.release_at_commit()
            finished.append(True)
        return read_lease(scope)

    monkeypatch.setattr(store, "read_lease", read_lease_as_the_delivery_ends)
    yield execution_id
    assert finished, "the delivery did not end during the cancel"
    assert world.execution(execution_id).state is ExecutionState.COMPLETED
    assert len(world.gateway.payments) == 1


def test_a_cancel_that_meets_the_delivery_s_end_is_refused(
    world: World, completing_meanwhile: str
) -> None:
    result = run(world.app, "cancel", completing_meanwhile, "--reason", "customer asked")
    assert result.exit_code == EXIT_REFUSED, result.output
    assert "ended COMPLETED while the cancel was being checked" in result.output
    assert "Cancel requested" not in result.output
    assert world.agboss.executions.list_audit(completing_meanwhile) == []


def test_twin_the_cancel_reports_a_request_the_sweep_will_never_carry_out(
    world: World, completing_meanwhile: str
) -> None:
    with sabotage(CANCEL_OF_AN_ENDED_EXECUTION_REPORTED):
        result = run(world.app, "cancel", completing_meanwhile, "--reason", "customer asked")
    assert result.exit_code == 0
    assert "Cancel requested" in result.output
