"""An unreachable store (design: store errors) inside a delivery means "this delivery must stop".

``StoreError`` (and ``StoreUnavailableError``) derive from ``AGBossSignal``: a body's
``except Exception`` fallback cannot mistake a payment the store could not record for a
failed one and charge another card. The delivery is handed over (a retry); the next one
asks the store what happened. An application's own SQL error inside a fenced effect's
``fn`` stays the application's exception.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from celery_agboss.core.fault_points import OUTBOUND_AFTER_READ, RECONCILE_AFTER_LOOKUP
from celery_agboss.core.protections import STORE_FAILURE_CATCHABLE
from celery_agboss.errors import AGBossSignal, StoreError, StoreUnavailableError
from celery_agboss.testing.fault_arming import arm_raise
from celery_agboss.testing.gateway_types import FakeGatewayFault
from celery_agboss.testing.switches import sabotage
from tests.delivery.conftest import PaymentShop, lease_lapses_in_real_time


@pytest.fixture
def shop_config() -> dict[str, Any]:
    return lease_lapses_in_real_time()


def _with_a_fallback_card(shop: PaymentShop) -> object:
    primary, backup = shop.call("shop.primary"), shop.call("shop.backup")

    @shop.task()
    def pay(self: object, order: str) -> object:
        request = {"amount": 1000, "order": order}
        try:
            return self.outbound(primary, request, business_key=f"order:{order}")  # type: ignore[attr-defined]
        except Exception:  # the application's fallback to another card
            return self.outbound(backup, request, business_key=f"order:{order}")  # type: ignore[attr-defined]

    return pay


def _store_fails_after_reconcile_found_the_payment(shop: PaymentShop) -> str:
    """The first charge's answer is lost; the retry's lookup finds the payment, then the
    store is unreachable while that is being recorded."""
    pay = _with_a_fallback_card(shop)
    shop.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP, operation="charge")
    arm_raise(
        RECONCILE_AFTER_LOOKUP,
        StoreUnavailableError("connection refused"),
        only={"call": "shop.primary"},
    )
    with shop.worker():
        task_id = str(pay.delay("o-1").id)  # type: ignore[attr-defined]
        shop.wait_state(task_id, "COMPLETED", "WAITING_OPERATOR", timeout=40)
    return task_id


def test_a_store_outage_is_a_signal_no_except_exception_can_catch() -> None:
    assert issubclass(StoreUnavailableError, AGBossSignal)
    assert issubclass(StoreError, AGBossSignal)
    assert not issubclass(StoreError, Exception)


def test_a_store_outage_after_reconcile_found_the_payment_hands_over_instead_of_a_fallback(
    shop: PaymentShop,
) -> None:
    task_id = _store_fails_after_reconcile_found_the_payment(shop)
    assert shop.execution(task_id).state.value == "COMPLETED"
    charged = [r.idempotency_key or "" for r in shop.gateway.requests]
    assert len(shop.gateway.payments) == 1
    assert all("shop.primary" in key for key in charged), charged
    assert shop.execution(task_id).deliveries == 3  # lost answer, outage, then reconciled


def test_without_the_signal_the_fallback_card_is_charged_too(shop: PaymentShop) -> None:
    with sabotage(STORE_FAILURE_CATCHABLE):
        task_id = _store_fails_after_reconcile_found_the_payment(shop)
    assert len(shop.gateway.payments) == 1 + 1, "the backup card, beside the first payment"
    # (The primary's intent is still pending, so the execution does not complete over it:
    # a second line of defence, too late for the money.)
    assert shop.execution(task_id).state.value == "WAITING_OPERATOR"


def test_a_store_outage_on_the_claim_read_hands_the_delivery_over(
    shop: PaymentShop, caplog: pytest.LogCaptureFixture
) -> None:
    pay = _with_a_fallback_card(shop)
    arm_raise(
        OUTBOUND_AFTER_READ, StoreUnavailableError("connection lost"), only={"call": "shop.primary"}
    )
    with shop.worker(), caplog.at_level(logging.ERROR, logger="celery_agboss"):
        task_id = str(pay.delay("o-2").id)  # type: ignore[attr-defined]
        shop.wait_state(task_id, "COMPLETED", timeout=40)
    charged = [r.idempotency_key or "" for r in shop.gateway.requests]
    assert len(charged) == 1 and "shop.primary" in charged[0]
    # The armed outage is logged by its class ("error=", not "type"); on a loaded machine
    # SQLite may also time out on its lock (StoreLockTimeoutError), another hand-over.
    failed = [r.getMessage() for r in caplog.records if "store-failed" in r.getMessage()]
    outages = [line for line in failed if "error=StoreUnavailableError" in line]
    assert len(outages) == 1, failed
    assert all("error=StoreLockTimeoutError" in line for line in failed if line not in outages)


def test_the_applications_own_sql_error_in_a_fenced_effect_stays_its_own(
    shop: PaymentShop,
) -> None:
    seen: list[str] = []

    @shop.task()
    def write(self: object) -> str:
        try:
            self.fenced_effect(  # type: ignore[attr-defined]
                "bad-sql", lambda conn: conn.execute(text("SELECT * FROM no_such_table"))
            )
        except DBAPIError as exc:
            seen.append(type(exc).__name__)
        return "handled"

    with shop.worker():
        task_id = str(write.delay().id)  # type: ignore[attr-defined]
        shop.wait_state(task_id, "COMPLETED")
    assert seen and all(name in ("OperationalError", "ProgrammingError") for name in seen)


@pytest.mark.parametrize("error", [StoreError, StoreUnavailableError])
def test_a_store_error_pickles_with_its_fields(error: type[StoreError]) -> None:
    import pickle

    raised = error("down", execution_id="e-1")
    again = pickle.loads(pickle.dumps(raised))
    assert type(again) is error and again.fields == {"execution_id": "e-1"}
