"""A definite failure is replayed, never re-sent, to every execution but the one a retry
authorised (design: retry authorisation), and any hand-out of it to another execution revokes
that authorisation in the same compare-and-set that the retry's own claim needs.

A's primary card is declined and A's body asks for a retry (``autoretry_for``): its next
delivery may send the primary again under the same key. B, a second click of the same
order, reaches the same declined primary at the same instant (both held right after
their read, then released together): B is handed the decline and goes to its backup
card — or A's retry wins the intent first and B joins it. Either way the order pays
once; the twin, whose hand-out does not revoke A's authorisation, pays twice.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_agboss.core.outbound import OutboundCall
from celery_agboss.core.protections import HAND_OUT_KEEPS_RETRY
from celery_agboss.testing import sabotage
from celery_agboss.testing.fault_arming import OUTBOUND_AFTER_READ, arm_pause
from celery_agboss.testing.gateway import FakeGatewayError, FakeGatewayFault
from tests.engine.helpers import Background, Shop, retry_asked, wait_for_hits

REQUEST = {"amount": 1000}
ORDER = "order:r-1"


def _primary_or_backup(ctx: Any, primary: OutboundCall, backup: OutboundCall) -> Any:
    """B's body: the primary card, the backup when it is declined."""
    try:
        return ctx.outbound(primary, REQUEST, business_key=ORDER)
    except FakeGatewayError:
        return ctx.outbound(backup, REQUEST, business_key=ORDER)


def _a_retry_and_a_second_click_on_one_decline(shop: Shop) -> list[Any]:
    primary, backup = shop.charge_call("fake.primary"), shop.charge_call("fake.backup")
    shop.gateway.inject_fault(FakeGatewayFault.DECLINE)  # the first charge only
    with shop.start("exec-a") as first:
        with pytest.raises(FakeGatewayError):
            first.outbound(primary, REQUEST, business_key=ORDER)
        retry_asked(first)  # A's body: autoretry_for=(CardDeclined,)
    paused = arm_pause(OUTBOUND_AFTER_READ, times=2)
    retry = shop.start("exec-a")  # A's retry
    second = shop.start("exec-b", store=shop.store_factory())  # B, the second click
    racers = [
        Background(lambda: retry.outbound(primary, REQUEST, business_key=ORDER)),
        Background(lambda: _primary_or_backup(second, primary, backup)),
    ]
    wait_for_hits(paused, 2)  # both read the FAILED primary; neither has written
    paused.release()
    outcomes = [racer.outcome() for racer in racers]
    for ctx in (retry, second):
        ctx.release()
    return outcomes


def test_a_second_click_handed_the_decline_while_the_retry_runs_pays_once(shop: Shop) -> None:
    (retried, retry_error), (clicked, click_error) = _a_retry_and_a_second_click_on_one_decline(
        shop
    )
    assert click_error is None, click_error
    assert len(shop.gateway.payments) == 1, "one order, one payment"
    [payment] = shop.gateway.payments
    assert clicked["id"] == payment["id"]
    if retry_error is None:  # A's retry won the intent; B joined or replayed it
        assert retried["id"] == payment["id"]
    else:  # B was handed the decline first: A's authorisation went with it
        assert isinstance(retry_error, FakeGatewayError)


def test_twin_a_hand_out_that_keeps_the_retry_authorised_pays_twice(shop: Shop) -> None:
    with sabotage(HAND_OUT_KEEPS_RETRY):
        _a_retry_and_a_second_click_on_one_decline(shop)
    assert len(shop.gateway.payments) == 2, "the primary for A's retry, the backup for B"
