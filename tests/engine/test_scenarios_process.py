"""Failures of the process (design: PS1, PS2, PS5, PS6, PS14), engine side.

Each scenario ends with the number of payments at the fake gateway; each protected
run has a twin that shows the harm without the protection.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from celery_agboss.core import protections, sabotage
from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.outbound import OutboundCall, Outcome
from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.errors import (
    ExecutionFencedError,
    OutboundCallOutcomeUnknownError,
    OutboundCallUnreconciledError,
    StoreUnavailableError,
)
from celery_agboss.testing.fault_arming import (
    FENCED_AFTER_COMMIT,
    FENCED_BEFORE_COMMIT,
    OUTBOUND_AFTER_SEND,
    OUTBOUND_BEFORE_SEND,
    OUTBOUND_BEFORE_SETTLE,
    arm_fault,
    arm_raise,
)
from celery_agboss.testing.gateway import FakeGatewayFault, GatewayCapabilities
from tests.engine.app_tables import create_app_tables, notes, write_note
from tests.engine.helpers import DAY, Background, Crash, Shop, retry_asked, step_intent_key

# --- a retry after a timeout (design: PS1) --------------------------------------------------


def test_ps1_an_answer_lost_to_an_sdk_timeout_is_reconciled_on_the_retry(shop: Shop) -> None:
    charge = shop.charge_call()
    shop.lose_the_answer("task-1", charge, {"amount": 1000})
    receipt = shop.reconciled("task-1", charge, {"amount": 1000})
    assert [p["id"] for p in shop.gateway.payments] == [receipt["id"]]


def test_ps1_a_send_that_overran_its_timeout_is_reconciled_on_the_retry(
    shop: Shop, settings: EngineSettings
) -> None:
    fast = dataclasses.replace(settings, attempt_timeout_ms=300)
    charge = shop.charge_call()
    hold = shop.gateway.hold()  # processed; the answer comes too late
    first = shop.start("task-1", settings=fast)
    with pytest.raises(OutboundCallOutcomeUnknownError):
        first.outbound(charge, {"amount": 1000})
    hold.release()
    shop.expire_leases()  # the overrunning holder never releases: its lease expires
    with shop.start("task-1", settings=fast) as retry:
        retry.outbound(charge, {"amount": 1000})
        assert retry.last_outcome is Outcome.RECONCILED
    assert len(shop.gateway.payments) == 1


def test_ps1_twin_a_timeout_taken_for_a_failure_pays_twice_once_the_key_expired(
    shop: Shop,
) -> None:
    charge = shop.charge_call()
    shop.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    with sabotage.switched_off(protections.UNKNOWN_ERRORS_ARE_DEFINITE):
        with shop.start("task-1") as first:
            with pytest.raises(Exception):  # noqa: B017
                first.outbound(charge, {"amount": 1000})
            retry_asked(first)  # the body's autoretry_for=(Exception,)
        shop.clock.advance(2 * DAY)  # the retry comes after the gateway's retention
        with shop.start("task-1") as retry:
            retry.outbound(charge, {"amount": 1000})
    assert len(shop.gateway.payments) == 2


# --- a crash after the charge, before the checkpoint (design: PS2) ----------------------------


def _charge_then_mark_paid(ctx: Any, charge: OutboundCall, crash_before_mark: bool) -> Any:
    receipt = ctx.outbound(charge, {"amount": 1500}, business_key="order:2")
    if crash_before_mark:
        raise Crash()
    ctx.fenced_effect(
        "mark-paid", lambda c: write_note(c, f"paid {receipt['id']}"), business_key="order:2"
    )
    return receipt


def test_ps2_a_crash_after_the_charge_replays_the_receipt_and_marks_paid_once(shop: Shop) -> None:
    create_app_tables(shop.store.engine)
    charge = shop.charge_call()
    crashed = shop.start("task-1")
    with pytest.raises(Crash):
        _charge_then_mark_paid(crashed, charge, crash_before_mark=True)
    shop.expire_leases()
    with shop.start("task-1") as second:
        receipt = _charge_then_mark_paid(second, charge, crash_before_mark=False)
        assert second.last_outcome is Outcome.REPLAYED
    with shop.start("task-1") as third:
        _charge_then_mark_paid(third, charge, crash_before_mark=False)
    assert len(shop.gateway.requests) == 1
    assert notes(shop.store.engine) == [f"paid {receipt['id']}"]


def test_ps2_twin_a_plain_call_in_the_step_charges_again_after_the_crash(shop: Shop) -> None:
    def body(crash: bool) -> None:
        shop.gateway.charge(1500, None)  # outside any outbound call
        if crash:
            raise Crash()

    with pytest.raises(Crash):
        body(crash=True)
    body(crash=False)
    assert len(shop.gateway.payments) == 2


# --- a crash after the send, before the answer (design: PS5) --------------------------------


def _crash_at(shop: Shop, point: str, charge: OutboundCall) -> None:
    crashed = shop.start("task-1")
    arm_raise(point, Crash, only={"holder": crashed.lease_ref.holder})
    with pytest.raises(Crash):
        crashed.outbound(charge, {"amount": 800})
    shop.expire_leases()


def test_ps5_completed_the_payment_exists_and_nothing_is_sent(shop: Shop) -> None:
    charge = shop.charge_call()
    _crash_at(shop, OUTBOUND_AFTER_SEND, charge)
    receipt = shop.reconciled("task-1", charge, {"amount": 800})
    assert [p["id"] for p in shop.gateway.payments] == [receipt["id"]]
    assert len(shop.gateway.requests) == 1


def test_ps5_not_sent_it_is_sent_once_more_under_the_same_key(shop: Shop) -> None:
    charge = shop.charge_call()
    _crash_at(shop, OUTBOUND_BEFORE_SEND, charge)
    assert shop.gateway.requests == []
    with shop.start("task-1") as next_holder:
        next_holder.outbound(charge, {"amount": 800})
        assert next_holder.last_outcome is Outcome.SENT
    key = step_intent_key(shop.settings, "task-1", "fake.charge")
    assert [r.idempotency_key for r in shop.gateway.requests] == [key]
    record = shop.store.read_intent(key)
    assert record is not None and record.attempt == 2


def test_ps5_unknown_nothing_is_sent_and_the_intent_waits_for_an_operator(shop: Shop) -> None:
    charge = shop.charge_call(reconcile="unknown")
    _crash_at(shop, OUTBOUND_AFTER_SEND, charge)
    with shop.start("task-1") as next_holder, pytest.raises(OutboundCallUnreconciledError):
        next_holder.outbound(charge, {"amount": 800})
    record = shop.store.read_intent(step_intent_key(shop.settings, "task-1", "fake.charge"))
    assert record is not None
    assert record.status is IntentStatus.PENDING and record.needs_operator
    assert len(shop.gateway.requests) == 1


def test_ps5_twin_a_pending_intent_resent_without_reconcile_pays_twice(shop: Shop) -> None:
    shop.gateway.idempotency_keys = False
    charge = shop.charge_call()
    _crash_at(shop, OUTBOUND_AFTER_SEND, charge)
    with (
        sabotage.switched_off(protections.PENDING_RESENT_WITHOUT_RECONCILE),
        shop.start("task-1") as next_holder,
    ):
        next_holder.outbound(charge, {"amount": 800})
    assert len(shop.gateway.payments) == 2


# --- support levels (design: PS6) --------------------------------------------------------------

LEVELS = {
    "full": (GatewayCapabilities.FULL, "lookup"),
    "no-lookup": (GatewayCapabilities.NO_LOOKUP, "replay"),
    "no-keys": (GatewayCapabilities.NO_KEYS, "replay"),
}


def _ps6_timeout(shop: Shop, charge: OutboundCall) -> BaseException | None:
    shop.lose_the_answer("task-1", charge, {"amount": 700})
    second = shop.start("task-1")
    return Background(lambda: second.outbound(charge, {"amount": 700})).outcome()[1]


def _ps6_crash_before_answer(shop: Shop, charge: OutboundCall) -> BaseException | None:
    _crash_at(shop, OUTBOUND_AFTER_SEND, charge)
    second = shop.start("task-1")
    return Background(lambda: second.outbound(charge, {"amount": 800})).outcome()[1]


def _ps6_late_replay(shop: Shop, charge: OutboundCall) -> BaseException | None:
    shop.lose_the_answer("task-1", charge, {"amount": 900})
    shop.clock.advance(3 * DAY)
    second = shop.start("task-1")
    return Background(lambda: second.outbound(charge, {"amount": 900})).outcome()[1]


SCENARIOS = {"timeout": _ps6_timeout, "crash": _ps6_crash_before_answer, "late": _ps6_late_replay}

# (level, scenario) -> (reconcile override, payments, error): PS6's table (design: PS6).
# No keys: reconcile can only guess NotSent (no lookup); a resend is a new charge, and
# a crash before the answer can only be Unknown for a person. Such gateways are not
# supported (design: G1, G2).
PS6_TABLE = {
    ("full", "timeout"): (None, 1, None),
    ("full", "crash"): (None, 1, None),
    ("full", "late"): (None, 1, None),
    ("no-lookup", "timeout"): (None, 1, None),
    ("no-lookup", "crash"): (None, 1, None),
    ("no-lookup", "late"): (None, 1, OutboundCallUnreconciledError),
    ("no-keys", "timeout"): (None, 2, None),
    ("no-keys", "crash"): ("unknown", 1, OutboundCallUnreconciledError),
    ("no-keys", "late"): ("absence", 2, None),
}


@pytest.mark.parametrize(("level", "scenario"), list(PS6_TABLE))
def test_ps6_each_support_level_charges_as_the_table_says(
    shop: Shop, level: str, scenario: str
) -> None:
    capabilities, reconcile = LEVELS[level]
    override, payments, error_type = PS6_TABLE[(level, scenario)]
    shop.gateway.capabilities = capabilities
    if override == "unknown":
        charge = shop.charge_call(reconcile="unknown")
    elif override == "absence":  # an adapter that claims its guess proves absence
        charge = shop.charge_call(
            reconcile="replay", key_retention=None, lookup_proves_absence=True
        )
    else:
        charge = shop.charge_call(reconcile=reconcile)
    error = SCENARIOS[scenario](shop, charge)
    assert len(shop.gateway.payments) == payments
    if error_type is None:
        assert error is None
    else:
        assert isinstance(error, error_type)


# --- the database lost mid-commit (design: PS14) -----------------------------------------------


def _cut_the_settle(point: str) -> None:
    """Arm ``point`` of the store's fenced transaction for the settle only."""

    def arm(context: Any) -> None:
        arm_raise(
            point,
            StoreUnavailableError("connection lost during COMMIT"),
            only={"holder": context["holder"]},
        )

    arm_fault(OUTBOUND_BEFORE_SETTLE, arm)


