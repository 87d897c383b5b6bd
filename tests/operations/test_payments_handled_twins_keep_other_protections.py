"""Each sabotage twin of ``--payments-handled`` switches off its own protection only: with
the claims switched off (``payments-handled-step-unclaimed``,
``payments-handled-claimed-after-undos``, ``payments-handled-verb-claims-nothing``) the
word is still refused while a later click waits on the charge (the refusal is the claim's
read, made without its write), and with undeclared sent charges skipped
(``payments-handled-skips-undeclared-charges``) a relied charge is still claimed. So each
twin's harm is its own protection's (design: cancel request, operator decisions). Real
worker, both stores.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_agboss.core.protections import (
    PAYMENTS_HANDLED_CLAIMED_AFTER_UNDOS,
    PAYMENTS_HANDLED_SKIPS_UNDECLARED_CHARGES,
    PAYMENTS_HANDLED_STEP_UNCLAIMED,
    PAYMENTS_HANDLED_VERB_CLAIMS_NOTHING,
)
from celery_agboss.errors import OperatorRefusedError
from celery_agboss.operator import cancel, payments_handled
from celery_agboss.testing import sabotage
from tests.delivery import conftest as delivery
from tests.delivery.conftest import PaymentShop
from tests.delivery.wallet_orders import (
    HANDLED,
    charge_the_card,
    placed_and_waiting,
    refund_by_hand,
    wallet_and_card_order,
)
from tests.operations.handled_orders import cancel_of_a_relying_click, failed_after_a_charge

delivery_store_url = delivery.delivery_store_url
shop_config = delivery.shop_config
shop = delivery.shop


def _waiting_click(shop: PaymentShop) -> str:
    """A later click on the same order's card step, handed the charge, waiting an hour."""
    charge = shop.call()

    @shop.task()
    def click_and_wait(self: Any, customer: str) -> Any:
        charge_the_card(self, charge, customer)
        raise self.retry(countdown=3600)

    with shop.worker():
        return placed_and_waiting(shop, click_and_wait)


@pytest.mark.parametrize(
    "switch", [PAYMENTS_HANDLED_STEP_UNCLAIMED, PAYMENTS_HANDLED_CLAIMED_AFTER_UNDOS]
)
def test_cancel_is_still_refused_under_a_claims_twin(shop: PaymentShop, switch: str) -> None:
    pay, _ = wallet_and_card_order(shop)
    with shop.worker():
        task_id = placed_and_waiting(shop, pay)
    click_id = _waiting_click(shop)
    refund_by_hand(shop)
    with sabotage(switch), pytest.raises(OperatorRefusedError) as refused:
        cancel(shop.app, task_id, HANDLED, payments_handled=True)
    assert refused.value.code == "wrong-state" and click_id in str(refused.value)
    kept = shop.execution(task_id)
    assert kept.state.value == "WAITING" and kept.payments_handled_at_ms is None


def test_verb_is_still_refused_under_its_claims_twin(shop: PaymentShop) -> None:
    task_id = failed_after_a_charge(shop)
    click_id = _waiting_click(shop)
    refund_by_hand(shop)
    with sabotage(PAYMENTS_HANDLED_VERB_CLAIMS_NOTHING), pytest.raises(OperatorRefusedError) as no:
        payments_handled(shop.app, task_id, HANDLED)
    assert no.value.code == "wrong-state" and click_id in str(no.value)
    assert shop.execution(task_id).payments_handled_at_ms is None


def test_a_relied_charge_is_still_claimed_under_the_undeclared_twin(shop: PaymentShop) -> None:
    with sabotage(PAYMENTS_HANDLED_SKIPS_UNDECLARED_CHARGES):
        click_id, told, shipped = cancel_of_a_relying_click(shop)
    assert [(t.undone, t.undo_by) for t in told] == [(False, click_id)] and shipped == []
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1
