"""The key-age rule of a resend (design: R26, PS17): ``key_age + attempt_timeout < key_retention``,
decided by the compare-and-set on the database clock, to the millisecond.

``first_attempt_at`` is written directly and the database clock is frozen, so the age
the CAS reads is exactly the one written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text

from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.holder_clocks import SYSTEM_CLOCK, HolderClock
from celery_agboss.core.outbound import CallContext, Lookup, NotSent, Outcome
from celery_agboss.errors import OutboundCallOutcomeUnknownError, OutboundCallUnreconciledError
from celery_agboss.testing.clock import SkewedHolderClock
from celery_agboss.testing.fault_arming import OUTBOUND_BEFORE_SEND, arm_raise
from celery_agboss.testing.gateway import FakeGatewayFault
from tests.engine.frozen_clock import FrozenDatabaseClock
from tests.engine.helpers import Background, Crash, Shop, step_intent_key

RETENTION = timedelta(hours=1)
ATTEMPT_TIMEOUT_MS = 60_000
BOUND_MS = 3_600_000 - ATTEMPT_TIMEOUT_MS  # key_age must stay below this


@pytest.fixture
def frozen(shop: Shop) -> Iterator[FrozenDatabaseClock]:
    clock = FrozenDatabaseClock(shop.store.engine)
    try:
        yield clock
    finally:
        clock.close()


@pytest.fixture
def slow(settings: EngineSettings) -> EngineSettings:
    return dataclasses.replace(settings, attempt_timeout_ms=ATTEMPT_TIMEOUT_MS)


def _first_attempted(shop: Shop, key: str, at_ms: int) -> None:
    """Backdate the intent's first attempt: its key is as old as the test needs."""
    with shop.store.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE agboss_outbound_calls SET first_attempt_at_ms = :at "
                "WHERE idempotency_key = :k"
            ),
            {"at": at_ms, "k": key},
        )


def _retry_with_key_age(
    shop: Shop,
    frozen: FrozenDatabaseClock,
    settings: EngineSettings,
    age_ms: int,
    holder_clock: HolderClock = SYSTEM_CLOCK,
) -> tuple[Any, BaseException | None, list[timedelta | None], Any]:
    shop.gateway.lookup_by_key = False  # reconcile can only answer NotSent (replay the key)
    ages: list[timedelta | None] = []

    def reconcile(call: CallContext, lookup: Lookup) -> NotSent:
        ages.append(lookup.key_age)
        return NotSent()

    charge = shop.charge_call(reconcile=reconcile, key_retention=RETENTION)
    frozen.freeze()
    now = shop.store.now_ms()
    shop.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    with (
        shop.start("task-1", settings=settings) as first,
        pytest.raises(OutboundCallOutcomeUnknownError),
    ):
        first.outbound(charge, {"amount": 250})
    _first_attempted(shop, step_intent_key(settings, "task-1", "fake.charge"), now - age_ms)
    second = shop.start("task-1", settings=settings, clock=holder_clock)
    result, error = Background(lambda: second.outbound(charge, {"amount": 250})).outcome()
    return result, error, ages, second


def test_a_key_one_millisecond_inside_the_bound_is_resent(
    shop: Shop, frozen: FrozenDatabaseClock, slow: EngineSettings
) -> None:
    receipt, error, ages, second = _retry_with_key_age(shop, frozen, slow, BOUND_MS - 1)
    assert error is None and second.last_outcome is Outcome.SENT
    assert ages == [timedelta(milliseconds=BOUND_MS - 1)]
    assert len(shop.gateway.requests) == 2  # resent under the same key
    assert len(shop.gateway.payments) == 1  # which the gateway replayed
    assert receipt["id"] == shop.gateway.payments[0]["id"]


def test_a_key_exactly_at_the_bound_is_not_resent(
    shop: Shop, frozen: FrozenDatabaseClock, slow: EngineSettings
) -> None:
    _, error, ages, _ = _retry_with_key_age(shop, frozen, slow, BOUND_MS)
    assert isinstance(error, OutboundCallUnreconciledError)
    assert ages == [timedelta(milliseconds=BOUND_MS)]
    assert len(shop.gateway.requests) == 1


def test_a_holder_two_days_ahead_reads_the_same_key_age(
    shop: Shop, frozen: FrozenDatabaseClock, slow: EngineSettings
) -> None:
    ahead = SkewedHolderClock(wall_skew=timedelta(days=2).total_seconds())
    _, error, ages, second = _retry_with_key_age(shop, frozen, slow, BOUND_MS - 1, ahead)
    assert error is None and second.last_outcome is Outcome.SENT
    assert ages == [timedelta(milliseconds=BOUND_MS - 1)]


def test_a_lookup_that_proves_absence_may_resend_at_any_age(
    shop: Shop, frozen: FrozenDatabaseClock, slow: EngineSettings
) -> None:
    charge = shop.charge_call(key_retention=None, lookup_proves_absence=True)
    frozen.freeze()
    now = shop.store.now_ms()
    crash = arm_raise(OUTBOUND_BEFORE_SEND, Crash)
    with shop.start("task-1", settings=slow) as first, pytest.raises(Crash):
        first.outbound(charge, {"amount": 90})
    assert crash.hits == 1 and shop.gateway.requests == []
    _first_attempted(shop, step_intent_key(slow, "task-1", "fake.charge"), now - 30 * 86_400_000)
    with shop.start("task-1", settings=slow) as second:
        second.outbound(charge, {"amount": 90})
        assert second.last_outcome is Outcome.SENT
    assert len(shop.gateway.payments) == 1
