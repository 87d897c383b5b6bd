"""``--json``'s ``not_sent_confirmed`` of an intent is true only for a ``NotSent`` the
call's lookup proves (``lookup_proves_absence``), as the sweep's count of that name.

A script reads "confirmed" as "nothing was charged": of a gateway that answers
``NotSent`` for a payment it charged (no lookup, a replay), that script would close the
order unpaid, or charge again under another key. The recorded mark is
``not_sent_recorded``. On SQLite and PostgreSQL (the engine suite's ``shop``).
"""

from __future__ import annotations

import pytest

from celery_agboss.cli.views import intent_view
from celery_agboss.core.outbound import OutboundCall
from celery_agboss.core.stranded import StrandedOutcome
from celery_agboss.testing.fault_arming import OUTBOUND_BEFORE_SEND, arm_raise
from tests.contract import conftest as contract_fixtures
from tests.engine import conftest as engine_fixtures
from tests.engine.helpers import Crash, Shop, step_intent_key
from tests.operations.test_unproven_not_sent import (
    REQUEST,
    _intent,
    _sweep_reconciles,
    _unique_name,
)

# The engine suite's ``shop``, on both stores (the contract suite's store fixtures).
db_clock, store, store_backend = (
    contract_fixtures.db_clock,
    contract_fixtures.store,
    contract_fixtures.store_backend,
)
store_factory, store_url = contract_fixtures.store_factory, contract_fixtures.store_url
gateway, settings, shop = engine_fixtures.gateway, engine_fixtures.settings, engine_fixtures.shop


def test_json_says_not_confirmed_of_a_charged_intent_a_lookup_cannot_prove(
    shop: Shop,
) -> None:
    name = _unique_name("replayonly")
    charge = shop.charge_call(name, reconcile="replay")
    shop.lose_the_answer("task-1", charge, REQUEST)
    assert len(shop.gateway.payments) == 1, "the gateway charged"
    shop.expire_leases()
    key = step_intent_key(shop.settings, "task-1", name)
    assert _sweep_reconciles(shop, key) is StrandedOutcome.NOT_SENT_CONFIRMED

    view = intent_view(_intent(shop, key))
    assert view["not_sent_confirmed"] is False, "the payment exists"
    assert view["not_sent_proven"] is False and view["not_sent_recorded"] is True


def test_json_says_confirmed_of_a_not_sent_the_lookup_proves(shop: Shop) -> None:
    name = _unique_name("proven")
    charge: OutboundCall = shop.charge_call(name, key_retention=None, lookup_proves_absence=True)
    dead = shop.start("task-1")
    arm_raise(OUTBOUND_BEFORE_SEND, Crash, only={"holder": dead.lease_ref.holder})
    with pytest.raises(Crash):
        dead.outbound(charge, REQUEST)
    shop.expire_leases()
    key = step_intent_key(shop.settings, "task-1", name)
    assert _sweep_reconciles(shop, key) is StrandedOutcome.NOT_SENT_CONFIRMED
    assert shop.gateway.requests == []

    view = intent_view(_intent(shop, key))
    assert view["not_sent_confirmed"] is True and view["not_sent_proven"] is True
    assert view["not_sent_recorded"] is True
