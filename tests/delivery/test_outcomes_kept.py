"""What a delivery keeps, and what a duplicate gives back.

- The execution's stored failure (design: masking) passes the masking policy of the calls its
  delivery made (a decline quoting a card number is stored masked), and so does a
  reconcile's ``Unknown`` reason kept for the operator; a decline that carries the
  request is stored with the request's masked fields masked.
- A result JSON cannot hold is refused at completion, before anything is recorded as
  done; a duplicate of a completed execution whose result this store cannot give back
  never writes ``FAILURE`` over the ``SUCCESS`` the result backend holds, nor fires
  ``link_error``.
- A retry that does not go out (the package's own budget spent) does not swallow a
  deferred duplicate's wake: the release publishes the continuation. ``self.retry()``
  of a started execution carries no ``expires`` (design: expires bounds the start), and
  a message past its ``expires`` is judged by the store: either protection alone keeps
  the retry running.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from celery_agboss import NotSent, OutboundCall, Unknown
from celery_agboss.core.compensation import UndoStep
from celery_agboss.core.failures import MESSAGE_NOT_STORED
from celery_agboss.core.log_events import EXECUTION_COMPLETED
from celery_agboss.core.masking import MaskingPolicy
from celery_agboss.core.protections import (
    EXPIRY_REVOKES_THE_ID,
    FAILURE_FOR_AN_UNFINISHED_EXECUTION,
    RETRY_KEEPS_EXPIRES,
    STORED_ERROR_UNMASKED,
    UNSTORED_RESULT_REPLAYED_AS_FAILURE,
    WAKE_FOLDED_INTO_REFUSED_RETRY,
)
from celery_agboss.core.transitions import NOT_STORED_TEXT
from celery_agboss.delivery.outcomes import decode_error
from celery_agboss.delivery.waits import OWN_RETRIES_HEADER, PACKAGE_RETRY_BUDGET
from celery_agboss.task import undo_function
from celery_agboss.testing.gateway_types import FakeGatewayFault
from celery_agboss.testing.switches import sabotage
from tests.delivery.conftest import PaymentShop
from tests.support.processes import assert_stays, wait_until

CARD = "4242424242424242"


class Declined(Exception):
    """The gateway processed nothing (a definite failure); its text quotes the card."""


def _hide_cards(text: str) -> str:
    return re.sub(r"\d{12,19}", "****", text)


def _strict_charge(shop: PaymentShop, reconcile: Any = None) -> OutboundCall:
    def send(call: Any) -> Any:
        raise Declined(f"card {call.request['card']} declined: insufficient funds")

    call = OutboundCall(
        name="shop.strict_charge",
        send=send,
        reconcile=reconcile or (lambda call, lookup: NotSent()),
        key_retention=timedelta(hours=24),
        is_definite_failure=lambda exc: isinstance(exc, Declined),
        mask=MaskingPolicy(mask=["card"], mask_errors=_hide_cards),
    )
    return shop.agboss.register(call)


def _declined_order(shop: PaymentShop) -> str:
    call = _strict_charge(shop)

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        return self.outbound(call, {"amount": 1000, "card": CARD}, business_key=order)

    return shop.run(pay, "o-1", states=("FAILED",))


def test_a_decline_quoting_the_card_is_stored_masked(shop: PaymentShop) -> None:
    task_id = _declined_order(shop)
    error = shop.execution(task_id).error or ""
    assert "declined" in error and "****" in error
    assert CARD not in error
    (intent,) = shop.intents(task_id)
    assert CARD not in repr(intent.request)


def test_without_masking_the_stored_failure_quotes_the_card(shop: PaymentShop) -> None:
    with sabotage(STORED_ERROR_UNMASKED):
        task_id = _declined_order(shop)
    assert CARD in (shop.execution(task_id).error or ""), "stored in clear"


class CardDeclined(Exception):
    """A gateway SDK error that keeps the request it refused (as many SDKs do)."""

    def __init__(self, message: str, request: dict[str, Any]) -> None:
        super().__init__(message, request)
        self.request = request


CVC = "cvc-737"  # a CVC as a text no other column can hold by chance


def _card_declined_order(shop: PaymentShop) -> str:
    """docs/masking.md's policy: card fields masked, error texts scrubbed of numbers."""

    def send(call: Any) -> Any:
        raise CardDeclined("card declined", call.request)

    charge = shop.agboss.register(
        OutboundCall(
            name="shop.card_charge",
            send=send,
            reconcile=lambda call, lookup: NotSent(),
            key_retention=timedelta(hours=24),
            is_definite_failure=lambda exc: isinstance(exc, CardDeclined),
            mask=MaskingPolicy(
                mask=["card.number", "card.cvc"],
                keep_for_reconcile=["amount", "order"],
                mask_errors=_hide_cards,
            ),
        )
    )

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        request = {"amount": 1000, "order": order, "card": {"number": CARD, "cvc": CVC}}
        return self.outbound(charge, request)

    return shop.run(pay, "o-1", states=("FAILED",))


