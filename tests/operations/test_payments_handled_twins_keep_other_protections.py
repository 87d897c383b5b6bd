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

import pytest

from celery_agboss.core.protections import (
    PAYMENTS_HANDLED_CLAIMED_AFTER_UNDOS,
    PAYMENTS_HANDLED_SKIPS_UNDECLARED_CHARGES,
    PAYMENTS_HANDLED_STEP_UNCLAIMED,
    PAYMENTS_HANDLED_VERB_CLAIMS_NOTHING,
)
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop
from tests.delivery.wallet_orders import wallet_and_card_order
from tests.operations.handled_orders import (
    cancel_of_a_relying_click,
    card_step_that_waits,
    failed_then_a_click_waits,
    placed_with_a_click,
    refused_naming,
)


@pytest.mark.parametrize(
    "switch", [PAYMENTS_HANDLED_STEP_UNCLAIMED, PAYMENTS_HANDLED_CLAIMED_AFTER_UNDOS]
)
def test_cancel_is_still_refused_under_a_claims_twin(shop: PaymentShop, switch: str) -> None:
    pay, _ = wallet_and_card_order(shop)
    task_id, click_id = placed_with_a_click(shop, pay, card_step_that_waits(shop))
    with sabotage(switch):
        kept = refused_naming(shop, task_id, click_id)
    assert kept.state.value == "WAITING" and kept.payments_handled_at_ms is None


def test_verb_is_still_refused_under_its_claims_twin(shop: PaymentShop) -> None:
    task_id, click_id, _ = failed_then_a_click_waits(shop)
    with sabotage(PAYMENTS_HANDLED_VERB_CLAIMS_NOTHING):
        kept = refused_naming(shop, task_id, click_id, verb=True)
    assert kept.payments_handled_at_ms is None


def test_a_relied_charge_is_still_claimed_under_the_undeclared_twin(shop: PaymentShop) -> None:
    with sabotage(PAYMENTS_HANDLED_SKIPS_UNDECLARED_CHARGES):
        click_id, told, shipped = cancel_of_a_relying_click(shop)
    assert [(t.undone, t.undo_by) for t in told] == [(False, click_id)] and shipped == []
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1
