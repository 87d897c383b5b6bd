"""A ``NotSent`` the sweep records is said to be confirmed only when the call's lookup
proves absence (``lookup_proves_absence``; design: sweep reconciles, key age).

A gateway with no lookup (Adyen) answers ``NotSent`` for a payment it charged: the
resend under the same key settles it by the gateway's replay. Operators must not read
"NOT SENT (confirmed)" of it in ``agboss pending``/``show``, nor count it in the
sweep's ``not_sent_confirmed``; nor may ``--json`` say ``not_sent_confirmed`` of it (a
script reads it as "nothing was charged" and closes the order unpaid or charges again
under another key: the recorded mark is ``not_sent_recorded``). On SQLite and PostgreSQL.
"""

from __future__ import annotations

import uuid

import pytest

from celery_agboss.cli.views import intent_state, intent_view, status_text
from celery_agboss.core.history import HistoryEvent
from celery_agboss.core.lease import acquire
from celery_agboss.core.outbound import OutboundCall, Outcome
from celery_agboss.core.store_protocol import IntentRecord, IntentStatus
from celery_agboss.core.stranded import StrandedOutcome, reconcile_stranded
from celery_agboss.testing.fault_arming import OUTBOUND_BEFORE_SEND, arm_raise
from celery_agboss.testing.gateway_types import FakeGatewayFault
from tests.contract import conftest as contract_fixtures
from tests.engine import conftest as engine_fixtures
from tests.engine.helpers import Crash, Shop, step_intent_key
from tests.operations.conftest import WorldFactory

# The engine suite's ``shop``, on both stores (the contract suite's store fixtures).
db_clock, store, store_backend = (
    contract_fixtures.db_clock,
    contract_fixtures.store,
    contract_fixtures.store_backend,
)
store_factory, store_url = contract_fixtures.store_factory, contract_fixtures.store_url
gateway, settings, shop = engine_fixtures.gateway, engine_fixtures.settings, engine_fixtures.shop

REQUEST = {"amount": 700}


def _unique_name(kind: str) -> str:
    """A call name no other call of this process has: the views find the call by it."""
    return f"{kind}.charge{uuid.uuid4().hex[:12]}"


def _sweep_reconciles(shop: Shop, key: str) -> StrandedOutcome:
    sweeper = acquire(shop.store, "agboss-sweep-test", ttl_ms=10_000)
    assert sweeper is not None
    try:
        return reconcile_stranded(shop.store, shop.settings, key, sweeper_lease=sweeper)
    finally:
        shop.store.release_lease(sweeper.ref)


def _intent(shop: Shop, key: str) -> IntentRecord:
    record = shop.store.read_intent(key)
    assert record is not None
    return record


def test_a_charged_intent_a_replay_only_lookup_calls_not_sent_is_not_shown_confirmed(
    shop: Shop,
) -> None:
    """Adyen-like: no lookup, ``NotSent`` means "a resend would be replayed". The
    payment exists; the sweep records the NotSent unproven, and the resend under the
    same key is what settles it."""
    name = _unique_name("replayonly")
    charge = shop.charge_call(name, reconcile="replay")
    shop.lose_the_answer("task-1", charge, REQUEST)  # charged, the answer lost
    assert len(shop.gateway.payments) == 1
    shop.expire_leases()
    key = step_intent_key(shop.settings, "task-1", name)

    assert _sweep_reconciles(shop, key) is StrandedOutcome.NOT_SENT_CONFIRMED
    intent = _intent(shop, key)
    shown = intent_state(intent)
    assert "confirmed" not in shown and "cannot be proven" in shown, shown
    assert "may be paid" in shown and "same key" in shown, shown
    assert "confirmed" not in status_text(intent)
    view = intent_view(intent)
    assert view["not_sent_proven"] is False and view["not_sent_confirmed"] is False
    assert view["not_sent_recorded"] is True
    last = shop.store.read_history(key)[-1]
    assert last.event == HistoryEvent.RECONCILED_NOT_SENT.value
    assert isinstance(last.detail, dict)
    assert last.detail["proven"] is False and "cannot prove absence" in last.detail["why"]
    assert len(shop.gateway.requests) == 1, "the sweep never sends"

    with shop.start("task-1") as next_delivery:  # the resend the text promises
        result = next_delivery.outbound(charge, REQUEST)
        assert next_delivery.last_outcome is Outcome.SENT
    assert len(shop.gateway.payments) == 1, "the gateway replayed the key: one payment"
    assert result["id"] == shop.gateway.payments[0]["id"]
    assert _intent(shop, key).status is IntentStatus.COMPLETED


def test_a_not_sent_a_lookup_proves_is_still_shown_confirmed(shop: Shop) -> None:
    name = _unique_name("proven")
    charge: OutboundCall = shop.charge_call(name, key_retention=None, lookup_proves_absence=True)
    dead = shop.start("task-1")
    arm_raise(OUTBOUND_BEFORE_SEND, Crash, only={"holder": dead.lease_ref.holder})
    with pytest.raises(Crash):
        dead.outbound(charge, REQUEST)
    shop.expire_leases()
    key = step_intent_key(shop.settings, "task-1", name)

    assert _sweep_reconciles(shop, key) is StrandedOutcome.NOT_SENT_CONFIRMED
    intent = _intent(shop, key)
    assert intent.not_sent_confirmed
    assert intent_state(intent) == "NOT SENT (confirmed; resent by its next delivery)"
    view = intent_view(intent)
    assert view["not_sent_proven"] is True and view["not_sent_confirmed"] is True
    assert view["not_sent_recorded"] is True
    last = shop.store.read_history(key)[-1]
    assert isinstance(last.detail, dict)
    assert last.detail["proven"] is True and "why" not in last.detail
    assert shop.gateway.requests == [] and shop.gateway.payments == []


@pytest.mark.parametrize("proves_absence", [False, True], ids=["unproven", "proven"])
def test_the_sweep_counts_as_confirmed_only_a_not_sent_its_lookup_proves(
    world_factory: WorldFactory, proves_absence: bool
) -> None:
    """``not_sent_confirmed`` (the sweep's report, ``agboss_sweep_rows_total``) counts
    proven ones; ``not_sent_unproven`` the others."""
    world = world_factory(proves_absence=proves_absence)
    task_id, _ = world.stranded(FakeGatewayFault.FAIL_BEFORE_PROCESSING)
    report = world.sweep_sending_nothing()
    counts = (report.not_sent_confirmed, report.as_dict().get("not_sent_unproven"))
    assert counts == ((1, 0) if proves_absence else (0, 1)), report
    (intent,) = world.intents(task_id)
    assert intent.status is IntentStatus.PENDING and intent.not_sent_confirmed
    if not proves_absence:
        assert "confirmed" not in intent_state(intent)
    assert world.gateway.payments == []
