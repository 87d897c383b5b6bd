"""What the webhook review found, fixed: each test fails on the code (or the docs) before.

- Adyen: a genuine notification that is not a payment's (``REPORT_AVAILABLE``, whose
  ``pspReference`` is the report's file name) verifies, alone and batched with payments;
  a payment's references are still held to Adyen's shape, every field to "no colon".
- Adyen: while the HMAC key is rotated, items signed with the previous key verify.
- Stripe: the replay window cannot be switched off (``inf``) nor widened past an hour.
- ``answer_pause_with_event``: an event that says "not decided yet" answers nothing, so
  the outcome after it is the answer the pause takes and the authorisation is captured.
- docs/webhooks.md, sections 2, 3 and 4: their code blocks are run as the page writes
  them (``exec``), on SQLite and PostgreSQL, counting captures at a fake gateway and the
  order's status in an application table.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select

from celery_agboss import AGBoss, Completed, NotSent, OutboundCall, PaymentTask
from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.outbound import CallContext, Lookup
from celery_agboss.errors import ConfigurationError
from celery_agboss.operator import answer_pause, read_pause
from celery_agboss.testing.celery_app import close_test_app, make_test_app
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_types import is_definite_failure
from celery_agboss.webhooks import (
    WebhookEvent,
    WebhookPayloadError,
    WebhookSignatureError,
    answer_pause_with_event,
    check_stripe_signature,
    record_event,
    sign_adyen_item,
    sign_stripe,
    verify_adyen,
    verify_stripe,
    verify_webhook,
)
from tests.support.stores import STORE_BACKENDS, fresh_store_url
from tests.webhooks.signing_keys import ADYEN_KEY, STRIPE_SECRET, adyen_item

ROOT = Path(__file__).resolve().parents[2]
WEBHOOKS_MD = ROOT / "docs" / "webhooks.md"
NOW = 1_700_000_000
ACCOUNTS = ["ShopAccount"]
PREVIOUS_ADYEN_KEY = "0F1E2D3C4B5A69788796A5B4C3D2E1F00F1E2D3C4B5A69788796A5B4C3D2E1F0"


# --- Adyen: notifications that are not a payment's -----------------------------------------


def _signed(item: dict[str, Any], key: str = ADYEN_KEY) -> dict[str, Any]:
    """The item as Adyen sends it: with its ``additionalData.hmacSignature``."""
    return {**item, "additionalData": {"hmacSignature": sign_adyen_item(item, key)}}


def _body(*items: dict[str, Any]) -> bytes:
    wrapped = [{"NotificationRequestItem": item} for item in items]
    return json.dumps({"live": "false", "notificationItems": wrapped}).encode()


# Adyen's own example (docs.adyen.com/reporting/automatically-get-reports): the
# pspReference is the report's file name, not a 16-character payment reference.
REPORT_AVAILABLE = adyen_item(
    amount={"currency": "EUR", "value": 0},
    eventCode="REPORT_AVAILABLE",
    eventDate="2018-04-18T10:03:08+02:00",
    merchantReference="",
    pspReference="settlement_detail_report_batch_12.csv",
    reason="https://ca-test.adyen.com/reports/download/MerchantAccount/ShopAccount/"
    "settlement_detail_report_batch_12.csv",
    success="true",
)
REFUND = adyen_item(
    eventCode="REFUND", pspReference="8814073381349981", originalReference="7914073381342284"
)


def test_a_genuine_report_available_notification_is_handed_over() -> None:
    """Refused (400) before, it headed Adyen's retry queue for 30 days."""
    (event,) = verify_adyen(_body(_signed(REPORT_AVAILABLE)), ADYEN_KEY, merchant_accounts=ACCOUNTS)
    assert (event.type, event.object_id) == (
        "REPORT_AVAILABLE",
        "settlement_detail_report_batch_12.csv",
    )
    assert event.business_key == (
        "event:adyen:settlement_detail_report_batch_12.csv:REPORT_AVAILABLE:true"
    )


def test_payments_batched_with_a_report_are_not_refused_with_it() -> None:
    body = _body(_signed(adyen_item()), _signed(REPORT_AVAILABLE), _signed(REFUND))
    events = verify_adyen(body, ADYEN_KEY, merchant_accounts=ACCOUNTS)
    assert [e.type for e in events] == ["AUTHORISATION", "REPORT_AVAILABLE", "REFUND"]
    assert events[2].object_id == "7914073381342284", "a refund is about its payment"


