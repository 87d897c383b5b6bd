"""The sweep's reconcile step and stranded intents no key opens.

(design: sweep reconciles, sealed at rest)

A batch's worth of older PENDING intents sealed under a key the sweeper lacks headed
every run's oldest-first listing: their reconcile failed reading them, and so did the
back-off, which read the whole intent again, so none was ever backed off and the dead
worker's charge behind them was never looked up (never shown paid or refundable). The
back-off reads and chains by the columns never sealed: each such intent fails alone,
by name, and waits like a failed lookup (doubling); the one behind is reconciled.
Counted at the gateway.
"""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import select

from celery_agboss.core.history import HistoryEvent
from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.core.stranded import LOOKUP_BACKOFF_BASE_MS as BASE_MS
from celery_agboss.errors import SealedValueUnopenableError
from celery_agboss.store.schema import intent_history, outbound_calls
from tests.operations.conftest import WorldFactory
from tests.operations.poison import poison, sealed_world
from tests.operations.world import World

_i = outbound_calls.c
_h = intent_history.c
BATCH = 3


def _facts(world: World, key: str) -> tuple[str, int, int | None, str | None]:
    """What an unopenable intent shows: status, lookup failures, next lookup, owner."""
    with world.agboss.store.engine.connect() as conn:
        row = conn.execute(
            select(_i.status, _i.lookup_failures, _i.next_lookup_at_ms, _i.owner_holder).where(
                _i.idempotency_key == key
            )
        ).one()
    return str(row.status), int(row.lookup_failures), row.next_lookup_at_ms, row.owner_holder


def _chain(world: World, key: str) -> list[tuple[int, str, str | None, str]]:
    """The intent's history as (seq, event, prev_digest, digest), read without its detail."""
    with world.agboss.store.engine.connect() as conn:
        rows = conn.execute(
            select(_h.seq, _h.event, _h.prev_digest, _h.digest)
            .where(_h.idempotency_key == key)
            .order_by(_h.seq)
        ).all()
    return [(int(r.seq), str(r.event), r.prev_digest, str(r.digest)) for r in rows]


def _failed(caplog: pytest.LogCaptureFixture) -> list[tuple[object, object]]:
    """Each ``sweep.error`` as (step, execution id); a reconcile's names the missing key."""
    found = []
    for record in caplog.records:
        if getattr(record, "event", None) != "sweep.error":
            continue
        step = record.__dict__.get("step")
        if step == "reconcile":
            assert record.exc_info is not None
            error = record.exc_info[1]
            assert isinstance(error, SealedValueUnopenableError) and error.key_id == "k0"
        found.append((step, record.__dict__.get("execution_id")))
    return found


@pytest.mark.parametrize("history_sealed_too", [True, False], ids=["history-sealed", "intent-only"])
def test_a_batch_of_intents_no_key_opens_backs_off_and_the_charge_behind_is_reconciled(
    world_factory: WorldFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    history_sealed_too: bool,
) -> None:
    world = sealed_world(world_factory, monkeypatch)
    poisoned: dict[str, str] = {}  # idempotency key -> execution id, oldest first
    for _ in range(BATCH):
        execution_id = world.publish()
        key, _lease = world.strand(execution_id)
        poisoned[key] = execution_id
    fresh = world.publish()
    fresh_key, _lease = world.strand(fresh)
    for key in poisoned:
        poison(world, outbound_calls, _i.idempotency_key, key, "request")
        if history_sealed_too:
            poison(world, intent_history, _h.idempotency_key, key, "detail")
    chains = {key: _chain(world, key) for key in poisoned}
    lookups = [lookup.value for lookup in world.gateway.lookups]

    with caplog.at_level(logging.WARNING, logger="celery_agboss"):
        first = world.sweep_sending_nothing(batch_size=BATCH)
        second = world.sweep_sending_nothing(batch_size=BATCH)

    new_lookups = [lookup.value for lookup in world.gateway.lookups][len(lookups) :]
    assert new_lookups == [fresh_key], "the charge behind them is looked up, once"
    (intent,) = world.intents(fresh)
    assert intent.status is IntentStatus.COMPLETED, "found paid at the gateway"
    assert len(world.gateway.payments_for(fresh_key)) == 1
    assert (first.errors, second.errors, second.reconciled) == (BATCH, 0, 1)
    assert sorted(_failed(caplog)) == sorted(("reconcile", e) for e in poisoned.values()), (
        "each fails alone, named; its back-off does not fail"
    )
    now = world.agboss.store.now_ms()
    for key in poisoned:
        status, failures, next_lookup, owner = _facts(world, key)
        assert (status, failures) == (IntentStatus.PENDING.value, 1)
        assert next_lookup is not None and next_lookup > now, "backed off: not due yet"
        assert BASE_MS < next_lookup - now <= 2 * BASE_MS, "a failed lookup's first wait"
        assert owner is not None, "left to its dead owner: the sweeper never took it"
        chain = _chain(world, key)
        assert chain[:-1] == chains[key]
        seq, event, prev_digest, _digest = chain[-1]
        assert (seq, event, prev_digest) == (
            chains[key][-1][0] + 1,
            HistoryEvent.LOOKUP_FAILED.value,
            chains[key][-1][3],
        ), "chained to the row before it"

    caplog.clear()
    world.clock.advance(2 * BASE_MS / 1000 + 1)  # due again: they fail again, by name, and
    # wait twice as long
    with caplog.at_level(logging.WARNING, logger="celery_agboss"):
        assert world.sweep_sending_nothing(batch_size=BATCH).errors == BATCH
    assert sorted(_failed(caplog)) == sorted(("reconcile", e) for e in poisoned.values())
    now = world.agboss.store.now_ms()
    for key in poisoned:
        _status, failures, next_lookup, _owner = _facts(world, key)
        assert failures == 2
        assert next_lookup is not None and 2 * BASE_MS < next_lookup - now <= 4 * BASE_MS
    shown = {i.idempotency_key: i for i in world.agboss.executions.list_pending_intents(limit=50)}
    for key in poisoned:
        assert shown[key].lookup_failures == 2, "an operator sees it, and how often it failed"
