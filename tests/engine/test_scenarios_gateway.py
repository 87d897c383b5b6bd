"""The gateway's side (design: PS17, PS18, PS19, PS20), engine side: keys that outlive the
gateway's, one key per capture, per refund, per disposition."""

from __future__ import annotations

from typing import Any

import pytest

from celery_agboss.core import protections, sabotage
from celery_agboss.core.outbound import CallContext, OutboundCall, Outcome
from celery_agboss.errors import IdempotencyKeyConflictError
from tests.engine.app_tables import create_app_tables, next_capture_number
from tests.engine.helpers import DAY, Shop, reconcile_by_lookup

# --- the idempotency key expires before a retry (design: PS17) ---------------------------------


def test_ps17_a_completed_intent_replays_days_later_without_reaching_the_gateway(
    shop: Shop,
) -> None:
    charge = shop.charge_call()
    with shop.start("task-1") as first:
        receipt = first.outbound(charge, {"amount": 5000})
    shop.clock.advance(3 * DAY)
    shop.gateway.forget_keys()  # the gateway's retention passed
    with shop.start("task-1") as later:
        assert later.outbound(charge, {"amount": 5000}) == receipt
        assert later.last_outcome is Outcome.REPLAYED
    assert len(shop.gateway.requests) == 1


def test_ps17_twin_relying_on_the_gateway_s_key_alone_pays_twice_after_its_retention(
    shop: Shop,
) -> None:
    shop.gateway.charge(5000, "order-17")
    shop.clock.advance(3 * DAY)
    shop.gateway.charge(5000, "order-17")
    assert len(shop.gateway.payments) == 2


# --- a partial capture (design: PS18) --------------------------------------------------------


def _capture_call(shop: Shop, name: str = "fake.capture") -> OutboundCall:
    def send(call: CallContext) -> Any:
        request = call.request
        return shop.gateway.capture(
            request["authorization"], call.idempotency_key, amount=request["amount"]
        )

    return OutboundCall(
        name=name, send=send, reconcile=reconcile_by_lookup(shop.gateway), key_retention=DAY
    )


def _ship(
    shop: Shop,
    capture: OutboundCall,
    execution: str,
    authorization: str,
    amount: int,
    *,
    by_business_key: bool = True,
) -> Any:
    with shop.start(execution) as ctx:
        n = ctx.fenced_effect(
            "capture-number",
            lambda conn: next_capture_number(conn, authorization),
            business_key=f"shipment:{authorization}:1",
        )
        key = f"capture:{authorization}:{n}" if by_business_key else None
        return ctx.outbound(
            capture, {"authorization": authorization, "amount": amount}, business_key=key
        )


def test_ps18_a_capture_keyed_by_authorization_and_number_is_captured_once(shop: Shop) -> None:
    create_app_tables(shop.store.engine)
    authorization = shop.gateway.charge(1000, "auth-18", capture=False)["id"]
    capture = _capture_call(shop)
    first = _ship(shop, capture, "ship-1", authorization, 600)
    again = _ship(shop, capture, "ship-1-again", authorization, 600)  # the same shipment
    assert again == first
    captures = [r for r in shop.gateway.requests if r.operation == "capture"]
    assert len(captures) == 1
    assert shop.gateway.retrieve(authorization)["amount_captured"] == 600
    with pytest.raises(IdempotencyKeyConflictError):
        _ship(shop, capture, "ship-1-bad", authorization, 900)  # another amount, same capture
    assert len([r for r in shop.gateway.requests if r.operation == "capture"]) == 1


def test_ps18_twin_step_keyed_captures_send_a_second_capture(shop: Shop) -> None:
    create_app_tables(shop.store.engine)
    authorization = shop.gateway.charge(1000, "auth-18", capture=False)["id"]
    capture = _capture_call(shop)
    _ship(shop, capture, "ship-1", authorization, 600, by_business_key=False)
    with pytest.raises(BaseException):  # noqa: B017 - the gateway refuses; what counts is the send
        _ship(shop, capture, "ship-1-again", authorization, 600, by_business_key=False)
    assert len([r for r in shop.gateway.requests if r.operation == "capture"]) == 2


# --- a refund retried (design: PS19) ---------------------------------------------------------


def _refund_call(shop: Shop) -> OutboundCall:
    def send(call: CallContext) -> Any:
        return shop.gateway.refund(
            call.request["payment"], call.idempotency_key, amount=call.request["amount"]
        )

    return OutboundCall(
        name="fake.refund",
        send=send,
        reconcile=reconcile_by_lookup(shop.gateway),
        key_retention=DAY,
    )


def _refund_from_every_path(shop: Shop, keyed: bool) -> None:
    payment = shop.gateway.charge(1000, "pay-19")["id"]
    refund = _refund_call(shop)
    for path in ("saga-undo", "operator", "customer"):
        with shop.start(f"{path}-refund") as ctx:
            ctx.outbound(
                refund,
                {"payment": payment, "amount": 300},
                business_key=f"refund:{payment}:1" if keyed else None,
            )


def test_ps19_every_path_refunding_under_one_key_refunds_once(shop: Shop) -> None:
    _refund_from_every_path(shop, keyed=True)
    assert len(shop.gateway.refunds) == 1


def test_ps19_twin_each_path_with_its_own_key_refunds_three_times(shop: Shop) -> None:
    _refund_from_every_path(shop, keyed=False)
    assert len(shop.gateway.refunds) == 3


# --- a void and a capture race on one authorization (design: PS20) -------------------------------


def _disposition_call(shop: Shop) -> OutboundCall:
    def send(call: CallContext) -> Any:
        request = call.request
        if request["action"] == "capture":
            return shop.gateway.capture(request["authorization"], call.idempotency_key)
        return shop.gateway.void(request["authorization"], call.idempotency_key)

    return OutboundCall(
        name="fake.disposition",
        send=send,
        reconcile=reconcile_by_lookup(shop.gateway),
        key_retention=DAY,
    )


def _capture_then_cancel(shop: Shop) -> tuple[str, Any]:
    authorization = shop.gateway.charge(1000, "auth-20", capture=False)["id"]
    disposition = _disposition_call(shop)
    key = f"disposition:{authorization}"
    with shop.start("fulfilment") as fulfil:
        fulfil.outbound(
            disposition, {"action": "capture", "authorization": authorization}, business_key=key
        )
    with shop.start("cancellation") as cancel:
        try:
            voided = cancel.outbound(
                disposition, {"action": "void", "authorization": authorization}, business_key=key
            )
        except IdempotencyKeyConflictError:  # captured already: take the refund route
            refund = _refund_call(shop)
            return "refunded", cancel.outbound(
                refund,
                {"payment": authorization, "amount": 1000},
                business_key=f"refund:{authorization}:1",
            )
    return "voided", voided


def test_ps20_a_void_after_a_capture_is_refused_and_the_refund_route_taken(shop: Shop) -> None:
    route, _ = _capture_then_cancel(shop)
    assert route == "refunded"
    assert [r.operation for r in shop.gateway.requests] == ["charge", "capture", "refund"]
    assert len(shop.gateway.refunds) == 1


def test_ps20_twin_without_the_fingerprint_the_cancelled_order_stays_charged(shop: Shop) -> None:
    with sabotage.switched_off(protections.FINGERPRINT_NOT_CHECKED):
        route, receipt = _capture_then_cancel(shop)
    # The shop believes it voided; the gateway captured and nothing refunds the customer.
    assert route == "voided" and receipt["status"] == "succeeded"
    assert shop.gateway.refunds == []
