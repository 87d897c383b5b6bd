"""A step's key is made once, by the delivery's ``ExecutionContext``
(design: key grammar, position keys): the intent, the fenced effect's record and the
undo declared after each step carry the key ``core.step_identity.step_of`` made,
counted by position the same way on every delivery of the body. (With the outbox's
rows: tests/delivery/test_step_keys_through_the_outbox.py.)
"""

from __future__ import annotations

import pytest

from celery_agboss.core.compensation import declare_undo, read_declarations
from celery_agboss.core.step_identity import step_of
from celery_agboss.core.store_protocol import EFFECT_RECORD, INTENT_RECORD
from tests.engine.helpers import Shop, mark_every_step_key

sqlite_only = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)

MARK = ":marked"


@sqlite_only
def test_the_intent_the_effect_and_their_undos_carry_the_key_the_context_made(
    shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = mark_every_step_key(monkeypatch, MARK)
    charge = shop.charge_call()
    ctx = shop.start("exec-steps")
    ctx.outbound(charge, {"amount": 1000})
    assert ctx.last_step == made[-1]
    declare_undo(ctx, "refund", {})
    ctx.fenced_effect("reserve", lambda conn: 1)
    ctx.fenced_effect("reserve", lambda conn: 2)
    declare_undo(ctx, "release", {})
    call, first, second = made
    assert (call.kind, call.occurrence) == (INTENT_RECORD, 1)
    assert [(s.kind, s.occurrence) for s in (first, second)] == [
        (EFFECT_RECORD, 1),
        (EFFECT_RECORD, 2),
    ]
    with ctx.fenced() as tx:
        assert tx.read_intent(call.key) is not None, "the intent is kept under the step's key"
        assert tx.read_effect(second.key) is not None, "so is the effect's record"
        declared = read_declarations(tx, shop.settings, "exec-steps")
    assert [(d.step_key, d.kind) for d in declared] == [
        (call.key, INTENT_RECORD),
        (second.key, EFFECT_RECORD),
    ]
    ctx.release()


def test_a_step_is_keyed_by_its_business_key_or_by_its_position() -> None:
    keyed = step_of(INTENT_RECORD, "shop", "exec-1", "charge", "order:1", 7)
    assert keyed.occurrence == 1, "a business-keyed step has no position"
    assert keyed.key == step_of(INTENT_RECORD, "shop", "exec-2", "charge", "order:1", 1).key
    second = step_of(EFFECT_RECORD, "shop", "exec-1", "reserve", None, 2)
    assert second.key.endswith("reserve#2")
    long_key = step_of(INTENT_RECORD, "shop", "exec-1", "charge", "o" * 300, 1, max_key_length=64)
    assert len(long_key.key) <= 64
    with pytest.raises(ValueError):
        step_of(EFFECT_RECORD, "shop", "exec-1", "", None, 1)
