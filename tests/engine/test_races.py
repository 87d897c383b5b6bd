"""The races (design: races), each forced on purpose with fault points so
that both parties read before either writes, each with the twin that shows its harm at
the fake gateway.

R17 (masking), R19 (renewals never revive), R21 (escaped keys) live with their owners'
suites: tests/unit/test_masking.py, tests/contract/test_late_renewal.py,
tests/unit/test_keys.py. R16 within one delivery: threads calling one business key take turns (twin
``calls-of-one-key-concurrent``: the second reads the first's fresh claim as its own
earlier attempt and sends again). The Celery-side halves of R18, R22 and R23 (a revoke, a warm
shutdown, a worker's renewer) are the Celery layer's integration tests.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import datetime, timezone
from typing import Any

import pytest

from celery_agboss.core import protections, sabotage
from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.outbound import Outcome
from celery_agboss.core.store_protocol import IntentGuard, IntentStatus, IntentUpdate
from celery_agboss.errors import (
    ExecutionFencedError,
    IdempotencyKeyConflictError,
    LeaseNotHeldError,
    OutboundCallInFlightError,
    OutboundCallOutcomeUnknownError,
    OutboundCallResultNotStoredError,
    OutboundCallUnreconciledError,
)
from celery_agboss.testing.fault_arming import OUTBOUND_AFTER_READ, OUTBOUND_AFTER_SEND, arm_pause
from celery_agboss.testing.gateway import FakeGatewayError, FakeGatewayFault, FakeGatewayTimeout
from tests.engine.helpers import (
    DAY,
    Background,
    Shop,
    business_intent_key,
    retry_asked,
    step_intent_key,
    wait_until,
)
from tests.support.processes import assert_stays


@pytest.fixture
def fast(settings: EngineSettings) -> EngineSettings:
    """The test's settings with a 300 ms attempt timeout (the same call registry)."""
    return dataclasses.replace(settings, attempt_timeout_ms=300)


