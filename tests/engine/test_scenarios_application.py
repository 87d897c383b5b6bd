"""Duplicates the application makes (design: PS7, PS8, PS9, PS22, PS23), engine side: one business
key, one charge; another request under it, a conflict and nothing sent."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.exc import IntegrityError

from celery_agboss.core import protections, sabotage
from celery_agboss.core.outbound import OutboundCall, Outcome
from celery_agboss.errors import (
    IdempotencyKeyConflictError,
    OutboundCallInFlightError,
)
from celery_agboss.testing.fault_arming import (
    OUTBOUND_BEFORE_SEND,
    RECONCILE_AFTER_LOOKUP,
    arm_pause,
    arm_raise,
)
from celery_agboss.testing.gateway import FakeGatewayError, FakeGatewayFault
from tests.engine.app_tables import (
    accounts,
    balance,
    create_app_tables,
    debit,
    loose_accounts,
    open_account,
)
from tests.engine.helpers import Background, Crash, Shop, business_intent_key, wait_for_hits

# --- the model calls the charge tool twice (design: PS7) ----------------------------------------


def test_ps7_a_second_tool_call_for_the_same_order_replays_the_first_receipt(shop: Shop) -> None:
    charge = shop.charge_call()
    with shop.start("agent-run") as ctx:
        first = ctx.outbound(charge, {"amount": 2500}, business_key="order:7")
        second = ctx.outbound(charge, {"amount": 2500}, business_key="order:7")
        assert ctx.last_outcome is Outcome.REPLAYED
    assert first == second
    assert len(shop.gateway.requests) == 1


def test_ps7_twin_step_keyed_tool_calls_charge_twice(shop: Shop) -> None:
    charge = shop.charge_call()
    with shop.start("agent-run") as ctx:
        ctx.outbound(charge, {"amount": 2500})
        ctx.outbound(charge, {"amount": 2500})
    assert len(shop.gateway.payments) == 2


def test_ps7_the_same_order_with_another_amount_is_refused_and_nothing_sent(shop: Shop) -> None:
    charge = shop.charge_call()
    with shop.start("agent-run") as ctx:
        ctx.outbound(charge, {"amount": 2500}, business_key="order:7")
        with pytest.raises(IdempotencyKeyConflictError):
            ctx.outbound(charge, {"amount": 9900}, business_key="order:7")
    assert [p["amount"] for p in shop.gateway.payments] == [2500]
    assert len(shop.gateway.requests) == 1


def test_ps7_twin_without_the_fingerprint_another_amount_gets_the_first_receipt(
    shop: Shop,
) -> None:
    charge = shop.charge_call()
    with shop.start("agent-run") as ctx:
        ctx.outbound(charge, {"amount": 2500}, business_key="order:7")
        with sabotage.switched_off(protections.FINGERPRINT_NOT_CHECKED):
            receipt = ctx.outbound(charge, {"amount": 9900}, business_key="order:7")
    # The application believes 9900 was charged; the gateway charged 2500.
    assert receipt["amount"] == 2500
    assert [p["amount"] for p in shop.gateway.payments] == [2500]


# --- two executions for one order (design: PS8) ----------------------------------------------


def test_ps8_the_second_execution_replays_the_first_one_s_receipt(shop: Shop) -> None:
    charge = shop.charge_call()
    with shop.start("click-1") as one:
        receipt = one.outbound(charge, {"amount": 4000}, business_key="order:8")
    with shop.start("click-2") as two:
        assert two.outbound(charge, {"amount": 4000}, business_key="order:8") == receipt
        assert two.last_outcome is Outcome.REPLAYED
    assert len(shop.gateway.requests) == 1


def test_ps8_a_pending_intent_under_a_live_lease_elsewhere_is_in_flight(shop: Shop) -> None:
    charge = shop.charge_call()
    elsewhere = shop.start("click-1")  # claimed, then stuck before its send: lease still live
    arm_raise(OUTBOUND_BEFORE_SEND, Crash, only={"holder": elsewhere.lease_ref.holder})
    with pytest.raises(Crash):
        elsewhere.outbound(charge, {"amount": 4000}, business_key="order:8")
    with shop.start("click-2") as two, pytest.raises(OutboundCallInFlightError):
        two.outbound(charge, {"amount": 4000}, business_key="order:8")
    assert shop.gateway.requests == []


def _two_executions_find_a_dead_pending_intent(
    shop: Shop, reconcilers: int, *, gateway_keys: bool = False
) -> list[Any]:
    shop.gateway.idempotency_keys = gateway_keys
    charge = shop.charge_call()
    dead = shop.start("click-1")
    arm_raise(OUTBOUND_BEFORE_SEND, Crash, only={"holder": dead.lease_ref.holder})
    with pytest.raises(Crash):
        dead.outbound(charge, {"amount": 4000}, business_key="order:8")
    shop.expire_leases()
    looked_up = arm_pause(RECONCILE_AFTER_LOOKUP, times=2)

    def taken_and_looked_up() -> None:
        wait_for_hits(looked_up, reconcilers)  # whoever took it looked it up: not there yet
        looked_up.release()

    # Both read the dead PENDING intent; neither has written.
    return shop.race_past_the_read(
        ("click-2", "click-3"), charge, {"amount": 4000}, "order:8", then=taken_and_looked_up
    )


def test_ps8_of_two_executions_finding_a_dead_pending_intent_only_one_sends(shop: Shop) -> None:
    outcomes = _two_executions_find_a_dead_pending_intent(shop, reconcilers=1)
    assert any(error is None for _, error in outcomes)
    assert len(shop.gateway.payments) == 1


def test_ps8_twin_both_take_the_dead_intent_and_both_send(shop: Shop) -> None:
    with sabotage.switched_off(protections.INTENT_CAS_WITHOUT_PREDICATE):
        _two_executions_find_a_dead_pending_intent(shop, reconcilers=2)
    assert len(shop.gateway.payments) == 2


# --- parallel branches charging one aggregate (design: PS9) -------------------------------------


def test_ps9_two_branches_charging_one_business_key_make_one_charge(shop: Shop) -> None:
    charge = shop.charge_call()
    hold = shop.gateway.hold()
    branches = [shop.start(f"branch-{n}") for n in (1, 2)]
    first = Background(
        lambda: branches[0].outbound(charge, {"amount": 300}, business_key="customer:9:deposit")
    )
    hold.wait_reached()
    second = Background(
        lambda: branches[1].outbound(charge, {"amount": 300}, business_key="customer:9:deposit")
    )
    hold.release()
    assert first.join() == second.join()
    assert branches[1].last_outcome in (Outcome.JOINED, Outcome.REPLAYED)
    assert len(shop.gateway.payments) == 1


def _draw_twice(shop: Shop, table: Any) -> list[BaseException | None]:
    engine = shop.store.engine
    create_app_tables(engine)
    open_account(engine, table, 1, 1500)
    errors: list[BaseException | None] = []
    for n in (1, 2):  # two distinct charges against one balance
        with shop.start(f"branch-{n}") as ctx:
            try:
                ctx.fenced_effect(
                    "draw", lambda c: debit(c, table, 1, 1000), business_key=f"draw:{n}"
                )
                errors.append(None)
            except IntegrityError as exc:
                errors.append(exc)
    return errors


def test_ps9_the_balance_constraint_refuses_the_charge_that_would_overdraw(shop: Shop) -> None:
    errors = _draw_twice(shop, accounts)
    assert errors[0] is None and isinstance(errors[1], IntegrityError)
    assert balance(shop.store.engine, accounts, 1) == 500
    with shop.start("branch-1") as again:  # the first draw replays, never debits twice
        assert again.fenced_effect(
            "draw", lambda c: debit(c, accounts, 1, 1000), business_key="draw:1"
        ) == {"debited": 1000}
    assert balance(shop.store.engine, accounts, 1) == 500


def test_ps9_twin_without_the_application_s_constraint_the_balance_is_overdrawn(
    shop: Shop,
) -> None:
    errors = _draw_twice(shop, loose_accounts)
    assert errors == [None, None]
    assert balance(shop.store.engine, loose_accounts, 1) == -500


# --- another card after a decline (design: PS22) ---------------------------------------------


def test_ps22_another_card_under_the_same_order_key_is_refused_after_a_decline(
    shop: Shop,
) -> None:
    charge = shop.charge_call()
    shop.gateway.inject_fault(FakeGatewayFault.DECLINE)
    with shop.start("try-1") as first, pytest.raises(FakeGatewayError):
        first.outbound(charge, {"amount": 3000, "card": "tok_1"}, business_key="order:22")
    with shop.start("try-2") as second, pytest.raises(IdempotencyKeyConflictError):
        second.outbound(charge, {"amount": 3000, "card": "tok_2"}, business_key="order:22")
    assert shop.gateway.payments == []
    assert len(shop.gateway.requests) == 1


def _unknown_then_another_card(shop: Shop, key_for_try: Any) -> BaseException | None:
    charge = shop.charge_call()
    charged = {"amount": 3000, "card": "tok_1"}
    shop.lose_the_answer("try-1", charge, charged, business_key=key_for_try(1))
    second = shop.start("try-2")
    return Background(
        lambda: second.outbound(
            charge, {"amount": 3000, "card": "tok_2"}, business_key=key_for_try(2)
        )
    ).outcome()[1]


def test_ps22_a_try_after_an_unknown_outcome_finds_the_first_charge_and_sends_nothing(
    shop: Shop,
) -> None:
    error = _unknown_then_another_card(shop, lambda n: "order:22")
    assert isinstance(error, IdempotencyKeyConflictError)  # reconciled first: it was charged
    assert len(shop.gateway.payments) == 1
    record = shop.store.read_intent(business_intent_key(shop.settings, "order:22", "fake.charge"))
    assert record is not None and record.status.value == "COMPLETED"


def test_ps22_twin_a_new_business_key_for_every_try_charges_twice(shop: Shop) -> None:
    error = _unknown_then_another_card(shop, lambda n: f"order:22:try:{n}")
    assert error is None
    assert len(shop.gateway.payments) == 2


# --- two requests under one key at once (design: PS23) -------------------------------------------


def _insert_race(shop: Shop, charge: OutboundCall) -> list[Any]:
    # Both found no intent; neither has inserted.
    return shop.race_past_the_read(("req-1", "req-2"), charge, {"amount": 100}, "order:23")


def test_ps23_two_claims_racing_to_insert_one_key_send_one_request(shop: Shop) -> None:
    shop.gateway.idempotency_keys = False
    outcomes = _insert_race(shop, shop.charge_call())
    assert any(error is None for _, error in outcomes)
    assert len(shop.gateway.requests) == 1
    assert len(shop.gateway.payments) == 1


def test_ps23_two_holders_of_one_stranded_attempt_never_send_it_at_once(shop: Shop) -> None:
    _two_executions_find_a_dead_pending_intent(shop, reconcilers=1, gateway_keys=True)
    key = business_intent_key(shop.settings, "order:8", "fake.charge")
    assert len(shop.gateway.requests_for(key)) == 1


def test_ps23_twin_without_the_cas_one_key_reaches_the_gateway_twice(shop: Shop) -> None:
    with sabotage.switched_off(protections.INTENT_CAS_WITHOUT_PREDICATE):
        _two_executions_find_a_dead_pending_intent(shop, reconcilers=2, gateway_keys=True)
    key = business_intent_key(shop.settings, "order:8", "fake.charge")
    # Only the gateway's own deduplication (design: G1, A6) stands between these and two charges.
    assert len(shop.gateway.requests_for(key)) == 2
