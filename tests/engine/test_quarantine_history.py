"""The quarantine record (design: quarantine history): every transition of an intent is
chained in its history, in the transition's own transaction; an unknown outcome is
recorded as such — PENDING, never FAILED — and a changed row is detected."""

from __future__ import annotations

from sqlalchemy import text

from celery_agboss.core.history import verify_history
from tests.engine.helpers import PSEUDONYM_KEY, Shop, step_intent_key


def _unknown_then_reconciled(shop: Shop) -> str:
    charge = shop.charge_call()
    shop.lose_the_answer("task-1", charge, {"amount": 1000})
    return step_intent_key(shop.settings, "task-1", "fake.charge")


def test_an_unknown_outcome_leaves_a_chained_record_saying_so(shop: Shop) -> None:
    key = _unknown_then_reconciled(shop)
    rows = shop.store.read_history(key)
    assert [(r.event, r.to_status) for r in rows] == [
        ("claimed", "PENDING"),
        ("outcome-unknown", "PENDING"),
    ]
    assert rows[1].detail["reason"] == "send-raised"  # type: ignore[index, call-overload]
    assert verify_history(PSEUDONYM_KEY, rows, expected_last_status="PENDING").ok
    with shop.start("task-1") as second:
        second.outbound(shop.settings.registry["fake.charge"], {"amount": 1000})
    rows = shop.store.read_history(key)
    assert [r.event for r in rows] == [
        "claimed",
        "outcome-unknown",
        "taken-for-reconcile",
        "reconciled-completed",
    ]
    assert "FAILED" not in {r.to_status for r in rows}
    assert verify_history(PSEUDONYM_KEY, rows, expected_last_status="COMPLETED").ok
    record = shop.store.read_intent(key)
    assert record is not None
    assert record.gateway_transaction_id == shop.gateway.payments[0]["id"]


def test_verify_names_the_history_row_that_was_changed(shop: Shop) -> None:
    key = _unknown_then_reconciled(shop)
    with shop.store.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE agboss_intent_history SET to_status = 'FAILED' "
                "WHERE idempotency_key = :k AND seq = 2"
            ),
            {"k": key},
        )
    verdict = verify_history(PSEUDONYM_KEY, shop.store.read_history(key))
    assert not verdict.ok
    assert verdict.first_broken_seq == 2


def test_the_history_never_holds_the_request_or_the_business_key(shop: Shop) -> None:
    charge = shop.charge_call()
    with shop.start("task-1") as ctx:
        ctx.outbound(
            charge,
            {"amount": 1000, "card": "4242424242424242"},
            business_key="customer:alice@example.com",
        )
    from tests.engine.helpers import business_intent_key

    rows = shop.store.read_history(
        business_intent_key(shop.settings, "customer:alice@example.com", "fake.charge")
    )
    text_of_rows = repr([(r.event, r.detail) for r in rows])
    assert "4242" not in text_of_rows and "alice" not in text_of_rows
