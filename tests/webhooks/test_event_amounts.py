"""``amount_in_iso_units``: a webhook's amount in the units the charge was asked in, by
the adapters' own tables, so an event and an adapter's result of one payment agree."""

from __future__ import annotations

from typing import Any

import pytest

from celery_agboss.adapters.checkout_requests import payment_result
from celery_agboss.adapters.stripe import intent_result
from celery_agboss.webhooks import ADYEN, CHECKOUT, STRIPE, amount_in_iso_units


@pytest.mark.parametrize(
    ("gateway", "written", "currency", "iso"),
    [
        (STRIPE, 100000, "isk", 1000),  # Stripe: ISK with two decimals
        (STRIPE, 100, "mga", 10000),  # Stripe: MGA with none
        (STRIPE, 1500, "eur", 1500),
        (ADYEN, 100000, "CLP", 1000),
        (ADYEN, 100, "IDR", 10000),
        (ADYEN, 1500, "EUR", 1500),
        (CHECKOUT, 100000, "CLP", 1000),
        (CHECKOUT, 1000, "ISK", 1000),  # Checkout.com writes ISK as ISO 4217 does
    ],
)
def test_a_gateways_amount_in_iso_minor_units(
    gateway: str, written: int, currency: str, iso: int
) -> None:
    assert amount_in_iso_units(gateway, written, currency) == iso


@pytest.mark.parametrize(
    ("written", "currency"), [(150, "isk"), ("100000", "isk"), (True, "eur"), (1000, None)]
)
def test_no_whole_amount_is_none(written: Any, currency: Any) -> None:
    assert amount_in_iso_units(STRIPE, written, currency) is None


def test_an_unknown_gateway_is_named() -> None:
    with pytest.raises(ValueError, match="unknown webhook gateway 'paypal'"):
        amount_in_iso_units("paypal", 1000, "EUR")


def test_an_event_and_the_adapters_result_of_one_payment_agree() -> None:
    intent = {"id": "pi_1", "amount": 100000, "amount_received": 100000, "currency": "isk"}
    assert intent_result(intent)["amount_received"] == amount_in_iso_units(
        STRIPE, intent["amount_received"], intent["currency"]
    )
    payment = {"id": "pay_1", "amount": 100000, "currency": "CLP"}
    assert payment_result(payment)["amount"] == amount_in_iso_units(
        CHECKOUT, payment["amount"], payment["currency"]
    )
