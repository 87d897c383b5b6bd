"""Every adapter (design: masking) masks the card data its gateway's API can carry (PAN, CVC,
expiry, holder name) by default, and ``mask=`` adds fields; reconcile's fields stay.

A ``PaymentTask`` pays through each adapter's ``charge`` on a real (in-process) Celery
worker, with a raw card where that gateway's API takes one: Checkout.com's and Adyen's
payment source (both accept card details from PCI-compliant merchants; the fakes
charge them), Stripe's ``source`` as its Charges API takes a card, and PayPal's
``payment_source.card`` (those two adapters pay with ids only and refuse the request,
but only after the intent was recorded). Then the stored row
(``agboss_outbound_calls.request``) and what ``agboss show`` prints, text and JSON, are
searched for the card's number, CVC, expiry and holder name: none is there, while the
amount, currency and reference reconcile compares are.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner
from sqlalchemy import text

from celery_agboss import AGBoss, PaymentTask
from celery_agboss.adapters.adyen import AdyenPaymentRefused
from celery_agboss.adapters.stripe import StripeAdapter
from celery_agboss.cli import agboss
from celery_agboss.errors import MaskingPolicyError
from celery_agboss.store.migrate import migrate
from celery_agboss.testing.celery_app import close_test_app, make_test_app, running_worker
from celery_agboss.testing.stores import sqlite_store_url
from tests.adapters import stripe_support
from tests.adapters.conftest import ServeFn
from tests.adapters.own_payment_support import GATEWAYS, support

PAN, CVC, YEAR, HOLDER = "4111111111111111", "9183", "2047", "Ada Q. Lovelace"
NOTE = "a gift for Ada's cousin"  # what mask= adds: the shop's own field
TASK_ID = "card-data-order-7"


def _card_request(gateway: str) -> dict[str, Any]:
    request: dict[str, Any] = {"amount": 1000, "currency": "usd", "reference": "order-7"}
    request["description"] = NOTE
    if gateway == "checkout":
        request["source"] = {
            "type": "card",
            "number": PAN,
            "expiry_month": 11,
            "expiry_year": int(YEAR),
            "cvv": CVC,
            "name": HOLDER,
        }
    elif gateway == "adyen":
        request["source"] = {
            "type": "scheme",
            "number": PAN,
            "expiryMonth": "11",
            "expiryYear": YEAR,
            "cvc": CVC,
            "holderName": HOLDER,
        }
    elif gateway == "stripe":  # the Charges API's card source: refused, nothing sent
        card = {"object": "card", "number": PAN, "exp_month": 11, "exp_year": int(YEAR)}
        request["source"] = {**card, "cvc": CVC, "name": HOLDER}
    else:  # PayPal's own card field: refused, nothing sent
        card = {"number": PAN, "expiry": f"{YEAR}-11", "security_code": CVC, "name": HOLDER}
        request.update(source=support("paypal").VAULT_ID, payment_source={"card": card})
    return request


def _adapter(gateway: str, url: str, **options: Any) -> Any:
    if gateway == "stripe":
        return StripeAdapter(
            stripe_support.API_KEY, base_url=url, timeout=2, attempt_timeout=5, **options
        )
    return support(gateway).adapter_for(url, **options)


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Celery]:
    url = sqlite_store_url(tmp_path)
    migrate(url)
    made = make_test_app(url)
    yield made
    close_test_app(made)


def _pay(app: Celery, adapter: Any, request: dict[str, Any]) -> None:
    for call in adapter.calls:
        AGBoss.of(app).register(call)

    @app.task(base=PaymentTask, bind=True, name="shop.pay_by_card")  # type: ignore[untyped-decorator]
    def pay_by_card(self: PaymentTask) -> Any:
        return self.outbound(adapter.charge, request, business_key="order:7")

    with running_worker(app):
        pay_by_card.apply_async(task_id=TASK_ID).get(timeout=30, propagate=False)


def _stored_request(app: Celery) -> str:
    with AGBoss.of(app).store.engine.connect() as conn:
        rows = conn.execute(text("SELECT request FROM agboss_outbound_calls")).scalars().all()
    assert len(rows) == 1, rows
    return str(rows[0])


def _shown(app: Celery, *args: str) -> str:
    result = CliRunner().invoke(
        agboss,
        ["show", TASK_ID, *args],
        obj=CLIContext(app=app, no_color=True, workdir=None),
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    return result.output


def _card_data_in(output: str) -> list[str]:
    """Which of the card's number, CVC, expiry year and holder name ``output`` shows (as
    whole numbers or JSON strings: a digest's hex may hold the same digits)."""
    needles = {"number": PAN, "cvc": CVC, "expiry": YEAR}
    found = [name for name, digits in needles.items() if re.search(rf"\b{digits}\b", output)]
    return found + (["holder"] if HOLDER in output else [])


@pytest.mark.parametrize("gateway", GATEWAYS)
def test_the_card_is_neither_stored_nor_shown_and_reconcile_s_fields_are(
    gateway: str, served: ServeFn, app: Celery
) -> None:
    adapter = _adapter(gateway, served(gateway).url, mask=["description"])
    _pay(app, adapter, _card_request(gateway))
    row = _stored_request(app)
    assert _card_data_in(row) == [] and NOTE not in row, row
    stored = json.loads(row)
    carried = "payment_source" if gateway == "paypal" else "source"
    assert stored[carried] == "***" and stored["description"] == "***", stored
    assert (stored["amount"], stored["currency"], stored["reference"]) == (1000, "usd", "order-7")
    for output in (_shown(app), _shown(app, "--json")):
        assert "order-7" in output, output  # the intent is there ...
        assert _card_data_in(output) == [] and NOTE not in output, output  # ... its card is not


@pytest.mark.parametrize("gateway", GATEWAYS)
def test_mask_refuses_a_field_reconcile_compares_and_a_bare_string(
    gateway: str, served: ServeFn
) -> None:
    url = served(gateway).url
    for kept in ("amount", "currency", "reference", "payment_id"):
        with pytest.raises(MaskingPolicyError, match="kept for reconcile"):
            _adapter(gateway, url, mask=[kept])
    with pytest.raises(MaskingPolicyError, match="list of field paths"):
        _adapter(gateway, url, mask="description")


@pytest.mark.parametrize("gateway", GATEWAYS)
def test_every_call_of_the_adapter_masks_by_default(gateway: str, served: ServeFn) -> None:
    adapter = _adapter(gateway, served(gateway).url)
    card = _card_request(gateway)
    for call in adapter.calls:
        masked = call.mask.mask_request(card)
        assert _card_data_in(json.dumps(masked)) == [], (call.name, masked)


def test_an_adyen_refusal_keeps_none_of_the_card_details_adyen_adds_to_its_answer() -> None:
    """A refusal is stored with the failure (its arguments): Adyen's ``additionalData`` can
    name the card's holder, expiry and digits, and is not kept."""
    answer = {
        "pspReference": "PSP1",
        "resultCode": "Refused",
        "refusalReason": "Refused",
        "merchantReference": "order-7",
        "additionalData": {
            "cardHolderName": HOLDER,
            "expiryDate": f"11/{YEAR}",
            "cardBin": PAN[:6],
        },
    }
    refused = AdyenPaymentRefused(answer)
    kept = json.dumps(refused.__reduce__()[1])
    assert HOLDER not in kept and YEAR not in kept and "additionalData" not in kept, kept
    assert refused.answer["pspReference"] == "PSP1" and refused.psp_reference == "PSP1"