@pytest.mark.parametrize(
    "item",
    [
        adyen_item(pspReference="settlement_detail_report_batch_12.csv"),
        adyen_item(eventCode="CAPTURE", originalReference="settlement.csv"),
        adyen_item(eventCode="REFUND", pspReference=None),
    ],
    ids=["authorisation", "capture-of-no-payment", "refund-without-reference"],
)
def test_a_payments_references_are_still_held_to_adyens_shape(item: dict[str, Any]) -> None:
    with pytest.raises(WebhookSignatureError, match="not an Adyen reference") as excinfo:
        verify_adyen(_body(_signed(item)), ADYEN_KEY, merchant_accounts=ACCOUNTS)
    assert excinfo.value.reason == "malformed"


def test_a_colon_is_refused_in_every_notification_not_only_a_payments() -> None:
    """The one refusal that keeps the signed text's split unique stays for all."""
    split = {**REPORT_AVAILABLE, "pspReference": "report:12.csv"}
    with pytest.raises(WebhookSignatureError, match="contains ':'"):
        verify_adyen(_body(_signed(split)), ADYEN_KEY, merchant_accounts=ACCOUNTS)


@pytest.mark.parametrize("account", [[], {}, ["ShopAccount"]])
def test_a_signed_merchant_account_that_is_not_text_is_refused_not_a_500(account: Any) -> None:
    """``[] in frozenset`` raises ``TypeError``: an anonymous request's 500 before (the
    property test met it once payments' reference shapes no longer refused it first)."""
    item = _signed(adyen_item(merchantAccountCode=account))
    with pytest.raises(WebhookPayloadError) as excinfo:
        verify_adyen(_body(item), ADYEN_KEY, merchant_accounts=ACCOUNTS)
    assert excinfo.value.reason == "merchant-account"


# --- Adyen: the HMAC key rotated -------------------------------------------------------------


def test_items_signed_with_the_previous_key_pass_while_the_key_is_rotated() -> None:
    both = [ADYEN_KEY, PREVIOUS_ADYEN_KEY]
    old = _body(_signed(adyen_item(), PREVIOUS_ADYEN_KEY))
    new = _body(_signed(adyen_item(), ADYEN_KEY))
    mixed = _body(_signed(adyen_item(), PREVIOUS_ADYEN_KEY), _signed(REFUND, ADYEN_KEY))
    for body in (old, new):
        assert len(verify_adyen(body, both, merchant_accounts=ACCOUNTS)) == 1
    assert len(verify_adyen(mixed, both, merchant_accounts=ACCOUNTS)) == 2
    assert verify_webhook("adyen", old, {}, both, merchant_accounts=ACCOUNTS)
    assert verify_adyen(old, (PREVIOUS_ADYEN_KEY,), merchant_accounts=ACCOUNTS)
    # Once the previous key is dropped, what it signs is refused; so is a third key's.
    with pytest.raises(WebhookSignatureError) as excinfo:
        verify_adyen(old, [ADYEN_KEY], merchant_accounts=ACCOUNTS)
    assert excinfo.value.reason == "mismatch"
    other = _body(_signed(adyen_item(), "ab" * 32))
    with pytest.raises(WebhookSignatureError):
        verify_adyen(other, both, merchant_accounts=ACCOUNTS)


@pytest.mark.parametrize("keys", [[], [ADYEN_KEY, "not hex"], [ADYEN_KEY, b"ab"], None, b"ab"])
def test_a_key_list_that_is_empty_or_holds_no_hex_key_is_a_configuration_error(keys: Any) -> None:
    with pytest.raises(ConfigurationError, match="Adyen HMAC key"):
        verify_adyen(_body(_signed(adyen_item())), keys, merchant_accounts=ACCOUNTS)


def test_only_adyens_verifier_takes_a_list_of_secrets() -> None:
    body = b'{"id": "evt_1", "type": "payment_intent.succeeded", "data": {"object": {}}}'
    headers = {"Stripe-Signature": sign_stripe(body, STRIPE_SECRET)}
    with pytest.raises(ConfigurationError, match="only Adyen"):
        verify_webhook("stripe", body, headers, [STRIPE_SECRET])
    assert verify_webhook("stripe", body, headers, STRIPE_SECRET)[0].event_id == "evt_1"