def _stored(url: str, table: str, column: str) -> list[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [str(v) for (v,) in conn.execute(text(f"SELECT {column} FROM {table}"))]
    finally:
        engine.dispose()


def test_a_declined_requests_card_fields_are_not_stored_with_its_failure(
    shop: PaymentShop, delivery_store_url: str
) -> None:
    """The decline carries the request: its card fields are masked as the request's are,
    and its text is made again from the masked request."""
    execution_id = _card_declined_order(shop)
    (intent,) = shop.intents(execution_id)
    assert intent.request["card"] == {"number": "***", "cvc": "***"}
    (failure,) = _stored(delivery_store_url, "agboss_outbound_calls", "failure")
    history = _stored(delivery_store_url, "agboss_intent_history", "detail")
    for stored in (failure, *history):
        assert CVC not in stored and CARD not in stored, stored
    assert "card declined" in failure and "'cvc': '***'" in failure


def test_a_declined_requests_card_fields_are_not_stored_with_the_executions_error(
    shop: PaymentShop, delivery_store_url: str
) -> None:
    _card_declined_order(shop)
    (error,) = _stored(delivery_store_url, "agboss_executions", "error")
    assert CVC not in error and CARD not in error, error
    assert "card declined" in error and "'cvc': '***'" in error, error


def test_without_masking_the_executions_error_keeps_the_declined_requests_cvc(
    shop: PaymentShop, delivery_store_url: str
) -> None:
    with sabotage(STORED_ERROR_UNMASKED):
        _card_declined_order(shop)
    (error,) = _stored(delivery_store_url, "agboss_executions", "error")
    assert CVC in error, "stored in clear"


def test_an_undo_failure_carrying_a_request_is_kept_masked_in_the_reason(
    shop: PaymentShop,
) -> None:
    """An undo's refund refused by an SDK error that keeps the refund's request: the
    reason a person reads (and the store keeps) masks the card fields the delivery's
    calls mask."""
    charge = shop.agboss.register(
        OutboundCall(
            name="shop.card_charge_ok",
            send=lambda call: shop.gateway.charge(1000, call.idempotency_key),
            reconcile=lambda call, lookup: NotSent(),
            key_retention=timedelta(hours=24),
            mask=MaskingPolicy(mask=["card.number", "card.cvc"], mask_errors=_hide_cards),
        )
    )

    @undo_function(shop.app, "refund-card")
    def refund_card(task: Any, undo: UndoStep, order: str) -> None:
        raise CardDeclined("refund declined", {"card": {"number": CARD, "cvc": CVC}})

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        card = {"number": CARD, "cvc": CVC}
        self.outbound(charge, {"amount": 1000, "card": card}, business_key=order)
        self.undo_with("refund-card", order=order)
        raise LookupError("out of stock")

    execution_id = shop.run(pay, "o-7", states=("WAITING_OPERATOR",))
    reason = shop.execution(execution_id).reason or ""
    assert reason.startswith("undo refund-card failed: CardDeclined: ('refund declined'"), reason
    assert CVC not in reason and CARD not in reason, reason


class OrderRefused(Exception):
    """An application's own error: a message and the order line it refused."""


def test_an_error_holding_a_decimal_is_kept_and_raised_as_it_was(shop: PaymentShop) -> None:
    """In an app that masks nothing, an error whose argument JSON cannot hold (a
    ``Decimal`` price) keeps its text, and the delivery that ran the undos raises it to
    Celery as it was (not the not-stored marker); so does an undo's failure reason."""
    charge = shop.call()

    @undo_function(shop.app, "refund-refused")
    def refund_refused(task: Any, undo: UndoStep, payment: str) -> None:
        raise OrderRefused("refund refused: balance too low", {"amount": Decimal("10.00")})

    @shop.task()
    def place(self: Any, order: str, undo_fails: bool) -> Any:
        receipt = self.outbound(charge, {"amount": 1000}, business_key=f"order:{order}")
        if undo_fails:
            self.undo_with("refund-refused", payment=receipt["id"])
        raise OrderRefused("sku X-1 out of stock", {"sku": "X-1", "price": Decimal("9.99")})

    failed = shop.run(place, "o-8", False, states=("FAILED",))
    stored = shop.execution(failed).error or ""
    assert MESSAGE_NOT_STORED not in stored and "out of stock" in stored, stored
    raised = decode_error(stored)
    assert isinstance(raised, OrderRefused), (type(raised), raised)
    waiting = shop.run(place, "o-9", True, states=("WAITING_OPERATOR",))
    assert "balance too low" in (shop.execution(waiting).reason or "")


def test_another_calls_error_masking_never_erases_this_error(shop: PaymentShop) -> None:
    """A gateway's ``mask_errors`` written for its own texts (JSON bodies) raises on any
    other: the errors of tasks that never made its call are not its to mask."""

    def scrub_json_body(text: str) -> str:
        body = json.loads(text)
        body.pop("card", None)
        return json.dumps(body)

    shop.agboss.register(
        OutboundCall(
            name="other.gateway_charge",
            send=lambda call: {"id": "x"},
            reconcile=lambda call, lookup: NotSent(),
            key_retention=timedelta(hours=24),
            mask=MaskingPolicy(mask_errors=scrub_json_body),
        )
    )

    @shop.task()
    def ship(self: Any, order: str) -> Any:
        raise LookupError(f"order {order}: warehouse unreachable")

    stored = shop.execution(shop.run(ship, "o-10", states=("FAILED",))).error or ""
    assert "warehouse unreachable" in stored and NOT_STORED_TEXT not in stored, stored


def test_a_reconcile_reason_kept_for_the_operator_is_masked(shop: PaymentShop) -> None:
    def unsure(call: Any, lookup: Any) -> Any:
        return Unknown(f"the gateway shows card {CARD} under review")

    call = OutboundCall(
        name="shop.review_charge",
        send=lambda c: shop.gateway.charge(1000, c.idempotency_key),
        reconcile=unsure,
        key_retention=timedelta(hours=24),
        mask=MaskingPolicy(mask_errors=_hide_cards),
    )
    shop.agboss.register(call)

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        return self.outbound(call, {"amount": 1000}, business_key=order)

    shop.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    task_id = shop.run(pay, "o-5", states=("WAITING_OPERATOR",))
    (intent,) = shop.intents(task_id)
    assert intent.needs_operator and "under review" in (intent.operator_reason or "")
    assert CARD not in (intent.operator_reason or "")
    history = shop.agboss.store.read_history(intent.idempotency_key)
    assert all(CARD not in repr(row.detail) for row in history)


# --- results ------------------------------------------------------------------------------


class Receipt:
    """Not JSON: what a body must not return without ``result_serializer = "pickle"``."""


def test_a_result_json_cannot_hold_is_refused_before_it_is_recorded_as_done(
    shop: PaymentShop,
) -> None:
    @shop.task()
    def pay(self: Any) -> Any:
        return Receipt()

    with shop.worker():
        result = pay.delay()
        record = shop.wait_state(str(result.id), "FAILED", "COMPLETED")
    assert record.state.value == "FAILED"
    assert "cannot be stored as JSON" in (record.error or "")
    assert result.state == "FAILURE"


def _completed_with_a_pickled_result_then_a_duplicate(
    shop: PaymentShop, *, expect_refund: bool = False
) -> tuple[Any, list[str]]:
    """A result kept pickled (``result_serializer = "pickle"``); then the app moves to
    JSON results, and a late duplicate of the execution arrives with an errback (a
    refund). Returns once the duplicate was delivered and had its chance to write."""
    errbacks: list[str] = []

    @shop.task()
    def pay(self: Any) -> Any:
        return {"when": datetime(2026, 12, 1, tzinfo=timezone.utc), "receipt": Receipt()}

    @shop.app.task(shared=False, name="shop.refund_on_error")
    def refund_on_error(*args: Any, **kwargs: Any) -> None:
        errbacks.append("refund")

    shop.app.conf.result_serializer = "pickle"
    shop.app.conf.accept_content = ["json", "pickle"]
    shop.app.conf.result_accept_content = ["json", "pickle"]
    with shop.worker():
        first = pay.apply_async()
        shop.wait_state(str(first.id), "COMPLETED")
        wait_until(lambda: first.state == "SUCCESS", 10, message="SUCCESS in the backend")
        shop.app.conf.result_serializer = "json"
        pay.apply_async(task_id=str(first.id), link_error=refund_on_error.s())
        if expect_refund:
            wait_until(lambda: errbacks, 10, message="the errback")
        else:  # a negative claim needs a window: nothing may change in it
            assert_stays(lambda: backend_state(shop, first) == "SUCCESS" and not errbacks, 2.0)
    return first, errbacks


def backend_state(shop: PaymentShop, result: Any) -> str:
    """What the result backend holds now (an ``AsyncResult`` caches a ready state)."""
    return str(shop.app.AsyncResult(str(result.id)).state)


def test_a_duplicate_never_writes_failure_over_success_nor_fires_link_error(
    shop: PaymentShop,
) -> None:
    first, errbacks = _completed_with_a_pickled_result_then_a_duplicate(shop)
    assert backend_state(shop, first) == "SUCCESS" and errbacks == []


def test_a_duplicate_that_raises_instead_refunds_a_paid_order(shop: PaymentShop) -> None:
    # Two protections stand here since the result backend writes FAILURE only for a
    # FAILED execution: both are off.
    with sabotage(UNSTORED_RESULT_REPLAYED_AS_FAILURE, FAILURE_FOR_AN_UNFINISHED_EXECUTION):
        _, errbacks = _completed_with_a_pickled_result_then_a_duplicate(shop, expect_refund=True)
    # Celery's key-value backends keep a SUCCESS they hold; a database backend would not.
    # The errback runs either way: a refund of a paid order.
    assert errbacks == ["refund"]


# --- retries --------------------------------------------------------------------------


def _duplicate_then_an_unknown_outcome_past_max_retries(
    shop: PaymentShop, *, continues: bool
) -> str:
    """The package's own retries are spent (a message that already went through its
    budget): the delivery holds the lease while a duplicate is deferred (its wake set);
    the charge's answer is lost; no retry goes out. No sweep runs here: only a published
    message can continue the execution."""
    charge = shop.call()
    go = threading.Event()

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        assert go.wait(20)
        return self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)

    shop.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    spent = {OWN_RETRIES_HEADER: PACKAGE_RETRY_BUDGET}
    with shop.worker(concurrency=2):
        task_id = str(pay.apply_async(("o-7",), headers=spent).id)
        wait_until(
            lambda: shop.execution(task_id).state.value == "RUNNING",
            10,
            message="the first delivery",
        )
        pay.apply_async(("o-7",), task_id=task_id)
        wait_until(
            lambda: shop.execution(task_id).wake_requested,
            10,
            message="the duplicate to be deferred",
        )
        go.set()
        if continues:
            shop.wait_state(task_id, "COMPLETED")
        else:
            shop.wait_state(task_id, "WAITING")
            assert_stays(lambda: shop.execution(task_id).state.value == "WAITING", 3.0)
    return task_id


