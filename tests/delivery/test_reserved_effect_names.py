"""The package keeps its own fenced records (undo declarations, body publishes, undo
tasks) under effect names starting ``agboss.``; an application's effect of such a name
would share their keys, and the store would read it as one of ours (an effect named
``agboss.undo`` listed among the undos run at failure). The name is refused before
anything is recorded."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from celery_agboss.delivery.outcomes import decode_result
from celery_agboss.store.schema import fenced_effects
from tests.delivery.conftest import PaymentShop


def test_an_effect_named_like_the_packages_own_is_refused_before_it_is_recorded(
    shop: PaymentShop,
) -> None:
    @shop.task()
    def mark(self: Any, order: str) -> str:
        try:
            self.fenced_effect("agboss.undo", lambda conn: order)
        except ValueError as refused:
            return str(refused)
        return "recorded"

    execution_id = shop.run(mark, "o-1", states=("COMPLETED",))
    assert "starts with 'agboss.'" in str(decode_result(shop.execution(execution_id).result))
    with shop.agboss.store.read_transaction() as tx:
        recorded = tx.execute(
            select(func.count())
            .select_from(fenced_effects)
            .where(fenced_effects.c.execution_id == execution_id)
        ).scalar_one()
    assert recorded == 0, "nothing of the refused effect is kept"