@pytest.mark.parametrize("point", [FENCED_BEFORE_COMMIT, FENCED_AFTER_COMMIT])
def test_ps14_a_store_error_at_settle_is_an_unknown_outcome_the_next_attempt_resolves(
    shop: Shop, point: str
) -> None:
    charge = shop.charge_call()
    _cut_the_settle(point)
    shop.unknown("task-1", charge, {"amount": 650})
    record = shop.store.read_intent(step_intent_key(shop.settings, "task-1", "fake.charge"))
    assert record is not None
    expected = IntentStatus.PENDING if point == FENCED_BEFORE_COMMIT else IntentStatus.COMPLETED
    assert record.status is expected
    with shop.start("task-1") as second:
        second.outbound(charge, {"amount": 650})
        assert second.last_outcome in (Outcome.RECONCILED, Outcome.REPLAYED)
    assert len(shop.gateway.payments) == 1
    assert len(shop.gateway.requests) == 1


def test_ps14_twin_a_store_error_taken_for_a_failure_pays_twice(shop: Shop) -> None:
    shop.gateway.idempotency_keys = False
    charge = shop.charge_call()
    _cut_the_settle(FENCED_BEFORE_COMMIT)
    shop.unknown("task-1", charge, {"amount": 650})
    with (
        sabotage.switched_off(protections.PENDING_RESENT_WITHOUT_RECONCILE),
        shop.start("task-1") as second,
    ):
        second.outbound(charge, {"amount": 650})
    assert len(shop.gateway.payments) == 2