def test_a_retry_that_does_not_go_out_leaves_the_wake_to_publish_the_continuation(
    shop: PaymentShop,
) -> None:
    task_id = _duplicate_then_an_unknown_outcome_past_max_retries(shop, continues=True)
    assert shop.execution(task_id).state.value == "COMPLETED"
    assert len(shop.gateway.requests) == 1 and shop.gateway.lookups, "reconciled, not resent"


def test_folding_the_wake_into_a_retry_that_does_not_go_out_loses_the_continuation(
    shop: PaymentShop,
) -> None:
    with sabotage(WAKE_FOLDED_INTO_REFUSED_RETRY):
        task_id = _duplicate_then_an_unknown_outcome_past_max_retries(shop, continues=False)
    assert shop.execution(task_id).state.value == "WAITING", "charged, and nothing continues"
    assert len(shop.gateway.payments) == 1


def _retry_after_the_message_expired(shop: PaymentShop, *, runs: bool) -> str:
    """Published with ``expires`` a second ahead; the body charges, then retries in 1.5 s
    (after the message's ``expires``)."""
    charge = shop.call()

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        receipt = self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)
        if self.request.retries == 0:
            raise self.retry(countdown=1.5)  # e.g. wait for the warehouse
        return receipt

    expires = datetime.now(timezone.utc) + timedelta(seconds=1)
    with shop.worker():
        task_id = str(pay.apply_async(("o-8",), expires=expires).id)
        if runs:
            shop.wait_state(task_id, "COMPLETED", timeout=10)
        else:  # the dropped retry changes nothing: a window to see it
            assert_stays(lambda: shop.execution(task_id).state.value != "COMPLETED", 4.0)
    return task_id


