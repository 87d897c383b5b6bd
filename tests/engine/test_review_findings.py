"""Findings of the engine review, each shown failing before its fix (both backends).

1. A send that passed its lease check just before another thread released the lease
   went out after the release (P1, R18).
2. An error text holding a lone surrogate turned an unknown outcome (or a definite
   failure) into a raw ``TypeError``: the quarantine row could not be written (R25).
3. A gateway transaction id the database cannot hold made every settle and every
   reconcile of a payment that moved money fail.
4. ``COMMIT`` sent as SQL text inside a fenced effect committed its writes without the
   effect's record and without the commit-time lease check (P2).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
from sqlalchemy import insert

from celery_agboss.core import protections, sabotage
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.outbound import CallContext, Outcome
from celery_agboss.core.store import IntentStatus
from celery_agboss.errors import (
    CommitInsideFencedEffectError,
    ExecutionFencedError,
    OutboundCallOutcomeUnknownError,
)
from tests.engine.app_tables import create_app_tables, ledger, notes, write_note
from tests.engine.helpers import Background, Shop, step_intent_key


class _PausedAfterLeaseCheck(ExecutionContext):
    """A delivery whose sending thread is descheduled right after its lease check."""

    checked: threading.Event
    go: threading.Event

    def assert_can_send(self) -> None:
        super().assert_can_send()
        self.checked.set()
        assert self.go.wait(10), "the test never let the send go on"


def _paused_delivery(shop: Shop, execution_id: str) -> _PausedAfterLeaseCheck:
    ctx = _PausedAfterLeaseCheck.start(shop.store, execution_id, shop.settings)
    assert isinstance(ctx, _PausedAfterLeaseCheck)
    ctx.checked = threading.Event()
    ctx.go = threading.Event()
    return ctx


def _release_under_a_checked_send(shop: Shop) -> tuple[BaseException | None, int]:
    """Thread B passes its lease check; the delivery's thread releases; then B goes on.

    Returns B's error and how many requests reached the gateway while a second delivery
    already held the lease."""
    charge = shop.charge_call()
    first = _paused_delivery(shop, "task-1")
    sending = Background(lambda: first.outbound(charge, {"amount": 100}), name="sender")
    assert first.checked.wait(10)
    assert first.release() is True  # the body "returned": nothing is registered as sending
    second = shop.start("task-1")  # the lease is free: the next delivery holds it now
    try:
        first.go.set()
        _, error = sending.outcome()
        behind_its_back = len(shop.gateway.requests)
    finally:
        second.release()
    return error, behind_its_back


def test_a_send_checked_before_another_thread_released_the_lease_is_not_sent(
    shop: Shop,
) -> None:
    """P1/R18: once the lease is released, no send of that holder starts."""
    error, behind_its_back = _release_under_a_checked_send(shop)
    assert isinstance(error, ExecutionFencedError)
    assert behind_its_back == 0
    # The claimed attempt is reconciled by the next delivery and sent once.
    charge = shop.settings.call_named("fake.charge")
    assert charge is not None
    with shop.start("task-1") as third:
        third.outbound(charge, {"amount": 100})
    assert len(shop.gateway.payments) == 1


def test_twin_without_the_check_a_send_goes_out_under_a_released_lease(shop: Shop) -> None:
    with sabotage.switched_off(protections.RELEASE_WITH_UNSETTLED_ATTEMPT):
        _, behind_its_back = _release_under_a_checked_send(shop)
    assert behind_its_back == 1  # sent while another delivery held the lease (then fenced)


# --- 2. error texts that are not storable text -----------------------------------------


def test_an_unknown_outcome_whose_error_text_holds_a_lone_surrogate_stays_quarantined(
    shop: Shop,
) -> None:
    """R25: the money moved, the SDK error is odd text; still PENDING, recorded, reconciled."""

    def charge_then_reset(call: CallContext) -> Any:
        shop.gateway.charge(100, call.idempotency_key)
        raise ConnectionError("reset by peer after b'\\xff' -> \udcff")

    charge = shop.charge_call(send=charge_then_reset)
    key = step_intent_key(shop.settings, "task-1", "fake.charge")
    with shop.start("task-1") as first, pytest.raises(OutboundCallOutcomeUnknownError):
        first.outbound(charge, {"amount": 100})
    record = shop.store.read_intent(key)
    assert record is not None and record.status is IntentStatus.PENDING
    assert shop.store.read_history(key)[-1].event == "outcome-unknown"
    with shop.start("task-1") as second:
        second.outbound(charge, {"amount": 100})
        assert second.last_outcome is Outcome.RECONCILED
    assert len(shop.gateway.payments) == 1


def test_a_definite_failure_whose_error_text_holds_a_lone_surrogate_is_recorded_failed(
    shop: Shop,
) -> None:
    class Declined(Exception):
        pass

    def decline(call: CallContext) -> Any:
        raise Declined("card declined \udcff")

    charge = shop.charge_call(send=decline, definite=lambda exc: isinstance(exc, Declined))
    with shop.start("task-1") as ctx, pytest.raises(Declined):
        ctx.outbound(charge, {"amount": 100})
    record = shop.store.read_intent(step_intent_key(shop.settings, "task-1", "fake.charge"))
    assert record is not None and record.status is IntentStatus.FAILED


# --- 3. a gateway transaction id the store cannot hold ------------------------------------


@pytest.mark.parametrize("bad", ["\udcff", "\x00"], ids=["lone-surrogate", "nul"])
def test_a_gateway_id_the_store_cannot_hold_does_not_stop_the_payment_being_recorded(
    shop: Shop, bad: str
) -> None:
    charge = dataclasses.replace(
        shop.charge_call(), transaction_id=lambda result: f"{result['id']}{bad}"
    )
    with shop.start("task-1") as ctx:
        receipt = ctx.outbound(charge, {"amount": 100})
        assert ctx.last_outcome is Outcome.SENT
    record = shop.store.read_intent(step_intent_key(shop.settings, "task-1", "fake.charge"))
    assert record is not None and record.status is IntentStatus.COMPLETED
    assert record.result == receipt and record.gateway_transaction_id is None
    assert len(shop.gateway.payments) == 1


# --- 4. COMMIT as SQL text inside a fenced effect -------------------------------------------


def _commit_as_text_then_fail(shop: Shop, statement: str) -> None:
    create_app_tables(shop.store.engine)

    def sneaky(conn: Any) -> Any:
        conn.execute(insert(ledger).values(note="paid"))
        conn.exec_driver_sql(statement)
        raise RuntimeError("the effect fails after its own COMMIT")

    with shop.start("task-1") as ctx:
        with pytest.raises((CommitInsideFencedEffectError, RuntimeError)):
            ctx.fenced_effect("mark-paid", sneaky)
        ctx.fenced_effect("mark-paid", lambda conn: write_note(conn, "paid"))


@pytest.mark.parametrize("statement", ["COMMIT", "commit;", "END", "ROLLBACK"])
def test_commit_sent_as_sql_text_inside_a_fenced_effect_is_refused(
    shop: Shop, statement: str
) -> None:
    """P2: the effect's writes commit with its record, or not at all."""
    _commit_as_text_then_fail(shop, statement)
    assert notes(shop.store.engine) == ["paid"]


def test_twin_a_commit_as_sql_text_lets_a_failed_effect_write_twice(shop: Shop) -> None:
    with sabotage.switched_off(protections.COMMIT_INSIDE_FENCED_EFFECT_ALLOWED):
        _commit_as_text_then_fail(shop, "COMMIT")
    assert notes(shop.store.engine) == ["paid", "paid"]
