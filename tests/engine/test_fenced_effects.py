"""Fenced effects (design: P2): a write committed at most once per key, in the transaction that
checks the lease; its result replayed, never recomputed."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import insert, text
from sqlalchemy.orm import Session

from celery_agboss.core import sabotage
from celery_agboss.core.protections import LEASE_CHECK_IN_SEPARATE_ROUND_TRIP
from celery_agboss.core.store_protocol import EffectRecord
from celery_agboss.errors import (
    CommitInsideFencedEffectError,
    ExecutionFencedError,
    FencedEffectConflictError,
    IdempotencyKeyConflictError,
)
from celery_agboss.testing.fault_arming import FENCED_BEFORE_BEGIN, arm_pause
from tests.engine.app_tables import create_app_tables, ledger, notes, write_note
from tests.engine.helpers import Background, Shop


@pytest.fixture(autouse=True)
def _app_tables(shop: Shop) -> None:
    create_app_tables(shop.store.engine)


def test_a_fenced_effect_writes_once_and_the_next_delivery_replays_its_result(
    shop: Shop,
) -> None:
    runs: list[int] = []

    def mark_paid(conn: Any) -> dict[str, Any]:
        runs.append(1)
        return write_note(conn, "order 42 paid")

    with shop.start("task-1") as first:
        assert first.fenced_effect("mark-paid", mark_paid) == {"note": "order 42 paid"}
    with shop.start("task-1") as second:
        assert second.fenced_effect("mark-paid", mark_paid) == {"note": "order 42 paid"}
    assert runs == [1]
    assert notes(shop.store.engine) == ["order 42 paid"]


def test_a_business_keyed_effect_is_shared_by_every_execution_that_names_it(shop: Shop) -> None:
    with shop.start("task-1") as one:
        one.fenced_effect("mark-paid", lambda c: write_note(c, "by one"), business_key="order:1")
    with shop.start("task-2") as two:
        result = two.fenced_effect(
            "mark-paid", lambda c: write_note(c, "by two"), business_key="order:1"
        )
    assert result == {"note": "by one"}
    assert notes(shop.store.engine) == ["by one"]


def test_a_renamed_step_is_not_handed_the_old_result(shop: Shop) -> None:
    from celery_agboss.core.step_identity import step_of
    from celery_agboss.core.store_protocol import EFFECT_RECORD

    with shop.start("task-1") as ctx:
        key = step_of(EFFECT_RECORD, shop.settings.tenant, "task-1", "mark-paid", None, 1).key
        with shop.store.fenced(ctx.lease_ref, 30_000) as tx:
            tx.insert_effect(EffectRecord(key, "task-1", "old-name", {"old": True}, 1, 0))
        with pytest.raises(FencedEffectConflictError):
            ctx.fenced_effect("mark-paid", lambda c: write_note(c, "never"))
    assert notes(shop.store.engine) == []


def test_the_same_effect_key_with_another_request_is_refused(shop: Shop) -> None:
    with shop.start("task-1") as ctx:
        ctx.fenced_effect(
            "reserve",
            lambda c: write_note(c, "3 items"),
            business_key="cart:9",
            request={"items": 3},
        )
    with shop.start("task-2") as other, pytest.raises(IdempotencyKeyConflictError):
        other.fenced_effect(
            "reserve",
            lambda c: write_note(c, "5 items"),
            business_key="cart:9",
            request={"items": 5},
        )
    assert notes(shop.store.engine) == ["3 items"]


@pytest.mark.parametrize("method", ["commit", "rollback", "close"])
def test_ending_the_transaction_inside_a_fenced_effect_is_refused_and_nothing_commits(
    shop: Shop, method: str
) -> None:
    def sneaky(conn: Any) -> None:
        conn.execute(insert(ledger).values(note="written early"))
        getattr(conn, method)()

    with shop.start("task-1") as ctx:
        with pytest.raises(CommitInsideFencedEffectError):
            ctx.fenced_effect("sneaky", sneaky)
        assert notes(shop.store.engine) == []
        # The effect was not recorded either: a correct retry runs once.
        ctx2_result = ctx.fenced_effect("sneaky", lambda c: write_note(c, "properly"))
    assert ctx2_result == {"note": "properly"}
    assert notes(shop.store.engine) == ["properly"]


def test_an_orm_session_joins_the_fenced_transaction_through_a_savepoint(shop: Shop) -> None:
    def with_orm(conn: Any) -> dict[str, Any]:
        with Session(bind=conn, join_transaction_mode="create_savepoint") as session:
            session.execute(insert(ledger).values(note="through the ORM"))
            session.commit()  # releases the savepoint; the outer transaction decides
        count = conn.execute(text("SELECT COUNT(*) FROM shop_ledger")).scalar_one()
        return {"rows_seen": int(count)}

    with shop.start("task-1") as ctx:
        assert ctx.fenced_effect("orm", with_orm) == {"rows_seen": 1}
        assert ctx.fenced_effect("orm-again", lambda c: {"ok": True}) == {"ok": True}
    with shop.start("task-1") as replay:
        assert replay.fenced_effect("orm", with_orm) == {"rows_seen": 1}
    assert notes(shop.store.engine) == ["through the ORM"]


def test_an_effect_whose_function_raises_records_nothing_and_writes_nothing(shop: Shop) -> None:
    def failing(conn: Any) -> None:
        write_note(conn, "half done")
        raise ValueError("application error")

    with shop.start("task-1") as ctx:
        with pytest.raises(ValueError):
            ctx.fenced_effect("failing", failing)
        assert ctx.fenced_effect("failing", lambda c: write_note(c, "done")) == {"note": "done"}
    assert notes(shop.store.engine) == ["done"]


def test_an_effect_must_return_json(shop: Shop) -> None:
    with shop.start("task-1") as ctx, pytest.raises(TypeError, match="JSON"):
        ctx.fenced_effect("bad", lambda c: (write_note(c, "x"), object()))
    assert notes(shop.store.engine) == []


def _zombie_race(shop: Shop) -> tuple[BaseException | None, Any]:
    """A delivery passes its lease check, freezes before its write, is taken over, wakes."""
    zombie = shop.start("task-1")
    paused = arm_pause(FENCED_BEFORE_BEGIN, only={"holder": zombie.lease_ref.holder})
    writer = Background(
        lambda: zombie.fenced_effect("mark-paid", lambda c: write_note(c, "zombie"))
    )
    paused.wait_reached()
    shop.expire_leases()
    successor = shop.start("task-1")
    paused.release()
    _, error = writer.outcome()
    result = successor.fenced_effect("mark-paid", lambda c: write_note(c, "successor"))
    return error, result


def test_a_superseded_delivery_cannot_write_a_fenced_effect(shop: Shop) -> None:
    """P1/P2 (design: PS3, PS4): the lease is checked in the write's own transaction."""
    error, result = _zombie_race(shop)
    assert isinstance(error, ExecutionFencedError)
    assert result == {"note": "successor"}
    assert notes(shop.store.engine) == ["successor"]


def test_twin_a_lease_checked_in_a_separate_round_trip_lets_the_zombie_write_first(
    shop: Shop,
) -> None:
    with sabotage.switched_off(LEASE_CHECK_IN_SEPARATE_ROUND_TRIP):
        error, result = _zombie_race(shop)
    assert error is None
    assert result == {"note": "zombie"}  # the new holder replays the zombie's write
    assert notes(shop.store.engine) == ["zombie"]
