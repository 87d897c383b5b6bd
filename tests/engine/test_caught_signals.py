"""A body that catches a celery_agboss signal and calls on is stopped (design: P3).

An unknown outcome means "this delivery must stop": the next delivery reconciles. A
body that catches it and calls the same step again would get a new step key (``#2``)
and charge a second time, so every later verb of that delivery raises the signal again.
"""

from __future__ import annotations

import contextlib

import pytest

from celery_agboss.core.protections import CAUGHT_SIGNAL_DOES_NOT_STOP_DELIVERY
from celery_agboss.errors import OutboundCallOutcomeUnknownError
from celery_agboss.testing import FakeGatewayFault, sabotage
from tests.engine.helpers import Shop


def _charge_twice_catching_the_first_unknown(shop: Shop) -> None:
    charge = shop.charge_call()
    shop.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    with shop.start("task-caught") as ctx:
        # The mistake: swallowing the signal and trying again.
        with contextlib.suppress(OutboundCallOutcomeUnknownError):
            ctx.outbound(charge, {"amount": 1000})
        ctx.outbound(charge, {"amount": 1000})


def test_a_body_that_catches_an_unknown_outcome_cannot_charge_again(shop: Shop) -> None:
    with pytest.raises(OutboundCallOutcomeUnknownError, match="already stopped"):
        _charge_twice_catching_the_first_unknown(shop)
    assert len(shop.gateway.payments) == 1
    assert len(shop.gateway.requests) == 1


def test_twin_without_the_stop_a_caught_unknown_outcome_charges_twice(shop: Shop) -> None:
    with sabotage(CAUGHT_SIGNAL_DOES_NOT_STOP_DELIVERY):
        _charge_twice_catching_the_first_unknown(shop)
    assert len(shop.gateway.payments) == 2