def test_a_retry_of_a_started_execution_runs_past_the_messages_expires(
    shop: PaymentShop,
) -> None:
    task_id = _retry_after_the_message_expired(shop, runs=True)
    assert shop.execution(task_id).state.value == "COMPLETED"
    assert len(shop.gateway.payments) == 1


def test_a_retry_carrying_expires_still_runs_once_the_store_judges_it(
    shop: PaymentShop,
) -> None:
    """The second protection alone: the retry keeps ``expires``, and the worker asks the
    store, which says the execution started."""
    with sabotage(RETRY_KEEPS_EXPIRES):
        task_id = _retry_after_the_message_expired(shop, runs=True)
    assert shop.execution(task_id).state.value == "COMPLETED"
    assert len(shop.gateway.payments) == 1


def test_a_retry_carrying_expires_is_dropped_with_the_customer_charged(
    shop: PaymentShop,
) -> None:
    """The twin of both: the retry keeps ``expires`` and Celery's check alone drops it."""
    with sabotage(RETRY_KEEPS_EXPIRES, EXPIRY_REVOKES_THE_ID):
        task_id = _retry_after_the_message_expired(shop, runs=False)
    assert shop.execution(task_id).state.value == "WAITING"
    assert len(shop.gateway.payments) == 1


# --- the outcome a recovered execution ends with --------------------------------------------


def test_a_recovered_execution_ends_reconciled_whichever_delivery_finishes_it(
    shop: PaymentShop, caplog: pytest.LogCaptureFixture
) -> None:
    """The outcome is read from the execution's record (its recovery count), not from
    whether the delivery that finishes it took over: a take-over's own retry, or the
    delivery of a message the sweep re-published, finishes a recovery too. Flower's
    ``SUCCESS · RECONCILED`` (docs/operators.md) rests on this."""
    caplog.set_level(logging.INFO, logger="celery_agboss")
    charge = shop.call()

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        return self.outbound(charge, {"amount": 1000, "order": order})

    task_id = str(pay.delay("o-recovered").id)  # no worker yet: the message looks lost
    shop.clock.advance(3600)
    assert shop.sweep().republished == 1
    assert shop.execution(task_id).recovery_count == 1
    with shop.worker():
        shop.wait_state(task_id, "COMPLETED")
    completed = [
        vars(r) for r in caplog.records if getattr(r, "event", None) == EXECUTION_COMPLETED
    ]
    assert [c["outcome"] for c in completed] == ["RECONCILED"]
    assert len(shop.gateway.payments) == 1
