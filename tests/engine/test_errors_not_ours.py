"""An ordinary exception that is not ours, raised while a claimed call is unsettled, stops
the delivery (design: signals and errors).

Celery's soft time limit (billiard's ``SoftTimeLimitExceeded``) is a plain ``Exception``
raised into the main thread at any bytecode. Landing after the claim and before the
outcome is recorded, it used to reach the body as itself with the intent PENDING: a body
that retries on ``except Exception`` called again under a new step key (``#2``) and paid
twice. It is now ``OutboundCallOutcomeUnknownError``, a signal ``except Exception``
cannot catch and every later verb of the delivery raises again; the next delivery
reconciles the pending intent. ``SoftLimit`` stands for the soft limit: this suite does
not import Celery. Twins (``foreign-error-escapes-claimed-call``): the exception escapes
as it is, the body calls again, and the gateway has two payments.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_agboss.core.outbound import OutboundCall, Outcome
from celery_agboss.core.protections import FOREIGN_ERROR_ESCAPES_CLAIMED_CALL
from celery_agboss.errors import OutboundCallOutcomeUnknownError
from celery_agboss.testing import sabotage
from celery_agboss.testing.fault_arming import (
    OUTBOUND_BEFORE_SEND,
    OUTBOUND_BEFORE_SETTLE,
    arm_raise,
)
from tests.engine.helpers import Shop

REQUEST = {"amount": 1000}


class SoftLimit(Exception):
    """Stands for billiard's ``SoftTimeLimitExceeded``, a plain ``Exception`` (this suite
    does not import Celery)."""


def _body(ctx: Any, charge: OutboundCall) -> Any:
    """A common body: try the charge twice on any error (each try is a new step, ``#n``)."""
    for _ in range(2):
        try:
            return ctx.outbound(charge, REQUEST)
        except Exception:
            continue
    return None


def _first_delivery_stopped(shop: Shop, charge: OutboundCall, point: str) -> None:
    """The soft limit lands at ``point`` of the first call: the body cannot catch what it
    becomes, and a body that swallowed even that is refused on its next call."""
    arm_raise(point, SoftLimit("soft time limit exceeded"))
    with shop.start("task-1") as ctx:
        with pytest.raises(OutboundCallOutcomeUnknownError) as stopped:
            _body(ctx, charge)
        assert isinstance(stopped.value.__cause__, SoftLimit)
        with pytest.raises(OutboundCallOutcomeUnknownError, match="already stopped"):
            ctx.outbound(charge, REQUEST)


def _next_delivery(shop: Shop, charge: OutboundCall) -> tuple[Any, Outcome | None]:
    """The execution's next delivery runs the body again."""
    with shop.start("task-1") as ctx:
        return _body(ctx, charge), ctx.last_outcome


def test_a_soft_limit_after_the_answer_stops_the_delivery_and_is_reconciled(shop: Shop) -> None:
    charge = shop.charge_call()
    _first_delivery_stopped(shop, charge, OUTBOUND_BEFORE_SETTLE)
    assert len(shop.gateway.requests) == 1, "the second call sent nothing"
    receipt, outcome = _next_delivery(shop, charge)
    assert outcome is Outcome.RECONCILED
    assert [p["id"] for p in shop.gateway.payments] == [receipt["id"]]
    assert len(shop.gateway.requests) == 1


def test_a_soft_limit_between_the_claim_and_the_send_is_sent_once_after_recovery(
    shop: Shop,
) -> None:
    charge = shop.charge_call()
    _first_delivery_stopped(shop, charge, OUTBOUND_BEFORE_SEND)
    assert not shop.gateway.requests
    receipt, outcome = _next_delivery(shop, charge)  # looked up: not sent; sent once
    assert outcome is Outcome.SENT
    assert [p["id"] for p in shop.gateway.payments] == [receipt["id"]]
    assert len(shop.gateway.requests) == 1


def test_twin_a_soft_limit_after_the_answer_escapes_and_the_body_pays_again(shop: Shop) -> None:
    charge = shop.charge_call()
    arm_raise(OUTBOUND_BEFORE_SETTLE, SoftLimit("soft time limit exceeded"))
    with sabotage(FOREIGN_ERROR_ESCAPES_CLAIMED_CALL), shop.start("task-1") as ctx:
        _body(ctx, charge)  # #1 charged, its soft limit caught; #2 charged again
    assert len(shop.gateway.payments) == 2


def test_twin_a_soft_limit_before_the_send_escapes_and_the_rerun_pays_again(
    shop: Shop,
) -> None:
    """The body catches the soft limit and pays under ``#2``; its delivery then dies on
    the hard time limit before its verdict, and the next one runs the body again: ``#1``
    is looked up, not found, and sent."""
    charge = shop.charge_call()
    arm_raise(OUTBOUND_BEFORE_SEND, SoftLimit("soft time limit exceeded"))
    with sabotage(FOREIGN_ERROR_ESCAPES_CLAIMED_CALL):
        with shop.start("task-1") as ctx:
            _body(ctx, charge)
        assert len(shop.gateway.payments) == 1
        _next_delivery(shop, charge)
    assert len(shop.gateway.payments) == 2