# --- a zombie after a take-over (design: PS3) ------------------------------------------------


def _zombie_wakes_after_take_over(shop: Shop) -> tuple[BaseException | None, Any]:
    from celery_agboss.testing.clock import SkewedHolderClock
    from celery_agboss.testing.fault_arming import arm_pause

    shop.gateway.idempotency_keys = False  # a second send is a second payment
    charge = shop.charge_call()
    frozen_pod = SkewedHolderClock()
    zombie = shop.start("task-1", clock=frozen_pod)
    paused = arm_pause(OUTBOUND_BEFORE_SEND, only={"holder": zombie.lease_ref.holder})
    sending = Background(lambda: zombie.outbound(charge, {"amount": 1100}))
    paused.wait_reached()  # claimed; frozen just before the send (a GC pause, SIGSTOP)
    shop.expire_leases()
    frozen_pod.advance(shop.settings.lease_ttl_ms / 1000 + 1)  # both its clocks saw the pause
    with shop.start("task-1") as successor:
        receipt = successor.outbound(charge, {"amount": 1100})
    paused.release()
    return sending.outcome()[1], receipt


def test_ps3_a_zombie_past_its_lease_sends_nothing(shop: Shop) -> None:
    error, receipt = _zombie_wakes_after_take_over(shop)
    assert isinstance(error, ExecutionFencedError)
    assert [p["id"] for p in shop.gateway.payments] == [receipt["id"]]


def test_ps3_twin_a_send_without_the_lease_check_charges_twice(shop: Shop) -> None:
    with sabotage.switched_off(protections.SEND_WITHOUT_LEASE_CHECK):
        _zombie_wakes_after_take_over(shop)
    assert len(shop.gateway.payments) == 2