# --- Stripe: the replay window -------------------------------------------------------------


@pytest.mark.parametrize("tolerance", [float("inf"), 3601, 1e9, True, "300", None])
def test_the_stripe_tolerance_cannot_be_switched_off_or_widened_past_an_hour(
    tolerance: Any,
) -> None:
    body = b'{"id": "evt_old", "type": "payment_intent.succeeded", "data": {"object": {}}}'
    year_ago = sign_stripe(body, STRIPE_SECRET, timestamp=NOW - 365 * 24 * 3600)
    with pytest.raises(ConfigurationError, match="at most 3600"):
        check_stripe_signature(body, year_ago, STRIPE_SECRET, tolerance=tolerance, now=NOW)
    with pytest.raises(ConfigurationError):
        verify_stripe(body, year_ago, STRIPE_SECRET, tolerance=tolerance, now=NOW)


def test_a_tolerance_of_an_hour_is_the_widest() -> None:
    body = b'{"id": "evt_1", "type": "payment_intent.succeeded", "data": {"object": {}}}'
    at_the_edge = sign_stripe(body, STRIPE_SECRET, timestamp=NOW - 3600)
    assert verify_stripe(body, at_the_edge, STRIPE_SECRET, tolerance=3600, now=NOW)
    beyond = sign_stripe(body, STRIPE_SECRET, timestamp=NOW - 3601)
    with pytest.raises(WebhookSignatureError) as excinfo:
        verify_stripe(body, beyond, STRIPE_SECRET, tolerance=3600, now=NOW)
    assert excinfo.value.reason == "stale"


# --- a shop on both stores: an app, a fake gateway, 3-D Secure at the gateway ---------------


@dataclass
class Shop:
    """An app on a throwaway store, a fake gateway, and the customer's 3-D Secure: until
    ``authenticated`` names a payment, the gateway says it ``requires_action``."""

    app: Celery
    gateway: FakeGateway
    authenticated: set[str] = field(default_factory=set)
    calls: dict[str, OutboundCall] = field(default_factory=dict)

    def retrieve(self, payment_id: str) -> dict[str, Any]:
        """``gateway_client.retrieve``: the PaymentIntent's status now."""
        payment = self.gateway.retrieve(payment_id)
        if payment_id not in self.authenticated:
            return {**payment, "status": "requires_action"}
        return payment

    def execution_state(self, execution_id: str) -> ExecutionState:
        record = AGBoss.of(self.app).executions.read_execution(execution_id)
        assert record is not None, execution_id
        return record.state


