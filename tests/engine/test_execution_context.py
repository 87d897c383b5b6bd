"""``ExecutionContext``: one delivery's lease, keys and verbs (P1, R17 at the engine)."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

import pytest

from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.lease import acquire
from celery_agboss.core.masking import MaskingPolicy
from celery_agboss.core.outbound import CallContext, Lookup, NotSent, OutboundCall
from celery_agboss.core.protections import REQUEST_STORED_UNMASKED
from celery_agboss.core.stranded import reconcile_stranded
from celery_agboss.errors import (
    ConfigurationError,
    ExecutionFencedError,
    InvalidBusinessKeyError,
    MaskingPolicyError,
)
from celery_agboss.testing import sabotage
from celery_agboss.testing.fault_arming import OUTBOUND_BEFORE_SEND, arm_raise
from tests.engine.helpers import (
    PSEUDONYM_KEY,
    Crash,
    Shop,
    business_intent_key,
    reconcile_by_replay,
)


def test_two_different_calls_of_one_name_are_refused(shop: Shop) -> None:
    settings = EngineSettings(pseudonym_key=PSEUDONYM_KEY)
    one = shop.charge_call()
    settings.register(one)
    settings.register(one)  # the same object again is fine
    with pytest.raises(ConfigurationError, match=r"fake\.charge"):
        settings.register(shop.charge_call())


def test_settings_refuse_a_short_pseudonym_key() -> None:
    with pytest.raises(ConfigurationError):
        EngineSettings(pseudonym_key=b"short")


def test_the_first_use_of_a_call_registers_it_for_the_sweep(shop: Shop) -> None:
    charge = shop.charge_call()
    with shop.start("task-1") as ctx:
        ctx.outbound(charge, {"amount": 10})
    assert shop.settings.call_named("fake.charge") is charge


def test_a_request_the_masking_policy_cannot_store_is_refused_and_nothing_sent(shop: Shop) -> None:
    charge = shop.charge_call(mask=MaskingPolicy(mask=["card.number"]))
    with shop.start("task-1") as ctx, pytest.raises(MaskingPolicyError):
        ctx.outbound(charge, {"amount": 10, "at": datetime.now(timezone.utc)})
    assert shop.gateway.requests == []
    assert shop.store.read_intent("default:t:task-1:fake.charge") is None


def test_the_stored_request_is_masked_and_the_sweep_s_reconcile_sees_it_masked(
    shop: Shop,
) -> None:
    seen: list[object] = []

    def reconcile(call: CallContext, lookup: Lookup) -> NotSent:
        seen.append(lookup.request)
        return NotSent()

    charge = shop.charge_call(mask=MaskingPolicy(mask=["card.number"]), reconcile=reconcile)
    dead = shop.start("task-1")
    arm_raise(OUTBOUND_BEFORE_SEND, Crash, only={"holder": dead.lease_ref.holder})
    with pytest.raises(Crash):
        dead.outbound(charge, {"amount": 10, "card": {"number": "4242424242424242"}})
    masked = {"amount": 10, "card": {"number": "***"}}
    record = shop.store.read_intent("default:t:task-1:fake.charge")
    assert record is not None and record.request == masked
    shop.expire_leases()
    sweeper = acquire(shop.store, "agboss-sweep-test", ttl_ms=10_000)
    assert sweeper is not None
    reconcile_stranded(shop.store, shop.settings, record.idempotency_key, sweeper_lease=sweeper)
    assert seen == [masked]


def test_an_invalid_business_key_is_refused_before_anything_is_written(shop: Shop) -> None:
    charge = shop.charge_call()
    with shop.start("task-1") as ctx, pytest.raises(InvalidBusinessKeyError):
        ctx.outbound(charge, {"amount": 10}, business_key="order:\u200b42")
    assert shop.gateway.requests == []


def test_logs_name_a_business_key_by_its_handle_never_in_clear(
    shop: Shop, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="celery_agboss")
    charge = shop.charge_call()
    with shop.start("task-1") as ctx:
        ctx.outbound(charge, {"amount": 10}, business_key="customer:alice@example.com")
    with shop.start("task-2") as ctx:
        ctx.outbound(charge, {"amount": 10}, business_key="customer:alice@example.com")
    events = [r for r in caplog.records if getattr(r, "event", "").startswith("outbound-call.")]
    assert {getattr(r, "event", "") for r in events} >= {
        "outbound-call.sent",
        "outbound-call.replayed",
    }
    for record in caplog.records:
        assert "alice" not in record.getMessage()
        assert "alice" not in repr(vars(record))
    assert all(getattr(r, "business_key_handle", None) for r in events)
    key = business_intent_key(shop.settings, "customer:alice@example.com", "fake.charge")
    assert key  # the key itself holds it, and is sent to the gateway: never logged


def test_a_delivery_whose_lease_was_taken_over_writes_and_sends_nothing(shop: Shop) -> None:
    charge = shop.charge_call()
    zombie = shop.start("task-1")
    shop.expire_leases()
    successor = shop.start("task-1")
    with pytest.raises(ExecutionFencedError):
        zombie.outbound(charge, {"amount": 10})
    with pytest.raises(ExecutionFencedError):
        zombie.fenced_effect("mark", lambda conn: {"ok": True})
    with pytest.raises(ExecutionFencedError):
        zombie.assert_held()  # the refused write ended its trust in the lease
    assert shop.gateway.requests == []
    successor.release()


def test_leaving_the_context_releases_the_lease_for_the_next_delivery(shop: Shop) -> None:
    with shop.start("task-1") as ctx:
        ctx.outbound(shop.charge_call(), {"amount": 10})
    lease = shop.store.read_lease("task-1")
    assert lease is not None and lease.released
    with shop.start("task-1"):
        pass


def test_outbound_call_names_must_be_dotted() -> None:
    from celery_agboss.errors import OutboundCallDefinitionError

    with pytest.raises(OutboundCallDefinitionError):
        OutboundCall(
            name="charge", send=lambda c: None, reconcile=reconcile_by_replay, key_retention=60
        )


def test_r17_twin_without_masking_the_card_number_is_stored_in_clear(shop: Shop) -> None:
    charge = shop.charge_call(mask=MaskingPolicy(mask=["card.number"]))
    with sabotage(REQUEST_STORED_UNMASKED), shop.start("task-1") as ctx:
        ctx.outbound(charge, {"amount": 10, "card": {"number": "4242424242424242"}})
    record = shop.store.read_intent("default:t:task-1:fake.charge")
    assert record is not None
    assert record.request == {"amount": 10, "card": {"number": "4242424242424242"}}