def _events(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [getattr(record, "event", "") for record in caplog.records]


# --- two executions both read a FAILED intent; only the CAS winner sends (design: R15) ------


def _both_read_a_failed_intent(shop: Shop) -> list[tuple[Any, BaseException | None]]:
    """An intent settled FAILED with no failure handed to any body (what a cancel's proven
    ``NotSent``, or an operator's ``resolve --not-sent``, leaves): whoever reaches it may
    send it, so two executions race for one compare-and-set."""
    shop.gateway.idempotency_keys = False  # so a second send is a second payment
    charge = shop.charge_call()
    shop.gateway.inject_fault(FakeGatewayFault.FAIL_BEFORE_PROCESSING)
    with shop.start("task-0") as first, pytest.raises(FakeGatewayError):
        first.outbound(charge, {"amount": 500}, business_key="order:15")
    key = business_intent_key(shop.settings, "order:15", "fake.charge")
    with shop.store.transaction() as tx:
        failed = tx.read_intent(key)
        assert failed is not None
        guard = IntentGuard(IntentStatus.FAILED, failed.attempt, failed.owner)
        assert tx.update_intent(key, guard, IntentUpdate(failure=None, owner=None))
    # Both read FAILED; neither has written.
    return shop.race_past_the_read(("task-1", "task-2"), charge, {"amount": 500}, "order:15")


def test_r15_two_executions_reading_a_failed_intent_send_one_new_attempt(shop: Shop) -> None:
    outcomes = _both_read_a_failed_intent(shop)
    winners = [result for result, error in outcomes if error is None]
    assert winners and all(receipt["amount"] == 500 for receipt in winners)
    assert len(shop.gateway.payments) == 1
    key = business_intent_key(shop.settings, "order:15", "fake.charge")
    assert len(shop.gateway.requests_for(key)) == 2  # the failed first attempt and one resend


def test_r15_twin_a_cas_without_its_predicate_sends_twice(shop: Shop) -> None:
    with sabotage.switched_off(protections.INTENT_CAS_WITHOUT_PREDICATE):
        _both_read_a_failed_intent(shop)
    assert len(shop.gateway.payments) == 2


# --- join only a send of the same request (design: R16) -------------------------------------


def _second_caller_while_first_sends(shop: Shop, amount: int) -> tuple[Any, Any]:
    charge = shop.charge_call()
    hold = shop.gateway.hold()  # the first request is processed, its answer held
    first, second = shop.start("task-1"), shop.start("task-2")
    sender = Background(lambda: first.outbound(charge, {"amount": 1000}, business_key="order:16"))
    hold.wait_reached()
    joiner = Background(
        lambda: second.outbound(charge, {"amount": amount}, business_key="order:16")
    )
    time.sleep(0.05)  # let the joiner reach the in-flight send (it waits, or it is refused)
    hold.release()
    return sender.join(), joiner.outcome()


def test_a_second_caller_with_the_same_request_joins_the_send_in_flight(shop: Shop) -> None:
    receipt, (joined, error) = _second_caller_while_first_sends(shop, 1000)
    assert error is None
    assert joined == receipt
    assert len(shop.gateway.requests) == 1


def test_r16_a_caller_with_another_amount_does_not_join_the_send_in_flight(shop: Shop) -> None:
    _, (_, error) = _second_caller_while_first_sends(shop, 2000)
    assert isinstance(error, IdempotencyKeyConflictError)
    assert [p["amount"] for p in shop.gateway.payments] == [1000]


def test_r16_twin_joining_on_any_fingerprint_hands_out_another_order_s_receipt(
    shop: Shop,
) -> None:
    with sabotage.switched_off(protections.JOIN_ON_ANY_FINGERPRINT):
        _, (joined, error) = _second_caller_while_first_sends(shop, 2000)
    assert error is None
    # The caller asked for 2000 and is told it was charged; the gateway charged 1000 only.
    assert joined["amount"] == 1000
    assert [p["amount"] for p in shop.gateway.payments] == [1000]


def _two_threads_of_one_delivery_call_one_key(shop: Shop) -> list[tuple[Any, BaseException | None]]:
    """Threads A and B of one delivery call one business key; A is held right after its
    claim committed, before its send is registered in flight."""
    shop.gateway.idempotency_keys = False  # so a second send under the key is a payment
    charge = shop.charge_call()
    ctx = shop.start("task-16")
    claimed = arm_pause(OUTBOUND_AFTER_READ, only=lambda point: point.get("status") is None)

    def call() -> Any:
        return ctx.outbound(charge, {"amount": 1600}, business_key="order:16b")

    first = Background(call, name="A")
    claimed.wait_reached()
    second = Background(call, name="B")
    if sabotage.active(protections.CALLS_OF_ONE_KEY_CONCURRENT):
        wait_until(lambda: not second.alive, what="B to finish beside A")
    else:
        assert_stays(lambda: second.alive, 0.5)  # B waits for A's call of the key
    claimed.release()
    return [first.outcome(), second.outcome()]


def test_r16_threads_of_one_delivery_calling_one_key_take_turns(shop: Shop) -> None:
    (paid, error_a), (replayed, error_b) = _two_threads_of_one_delivery_call_one_key(shop)
    assert error_a is None and error_b is None
    assert replayed == paid
    assert len(shop.gateway.requests) == 1


def test_r16_twin_threads_of_one_delivery_send_one_key_twice(shop: Shop) -> None:
    with sabotage.switched_off(protections.CALLS_OF_ONE_KEY_CONCURRENT):
        _two_threads_of_one_delivery_call_one_key(shop)
    assert len(shop.gateway.requests) == 2
    assert len(shop.gateway.payments) == 2


# --- a cancel does not release the lease under a send still running (design: R18) --------------


def _cancel_while_sending(shop: Shop) -> tuple[bool, BaseException | None]:
    shop.gateway.idempotency_keys = False
    charge = shop.charge_call()
    hold = shop.gateway.hold(before_processing=True)
    ctx = shop.start("task-1")
    body = Background(lambda: ctx.outbound(charge, {"amount": 700}))
    hold.wait_reached()
    released = ctx.release()  # the cancel path: the body ignores it and keeps sending
    refused: BaseException | None = None
    try:
        successor = shop.start("task-1")
    except LeaseNotHeldError as exc:
        refused = exc
    else:
        Background(lambda: successor.outbound(charge, {"amount": 700})).outcome()
    hold.release()
    body.outcome()
    return released, refused


def test_r18_the_lease_is_not_released_while_a_send_under_it_runs(shop: Shop) -> None:
    released, refused = _cancel_while_sending(shop)
    assert released is False
    assert isinstance(refused, LeaseNotHeldError)
    assert len(shop.gateway.payments) == 1


def test_r18_twin_releasing_under_a_running_send_charges_twice(shop: Shop) -> None:
    with sabotage.switched_off(protections.RELEASE_WITH_UNSETTLED_ATTEMPT):
        released, refused = _cancel_while_sending(shop)
    assert released is True and refused is None
    assert len(shop.gateway.payments) == 2


# --- an answer after the hand-over is never reported as sent (design: R20) ------------------


def _answer_after_hand_over(shop: Shop) -> tuple[Any, Any]:
    charge = shop.charge_call()
    zombie = shop.start("task-1")
    paused = arm_pause(OUTBOUND_AFTER_SEND, only={"holder": zombie.lease_ref.holder})
    sending = Background(lambda: zombie.outbound(charge, {"amount": 900}))
    paused.wait_reached()  # the gateway answered; the zombie froze before recording it
    shop.expire_leases()
    shop.reconciled("task-1", charge, {"amount": 900})
    paused.release()
    return sending.outcome(), zombie


def test_r20_an_answer_after_the_hand_over_is_fenced_and_logged_not_reported(
    shop: Shop, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="celery_agboss")
    (_, error), zombie = _answer_after_hand_over(shop)
    assert isinstance(error, ExecutionFencedError)
    assert zombie.last_outcome is None
    assert "outbound-call.answered-after-hand-over" in _events(caplog)
    assert "outbound-call.superseded" in _events(caplog)
    assert len(shop.gateway.payments) == 1


def test_r20_twin_a_superseded_attempt_silently_reported_as_sent(shop: Shop) -> None:
    with sabotage.switched_off(protections.SUPERSEDED_SILENTLY_REPORTED):
        (receipt, error), zombie = _answer_after_hand_over(shop)
    # The zombie is told "sent" for a payment it never recorded (the successor did).
    assert error is None and zombie.last_outcome is Outcome.SENT
    assert receipt["id"] == shop.gateway.payments[0]["id"]


# --- a send that never returns is bounded (design: R22) -------------------------------------


def test_r22_a_send_that_never_returns_is_abandoned_at_attempt_timeout(
    shop: Shop, fast: EngineSettings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="celery_agboss")
    charge = shop.charge_call()
    hold = shop.gateway.hold(before_processing=True)
    ctx = shop.start("task-1", settings=fast)
    started = time.monotonic()
    with pytest.raises(OutboundCallOutcomeUnknownError):
        ctx.outbound(charge, {"amount": 600})
    assert time.monotonic() - started < 3.0
    assert not ctx.lease.is_trusted()  # renewals stop; the lease will expire
    assert ctx.settle_all_and_release() is False  # never released under the send
    lease = shop.store.read_lease("task-1")
    assert lease is not None and lease.live
    shop.expire_leases()
    successor = shop.start("task-1", settings=fast)
    hold.release()  # the hung request finally reaches the gateway
    wait_until(lambda: ctx.unsettled_sends() == 0, what="the hung send to end")
    assert "outbound-call.answered-after-hand-over" in _events(caplog)
    successor.outbound(charge, {"amount": 600})
    assert successor.last_outcome is Outcome.RECONCILED
    assert len(shop.gateway.payments) == 1


def test_r22_twin_an_unbounded_send_holds_the_delivery_past_its_timeout(
    shop: Shop, fast: EngineSettings
) -> None:
    charge = shop.charge_call()
    hold = shop.gateway.hold(before_processing=True)
    ctx = shop.start("task-1", settings=fast)
    with sabotage.switched_off(protections.SEND_NOT_BOUNDED):
        body = Background(lambda: ctx.outbound(charge, {"amount": 600}))
        time.sleep(1.0)  # more than three attempt timeouts
        assert body.alive
        hold.release()
        body.join()


# --- no reclaim moves the token under a live send (design: R23) ----------------------------


def _overrun_then_another_execution(shop: Shop, fast: EngineSettings) -> BaseException | None:
    shop.gateway.idempotency_keys = False
    charge = shop.charge_call()
    hold = shop.gateway.hold(before_processing=True)
    first = shop.start("task-1", settings=fast)
    with pytest.raises(OutboundCallOutcomeUnknownError):
        first.outbound(charge, {"amount": 800}, business_key="order:23")
    second = shop.start("task-2", settings=fast)
    _, error = Background(
        lambda: second.outbound(charge, {"amount": 800}, business_key="order:23")
    ).outcome()
    hold.release()
    wait_until(lambda: first.unsettled_sends() == 0, what="the first send to end")
    return error


def test_r23_a_holder_whose_send_overran_keeps_its_token_so_the_send_looks_alive(
    shop: Shop,
    fast: EngineSettings,
) -> None:
    error = _overrun_then_another_execution(shop, fast)
    assert isinstance(error, OutboundCallInFlightError)
    assert len(shop.gateway.payments) == 1


def test_r23_twin_a_reclaim_that_bumps_the_token_makes_a_live_send_look_dead(
    shop: Shop,
    fast: EngineSettings,
) -> None:
    with sabotage.switched_off(protections.RECLAIM_BUMPS_TOKEN):
        error = _overrun_then_another_execution(shop, fast)
    assert error is None
    assert len(shop.gateway.payments) == 2


# --- a result that could not be stored is never replayed as a result (design: R24) -----------


def _charge_with_unstorable_receipt(shop: Shop) -> Any:
    def send(call: Any) -> Any:
        receipt = shop.gateway.charge(call.request["amount"], call.idempotency_key)
        return {**receipt, "settled_at": datetime.now(timezone.utc)}  # not JSON

    return shop.charge_call(send=send)


def test_r24_a_result_that_cannot_be_stored_is_flagged_and_replays_raise(shop: Shop) -> None:
    charge = _charge_with_unstorable_receipt(shop)
    with shop.start("task-1") as ctx, pytest.raises(OutboundCallResultNotStoredError):
        ctx.outbound(charge, {"amount": 400})
    record = shop.store.read_intent(step_intent_key(shop.settings, "task-1", "fake.charge"))
    assert record is not None
    assert record.status is IntentStatus.COMPLETED
    assert not record.result_stored and record.needs_operator
    with shop.start("task-1") as again, pytest.raises(OutboundCallResultNotStoredError):
        again.outbound(charge, {"amount": 400})
    assert len(shop.gateway.requests) == 1


def test_r24_twin_a_replay_returns_the_not_stored_marker_as_the_gateway_s_result(
    shop: Shop,
) -> None:
    charge = _charge_with_unstorable_receipt(shop)
    with shop.start("task-1") as ctx, pytest.raises(OutboundCallResultNotStoredError):
        ctx.outbound(charge, {"amount": 400})
    with sabotage.switched_off(protections.REPLAY_NOT_STORED_MARKER), shop.start("task-1") as again:
        receipt = again.outbound(charge, {"amount": 400})
    assert "id" not in receipt  # a marker, not the payment the gateway made
    assert "agboss_result_not_stored" in receipt


# --- an error of unknown outcome stays PENDING and is reconciled (design: R25, PS1) -------------


def _answer_lost_then_retried_after_the_gateway_forgot_the_key(shop: Shop) -> Any:
    charge = shop.charge_call()
    shop.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    with shop.start("task-1") as first:
        with pytest.raises((OutboundCallOutcomeUnknownError, FakeGatewayTimeout)):
            first.outbound(charge, {"amount": 1200})
        retry_asked(first)  # the body's autoretry_for=(Exception,)
    shop.clock.advance(2 * DAY)
    shop.gateway.forget_keys()
    with shop.start("task-1") as second:
        receipt = second.outbound(charge, {"amount": 1200})
        return receipt, second.last_outcome


def test_r25_an_sdk_error_of_unknown_outcome_is_reconciled_not_resent(shop: Shop) -> None:
    receipt, outcome = _answer_lost_then_retried_after_the_gateway_forgot_the_key(shop)
    assert outcome is Outcome.RECONCILED
    assert receipt["id"] == shop.gateway.payments[0]["id"]
    assert len(shop.gateway.payments) == 1


def test_r25_twin_every_error_definite_pays_twice_once_the_key_is_forgotten(shop: Shop) -> None:
    with sabotage.switched_off(protections.UNKNOWN_ERRORS_ARE_DEFINITE):
        _, outcome = _answer_lost_then_retried_after_the_gateway_forgot_the_key(shop)
    assert outcome is Outcome.SENT
    assert len(shop.gateway.payments) == 2


# --- a NotSent() past the key's retention is not resent (design: R26, PS17) ----------------------


def _crash_then_replay_after(shop: Shop, age: Any) -> tuple[Any, BaseException | None]:
    shop.gateway.lookup_by_key = False  # G1 + G3 only: reconcile can only replay the key
    charge = shop.charge_call(reconcile="replay", key_retention=DAY)
    shop.lose_the_answer("task-1", charge, {"amount": 300})
    shop.clock.advance(age)
    second = shop.start("task-1")
    return Background(lambda: second.outbound(charge, {"amount": 300})).outcome()


def test_r26_a_not_sent_inside_the_key_retention_is_replayed_under_the_same_key(
    shop: Shop,
) -> None:
    receipt, error = _crash_then_replay_after(shop, 3600)
    assert error is None
    assert receipt["id"] == shop.gateway.payments[0]["id"]  # the gateway replayed the key
    assert len(shop.gateway.payments) == 1


def test_r26_a_not_sent_past_the_key_retention_is_refused_for_an_operator(shop: Shop) -> None:
    _, error = _crash_then_replay_after(shop, 25 * 3600)
    assert isinstance(error, OutboundCallUnreconciledError)
    record = shop.store.read_intent(step_intent_key(shop.settings, "task-1", "fake.charge"))
    assert record is not None and record.status is IntentStatus.PENDING
    assert record.needs_operator and record.operator_reason == "key-too-old"
    assert len(shop.gateway.payments) == 1


def test_r26_twin_without_the_key_age_check_a_late_not_sent_pays_twice(shop: Shop) -> None:
    with sabotage.switched_off(protections.NO_KEY_AGE_CHECK):
        _, error = _crash_then_replay_after(shop, 25 * 3600)
    assert error is None
    assert len(shop.gateway.payments) == 2