@pytest.fixture(params=STORE_BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fresh_store_url(request, tmp_path, "webhooks-migrated")


@pytest.fixture
def shop(store_url: str) -> Iterator[Shop]:
    clock = VirtualClock()
    app = make_test_app(store_url, clock_offset_source=clock.offset_ms)
    gateway = FakeGateway(clock=clock, hold_timeout=20)
    made = Shop(app=app, gateway=gateway)
    agboss = AGBoss.of(app)

    def by_lookup(call: CallContext, lookup: Lookup) -> Any:
        found = gateway.lookup(lookup.idempotency_key)
        return NotSent() if found is None else Completed(found)

    def authorize(call: CallContext) -> Any:
        order = str(call.request["order"])
        return gateway.charge(1500, call.idempotency_key, reference=order, capture=False)

    def capture(call: CallContext) -> Any:
        return gateway.capture(call.request["payment"], call.idempotency_key)

    for name, send in (("shop.authorize", authorize), ("shop.capture", capture)):
        made.calls[name] = agboss.register(
            OutboundCall(
                name=name,
                send=send,
                reconcile=by_lookup,
                key_retention=timedelta(hours=24),
                is_definite_failure=is_definite_failure,
                transaction_id=lambda result: result.get("id"),
            )
        )
    try:
        yield made
    finally:
        gateway.close()
        close_test_app(app)


def _stripe_event(event_id: str, type_: str, obj: dict[str, Any]) -> WebhookEvent:
    """A genuine Stripe delivery, verified as the endpoint does."""
    body = json.dumps({"id": event_id, "type": type_, "data": {"object": obj}}).encode()
    return verify_stripe(body, sign_stripe(body, STRIPE_SECRET), STRIPE_SECRET)


NOT_YET = [
    WebhookEvent("stripe", "evt_created", "payment_intent.created", "pi_1", {}),
    WebhookEvent("stripe", "evt_action", "payment_intent.requires_action", "pi_1", {}),
    WebhookEvent("stripe", "evt_processing", "payment_intent.processing", "pi_1", {}),
    WebhookEvent("checkout", "evt_pending", "payment_pending", "pay_1", {}),
]


def test_a_not_yet_event_answers_nothing_and_the_outcome_is_captured_once(shop: Shop) -> None:
    """The reviewer's case, with an endpoint that answers with whatever Stripe sends (as
    docs/webhooks.md said before): ``payment_intent.requires_action`` arrives while the
    body authorises. Before, it was kept as the early answer and taken, the body read
    "requires_action" and ended, and the outcome's webhook was refused: the authorised
    money was never captured."""
    answered_meanwhile: list[bool] = []

    @shop.app.task(base=PaymentTask, bind=True, name="review.checkout_one_wait")  # type: ignore[untyped-decorator]
    def checkout(self: PaymentTask, order_id: str) -> Any:
        payment = self.outbound(
            shop.calls["shop.authorize"], {"order": order_id}, business_key=f"order:{order_id}"
        )
        pause_id = f"{self.request.id}:gateway-outcome"
        if not answered_meanwhile:  # Stripe's webhooks while the body is still here
            answered_meanwhile.extend(
                answer_pause_with_event(self.app, pause_id, event) for event in NOT_YET
            )
            assert read_pause(self.app, pause_id) is None, "a not-yet answer was kept"
        self.pause("gateway-outcome", {"payment": payment["id"]}, accept_early=True)
        current = shop.retrieve(payment["id"])["status"]
        status = self.fenced_effect(
            "outcome-reading", lambda conn: current, business_key=f"order:{order_id}:outcome"
        )
        if status == "requires_capture":
            self.outbound(
                shop.calls["shop.capture"],
                {"payment": payment["id"]},
                business_key=f"order:{order_id}:capture",
            )
        return status

    execution_id = f"checkout-{uuid.uuid4().hex}"
    checkout.apply(args=("o-1",), task_id=execution_id)
    assert answered_meanwhile == [False] * len(NOT_YET)
    assert shop.execution_state(execution_id) is ExecutionState.PAUSED
    (payment,) = shop.gateway.payments
    shop.authenticated.add(payment["id"])  # the customer passes 3-D Secure
    outcome = _stripe_event(
        "evt_outcome", "payment_intent.amount_capturable_updated", {"id": payment["id"]}
    )
    assert answer_pause_with_event(shop.app, f"{execution_id}:gateway-outcome", outcome)
    assert checkout.apply(args=("o-1",), task_id=execution_id).get() == "requires_capture"
    assert [c["payment"] for c in shop.gateway.captures] == [payment["id"]]
    assert len(shop.gateway.payments) == 1


# --- docs/webhooks.md's code blocks, run as written -------------------------------------------


def _doc_blocks(section: str) -> list[str]:
    """The ```python blocks of docs/webhooks.md's section headed ``## <section>``."""
    text = WEBHOOKS_MD.read_text(encoding="utf-8")
    start = text.index(f"\n## {section}")
    end = text.find("\n## ", start + 1)
    body = text[start : end if end != -1 else len(text)]
    return re.findall(r"```python\n(.*?)```", body, flags=re.DOTALL)


def _run(code: str, module: str, **names: Any) -> dict[str, Any]:
    """Run a doc block as a module of its own, with the names the page leaves to you."""
    namespace: dict[str, Any] = {"__name__": module, **names}
    exec(compile(code, f"docs/webhooks.md ({module})", "exec"), namespace)
    return namespace


orders_tables = MetaData()
orders = Table(
    "review_docs_orders",
    orders_tables,
    Column("id", String(50), primary_key=True),
    Column("amount", Integer, nullable=False),  # minor units
    Column("currency", String(3), nullable=False),
    Column("payment_id", String(100), nullable=True),  # the PaymentIntent the charge made
    Column("status", String(20), nullable=False),
    Column("rank", Integer, nullable=False),
)


def _place_order(
    app: Celery, order_id: str, payment_id: str, amount: int = 15000, currency: str = "EUR"
) -> None:
    engine = AGBoss.of(app).store.engine
    orders_tables.create_all(engine)
    with engine.begin() as conn:
        conn.execute(
            insert(orders).values(
                id=order_id,
                amount=amount,
                currency=currency,
                payment_id=payment_id,
                status="pending",
                rank=0,
            )
        )


def _order_status(app: Celery, order_id: str) -> str:
    with AGBoss.of(app).store.engine.connect() as conn:
        return str(conn.execute(select(orders.c.status).where(orders.c.id == order_id)).scalar())


def _intent(pi: str, amount: int, currency: str = "eur", **more: Any) -> dict[str, Any]:
    return {
        "id": pi,
        "object": "payment_intent",
        "amount": amount,
        "amount_received": amount,
        "amount_capturable": 0,
        "currency": currency,
        "status": "succeeded",
        "metadata": {"order": "42"},
        **more,
    }


@pytest.fixture
def docs_sections_2_and_4(shop: Shop) -> dict[str, Any]:
    """Sections 2 and 4 as modules, each task on the shop's app; ``intents`` is what the
    gateway says of each PaymentIntent when section 4 reads it."""
    intents: dict[str, dict[str, Any]] = {}

    def read(call: CallContext) -> Any:
        return intents[str(call.request["id"])]

    read_payment = AGBoss.of(shop.app).register(
        OutboundCall(
            name="docs.read_payment",
            send=read,
            reconcile=lambda call, lookup: NotSent(),  # a read: harmless to send again
            key_retention=timedelta(hours=24),
        )
    )
    section_4: dict[str, Any] = {}
    (section_2_code,) = _doc_blocks("2. ")
    section_2 = _run(
        section_2_code,
        "docs_webhooks_2",
        app=shop.app,
        orders=orders,
        advance=lambda *args: section_4["advance"](*args),
    )
    (section_4_code,) = _doc_blocks("4. ")
    section_4.update(
        _run(
            section_4_code,
            "docs_webhooks_4",
            app=shop.app,
            orders=orders,
            read_payment=read_payment,
            STATUS_OF={"requires_capture": "authorised", "succeeded": "paid"},
            PaymentTask=PaymentTask,
            WebhookEvent=WebhookEvent,
            record_event=record_event,
            move_order=section_2["move_order"],
        )
    )
    return {"2": section_2, "4": section_4, "intents": intents}


def _deliver(task: Any, event: WebhookEvent) -> Any:
    return task.apply(args=(event.to_message(),), task_id=f"wh-{uuid.uuid4().hex}").get()


def test_section_2_a_signed_success_of_an_older_smaller_payment_does_not_pay_the_order(
    shop: Shop, docs_sections_2_and_4: dict[str, Any]
) -> None:
    """Order 42 costs 150.00 EUR and stored pi_new; pi_old (100.00, the cart before an
    item was added) is paid and Stripe signs its success with the order's metadata."""
    _place_order(shop.app, "42", "pi_new")
    task = docs_sections_2_and_4["2"]["apply_payment_event"]
    wrong = [
        _intent("pi_old", 10000),  # the older, smaller PaymentIntent
        _intent("pi_new", 15000, currency="usd"),  # the right one in another currency
        _intent("pi_new", 15000, amount_received=10000),  # not all of it received
    ]
    for n, intent in enumerate(wrong):
        result = _deliver(task, _stripe_event(f"evt_wrong_{n}", "payment_intent.succeeded", intent))
        assert result == {"order": "42", "status": "pending", "not_this_order": intent["id"]}
        assert _order_status(shop.app, "42") == "pending"
    paid = _stripe_event("evt_paid", "payment_intent.succeeded", _intent("pi_new", 15000))
    assert _deliver(task, paid) == {"order": "42", "status": "paid"}
    assert _order_status(shop.app, "42") == "paid"


def test_section_2_pays_an_order_in_a_currency_stripe_writes_otherwise(
    shop: Shop, docs_sections_2_and_4: dict[str, Any]
) -> None:
    """Order 42 costs 1,000 ISK, charged with ``amount`` 1000 (ISO 4217 minor units, as
    every adapter takes it); Stripe writes ISK with two decimals, so its signed success
    says ``amount_received`` 100000. Compared raw, the paid order read as paid by another
    payment and stayed pending; a payment of 10 ISK (1000 in Stripe's units) pays nothing."""
    _place_order(shop.app, "42", "pi_isk", amount=1000, currency="ISK")
    task = docs_sections_2_and_4["2"]["apply_payment_event"]
    short = _intent("pi_isk", 1000, currency="isk")
    result = _deliver(task, _stripe_event("evt_isk_short", "payment_intent.succeeded", short))
    assert result == {"order": "42", "status": "pending", "not_this_order": "pi_isk"}
    paid = _intent("pi_isk", 100000, currency="isk")
    result = _deliver(task, _stripe_event("evt_isk_paid", "payment_intent.succeeded", paid))
    assert result == {"order": "42", "status": "paid"}
    assert _order_status(shop.app, "42") == "paid"


def test_section_4_reads_the_payment_and_moves_the_order_only_for_its_own(
    shop: Shop, docs_sections_2_and_4: dict[str, Any]
) -> None:
    _place_order(shop.app, "42", "pi_new")
    intents, task = docs_sections_2_and_4["intents"], docs_sections_2_and_4["4"]
    intents["pi_old"] = _intent("pi_old", 10000)
    old = _stripe_event("evt_old", "payment_intent.succeeded", {"id": "pi_old"})
    assert _deliver(task["apply_payment_event"], old)["not_this_order"] == "pi_old"
    assert _order_status(shop.app, "42") == "pending"
    intents["pi_new"] = _intent(
        "pi_new", 15000, status="requires_capture", amount_received=0, amount_capturable=15000
    )
    held = _stripe_event("evt_held", "payment_intent.amount_capturable_updated", {"id": "pi_new"})
    assert _deliver(task["apply_payment_event"], held) == {"order": "42", "status": "authorised"}


def test_section_3_a_wait_answered_too_soon_waits_again_and_the_outcome_is_captured_once(
    shop: Shop,
) -> None:
    """The return page answers the first wait while the customer is still at the bank;
    the body reads "requires_action", which decides nothing, and waits again. Stripe's
    "not yet" events answer nothing; the outcome's event answers the second wait (and a
    copy of it, delivered again, answers nothing more): one capture at the gateway."""
    endpoint_code, body_code = _doc_blocks("3. ")
    endpoint = _run(endpoint_code, "docs_webhooks_3_endpoint")
    body = _run(
        body_code,
        "docs_webhooks_3_body",
        app=shop.app,
        authorize=shop.calls["shop.authorize"],
        capture=shop.calls["shop.capture"],
        gateway_client=shop,
        outcome_pause=endpoint["outcome_pause"],
    )
    checkout, answer_outcome = body["checkout"], endpoint["answer_outcome"]
    execution_id = f"checkout-{uuid.uuid4().hex}"
    checkout.apply(args=("o-3ds",), task_id=execution_id)
    (payment,) = shop.gateway.payments
    pi = payment["id"]
    not_yet = _stripe_event("evt_action", "payment_intent.requires_action", {"id": pi})
    assert answer_outcome(shop.app, execution_id, not_yet) is False
    assert answer_pause(shop.app, f"{execution_id}:gateway-outcome", {"source": "return-page"})
    checkout.apply(args=("o-3ds",), task_id=execution_id)  # the re-drive the answer published
    assert shop.execution_state(execution_id) is ExecutionState.PAUSED
    second_wait = read_pause(shop.app, f"{execution_id}:gateway-outcome-2")
    assert second_wait is not None and second_wait.status == "PENDING"
    assert shop.gateway.captures == []

    shop.authenticated.add(pi)  # the bank answers; Stripe says so
    outcome = _stripe_event("evt_outcome", "payment_intent.amount_capturable_updated", {"id": pi})
    assert answer_outcome(shop.app, execution_id, outcome) is True
    assert checkout.apply(args=("o-3ds",), task_id=execution_id).get() == "requires_capture"
    assert answer_outcome(shop.app, execution_id, outcome) is False, "its copy, after the end"
    checkout.apply(args=("o-3ds",), task_id=execution_id).get()  # any later re-drive
    assert [c["payment"] for c in shop.gateway.captures] == [pi]
    assert len(shop.gateway.payments) == 1
