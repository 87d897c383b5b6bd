"""Retention and a replay of a shared record never both win (design: retention).

Execution A's business-keyed charge K completed more than the retention ago; execution B
(a second click on the same order) replays it. Retention lists K and then deletes it; B
reads K, notes its use and relies on it, in one fenced transaction. Interleaved, B can
rely on K while retention deletes it (and B's use with it): B's body is handed A's
receipt, and once it runs again it finds no K and charges a second time.

On PostgreSQL retention lists ``FOR UPDATE SKIP LOCKED`` and its ``DELETE`` judges the
listing's condition again; B holds K ``FOR KEY SHARE`` from its read. Both orders:

- retention first (paused between its listing and its ``DELETE``): B's read waits for
  it, finds K gone, and claims anew — B never relied on A's receipt;
- B first (paused before its reliance, as ``outbound.before-rely``): retention skips K,
  B relies on it, and K stays while B lives (a fenced effect too);
- a use committed after the listing, by a writer that does not hold K: the ``DELETE``
  sees it and keeps K, its history and its uses.

Every wait is a condition (a backend waiting for a lock, a paused point reached), with a
deadline. The twin (``RETENTION_DELETES_WHAT_IT_LISTED``) deletes K under B: B relied on
a record that is gone, and its re-run sends the charge again at the gateway. On SQLite
retention and a fenced transaction are both write transactions and never overlap: each
order is refused a begin while the other holds the write lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select
from sqlalchemy.engine import Engine

from celery_agboss.core import fault_points
from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.outbound import Outcome
from celery_agboss.core.protections import RETENTION_DELETES_WHAT_IT_LISTED
from celery_agboss.core.store_protocol import (
    EFFECT_RECORD,
    INTENT_RECORD,
    EffectRecord,
    IntentGuard,
    IntentStatus,
    IntentUpdate,
    LeaseRef,
    NewIntent,
    Reliance,
)
from celery_agboss.core.transitions import claim_row
from celery_agboss.errors import AGBossSignal
from celery_agboss.store import intents, retention
from celery_agboss.store.execution_store import SQLAlchemyExecutionStore
from celery_agboss.store.migrate import migrate
from celery_agboss.store.schema import record_uses
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.fault_arming import arm_pause, disarm_all
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.stores import sqlite_store_url
from celery_agboss.testing.switches import sabotage
from tests.conftest import TemplateFactory
from tests.contract.one_statement_world import HISTORY_KEY, TTL_MS, started
from tests.operations.world import World, make_world
from tests.support import services
from tests.support.databases import TemplateDatabase
from tests.support.lock_waits import in_thread, waiting_backends
from tests.support.processes import wait_until

FIRST, SECOND = "first-click", "second-click"
KEYS = {INTENT_RECORD: "default:b:order-1:shop.charge", EFFECT_RECORD: "default:b:order-1:ship"}
DEADLINE_S = 10.0
EIGHT_DAYS = timedelta(days=8)  # past the 7-day default retention


# --- the world: A's settled record, B running ---------------------------------------------


def _settled_by_first(executions: SQLAlchemyExecutionStore, kind: str) -> tuple[str, LeaseRef]:
    """A recorded K under a business key, relied on it and completed; B started. K's key
    and B's lease."""
    store = executions.store
    first = started(executions, FIRST)
    key = KEYS[kind]
    with store.fenced(first, TTL_MS) as tx:
        if kind == INTENT_RECORD:
            intent = NewIntent(key, FIRST, "shop.charge", "handle", "fp", {}, first)
            assert tx.insert_intent(intent, first_history=claim_row(HISTORY_KEY, intent))
            done = IntentUpdate(
                status=IntentStatus.COMPLETED,
                result={"id": "ch_1"},
                result_stored=True,
                complete=True,
                rely=True,
            )
            assert tx.update_intent(key, IntentGuard(IntentStatus.PENDING, 1, first), done)
        else:
            effect = EffectRecord(key, FIRST, "ship", {"shipped": 1}, first.token, 0, reliance=1)
            assert tx.insert_effect(effect)
        tx.rely_on(kind, key, FIRST, counted=True)
        assert executions.finish_in(tx, '"ok"').state is ExecutionState.COMPLETED
    assert store.release_lease(first)
    return key, started(executions, SECOND)


def _second_clicks_claim(key: str, lease: LeaseRef) -> NewIntent:
    return NewIntent(key, SECOND, "shop.charge", "handle", "fp", {}, lease)


def _replay(
    store: SQLAlchemyStore,
    lease: LeaseRef,
    kind: str,
    key: str,
    *,
    used: threading.Event | None = None,
    go_on: threading.Event | None = None,
) -> str:
    """B's fenced transaction, in the order the engine runs it: the claim that meets K
    (intents), the read, the use noted, then (``used`` set, ``go_on`` awaited) the
    reliance. ``"claimed"``, ``"gone"`` or the reliance."""
    with store.fenced(lease, TTL_MS) as tx:
        if kind == INTENT_RECORD:
            intent = _second_clicks_claim(key, lease)
            if tx.insert_intent(intent, first_history=claim_row(HISTORY_KEY, intent)):
                return "claimed"
            found: object = tx.read_intent(key)
        else:
            found = tx.read_effect(key)
        if found is None:
            return "gone"
        tx.record_use(kind, key, SECOND)
        if used is not None and go_on is not None:
            used.set()
            assert go_on.wait(DEADLINE_S), "never let go on"
        return tx.rely_on(kind, key, SECOND).value


def _exists(store: SQLAlchemyStore, kind: str, key: str) -> bool:
    found = store.read_intent(key) if kind == INTENT_RECORD else store.read_effect(key)
    return found is not None


def _uses_of(store: SQLAlchemyStore, key: str) -> list[str]:
    with store.transaction() as tx:
        rows = tx.execute(
            select(record_uses.c.execution_id).where(record_uses.c.record_key == key)
        ).all()
    return sorted(str(row.execution_id) for row in rows)


def _joined(*threads: threading.Thread) -> None:
    for thread in threads:
        thread.join(DEADLINE_S)
        assert not thread.is_alive(), f"{thread.name} never returned"


def _cutoff(store: SQLAlchemyStore) -> int:
    """A cutoff A ended before and B did not: retention judges K by B's use alone."""
    return store.now_ms() + 1_000


def _retention(store: SQLAlchemyStore, kind: str) -> retention.RetentionResult:
    sweep = (
        retention.delete_settled_intents_before
        if kind == INTENT_RECORD
        else retention.delete_effects_before
    )
    return sweep(store, _cutoff(store), 100)


class _PausedRetention:
    """Retention held between its listing and its ``DELETE`` (the listing's rows locked,
    on PostgreSQL), until ``go_on`` is set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.listed = threading.Event()
        self.go_on = threading.Event()
        original = intents.delete_settled_returning_txn

        def paused(*args: Any, **kwargs: Any) -> list[str]:
            self.listed.set()
            assert self.go_on.wait(DEADLINE_S), "retention never let go on"
            return original(*args, **kwargs)

        monkeypatch.setattr(intents, "delete_settled_returning_txn", paused)


# --- PostgreSQL, at the store --------------------------------------------------------------


def _retention_first(
    executions: SQLAlchemyExecutionStore, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """Retention lists K and stops before deleting it; B replays meanwhile. Whether B
    waited for retention, and what each got."""
    store = executions.store
    key, second = _settled_by_first(executions, INTENT_RECORD)
    pause = _PausedRetention(monkeypatch)
    outcome: dict[str, Any] = {"key": key, "second": second}
    sweeper = in_thread(lambda: _retention(store, INTENT_RECORD), outcome, "retention")
    assert pause.listed.wait(DEADLINE_S), "retention never listed"
    replay = in_thread(lambda: _replay(store, second, INTENT_RECORD, key), outcome, "replay")
    wait_until(
        lambda: "replay" in outcome or waiting_backends(store.engine) >= 1,
        DEADLINE_S,
        message="the replay to end or wait",
    )
    outcome["replay waited"] = "replay" not in outcome
    pause.go_on.set()
    _joined(sweeper, replay)
    return outcome


@pytest.mark.postgres
def test_a_replay_that_meets_retention_waits_finds_the_record_gone_and_claims_anew(
    executions: SQLAlchemyExecutionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome = _retention_first(executions, monkeypatch)
    store, key, second = executions.store, outcome["key"], outcome["second"]
    assert outcome["replay waited"], "the replay read K while retention held it"
    assert outcome["retention"].rows == 1, outcome
    assert outcome["replay"] == "gone", "B relied on a record retention deleted"
    assert _uses_of(store, key) == []
    with store.fenced(second, TTL_MS) as tx:  # the engine's next round: B's own claim
        intent = _second_clicks_claim(key, second)
        assert tx.insert_intent(intent, first_history=claim_row(HISTORY_KEY, intent))


@pytest.mark.postgres
def test_twin_retention_deletes_what_it_listed_under_a_replay_that_relied_on_it(
    executions: SQLAlchemyExecutionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    with sabotage(RETENTION_DELETES_WHAT_IT_LISTED):
        outcome = _retention_first(executions, monkeypatch)
    store, key = executions.store, outcome["key"]
    assert not outcome["replay waited"]
    assert outcome["replay"] == Reliance.RELIED.value, outcome
    assert outcome["retention"].rows == 1, outcome
    assert not _exists(store, INTENT_RECORD, key), "deleted while B relied on it"
    assert _uses_of(store, key) == [], "B's use went with it"


def _use_committed_after_the_listing(
    executions: SQLAlchemyExecutionStore, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, retention.RetentionResult]:
    """Retention lists K; a use of K by running B commits before its ``DELETE``, written
    by a writer that does not hold K (what a use committed between the listing's snapshot
    and its lock looks like). K's key and what retention did."""
    store = executions.store
    key, _ = _settled_by_first(executions, INTENT_RECORD)
    pause = _PausedRetention(monkeypatch)
    outcome: dict[str, Any] = {}
    sweeper = in_thread(lambda: _retention(store, INTENT_RECORD), outcome, "retention")
    assert pause.listed.wait(DEADLINE_S), "retention never listed"
    with store.engine.begin() as conn:
        conn.execute(
            insert(record_uses).values(
                kind=INTENT_RECORD, record_key=key, execution_id=SECOND, used_at_ms=0
            )
        )
    pause.go_on.set()
    _joined(sweeper)
    return key, outcome["retention"]


@pytest.mark.postgres
def test_the_delete_judges_again_and_keeps_a_record_whose_use_came_after_the_listing(
    executions: SQLAlchemyExecutionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, done = _use_committed_after_the_listing(executions, monkeypatch)
    assert done.rows == 0, done
    assert _exists(executions.store, INTENT_RECORD, key)
    assert _uses_of(executions.store, key) == [FIRST, SECOND], "the kept record keeps its uses"
    assert len(executions.store.read_history(key)) == 1, "and its history"


@pytest.mark.postgres
def test_twin_the_delete_trusts_the_listing_and_deletes_a_record_in_use(
    executions: SQLAlchemyExecutionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    with sabotage(RETENTION_DELETES_WHAT_IT_LISTED):
        key, done = _use_committed_after_the_listing(executions, monkeypatch)
    assert done.rows == 1, done
    assert not _exists(executions.store, INTENT_RECORD, key)
    assert _uses_of(executions.store, key) == []


def _replay_first(executions: SQLAlchemyExecutionStore, kind: str) -> dict[str, Any]:
    """B reads K and notes its use, and stops before relying on it; retention runs."""
    store = executions.store
    key, second = _settled_by_first(executions, kind)
    used, go_on = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {"key": key}
    replay = in_thread(
        lambda: _replay(store, second, kind, key, used=used, go_on=go_on), outcome, "replay"
    )
    assert used.wait(DEADLINE_S), "B never noted its use"
    sweeper = in_thread(lambda: _retention(store, kind), outcome, "retention")
    _joined(sweeper)  # never waits for B: a row B holds is skipped
    go_on.set()
    _joined(replay)
    outcome["after"] = _retention(store, kind)  # B committed its use: kept for B
    return outcome


@pytest.mark.postgres
@pytest.mark.parametrize("kind", [INTENT_RECORD, EFFECT_RECORD])
def test_retention_skips_a_record_a_replay_holds_and_keeps_it_for_that_replay(
    executions: SQLAlchemyExecutionStore, kind: str
) -> None:
    outcome = _replay_first(executions, kind)
    store, key = executions.store, outcome["key"]
    assert outcome["retention"].rows == 0, outcome
    assert outcome["replay"] == Reliance.RELIED.value, outcome
    assert outcome["after"].rows == 0, "B's committed use keeps it"
    assert _exists(store, kind, key)
    assert _uses_of(store, key) == [FIRST, SECOND]
    if kind == INTENT_RECORD:
        assert len(store.read_history(key)) == 1, "its history kept with it"


@pytest.mark.postgres
@pytest.mark.parametrize("kind", [INTENT_RECORD, EFFECT_RECORD])
def test_twin_retention_deletes_a_record_a_replay_holds_and_the_replay_finds_it_absent(
    executions: SQLAlchemyExecutionStore, kind: str
) -> None:
    with sabotage(RETENTION_DELETES_WHAT_IT_LISTED):
        outcome = _replay_first(executions, kind)
    store, key = executions.store, outcome["key"]
    assert outcome["retention"].rows == 1, outcome
    assert outcome["replay"] == Reliance.ABSENT.value, outcome
    assert not _exists(store, kind, key), "deleted while B was handed its result"


# --- PostgreSQL, through the engine: the gateway counts -----------------------------------


@pytest.fixture
def shop(
    postgres_templates: TemplateFactory, clone_postgres: Callable[[TemplateDatabase], str]
) -> Iterator[World]:
    """An app on a PostgreSQL store, its virtual clock and its fake gateway."""
    clock = VirtualClock()
    gateway = FakeGateway(clock=clock)
    made = make_world(
        clone_postgres(postgres_templates("store", migrate)),
        clock=clock,
        gateway=gateway,
        published=[],
    )
    try:
        yield made
    finally:
        disarm_all()
        made.close()
        gateway.close()


def _click(world: World, execution_id: str) -> tuple[Any, Outcome | None]:
    """A delivery of ``execution_id`` charges order o-1 (its lease kept): what it got."""
    ctx = world.start(execution_id)
    result = ctx.outbound(world.call, {"amount": 1000, "order": "o-1"}, business_key="order:o-1")
    return result, ctx.last_outcome


def _first_click_paid_long_ago(world: World) -> tuple[str, str]:
    first, second = world.publish("o-1"), world.publish("o-1")
    ctx = world.start(first)
    ctx.outbound(world.call, {"amount": 1000, "order": "o-1"}, business_key="order:o-1")
    assert ctx.last_outcome is Outcome.SENT
    with ctx.fenced() as tx:
        world.agboss.executions.finish_in(tx, '{"json": "paid"}')
    ctx.settle_all_and_release()
    world.clock.advance(EIGHT_DAYS)
    return first, second


def _engine_retention(world: World) -> retention.RetentionResult:
    cutoff = world.agboss.store.now_ms() - world.agboss.settings.outbound_retention_ms
    return world.agboss.executions.delete_settled_intents_before(cutoff, 100)


def _second_click_held_before_its_reliance(world: World) -> dict[str, Any]:
    """B's delivery replays A's charge and stops at ``outbound.before-rely`` (K read and
    its use noted, in B's open transaction); retention runs; then B goes on, dies, and
    runs again."""
    first, second = _first_click_paid_long_ago(world)
    outcome: dict[str, Any] = {"first": first}
    with arm_pause(fault_points.OUTBOUND_BEFORE_RELY) as paused:
        replay = in_thread(lambda: _click(world, second), outcome, "replay")
        paused.wait_reached(DEADLINE_S)
        sweeper = in_thread(lambda: _engine_retention(world), outcome, "retention")
        _joined(sweeper)
    _joined(replay)
    world.die()  # B's worker is lost after its body got the result
    outcome["re-run"] = _click(world, second)
    return outcome


@pytest.mark.postgres
def test_a_second_click_held_before_its_reliance_keeps_the_charge_and_charges_once(
    shop: World,
) -> None:
    outcome = _second_click_held_before_its_reliance(shop)
    assert outcome["retention"].rows == 0, outcome
    assert outcome["replay"][1] is Outcome.REPLAYED, outcome
    assert outcome["re-run"][1] is Outcome.REPLAYED, outcome
    assert len(shop.intents(outcome["first"])) == 1
    assert len(shop.gateway.requests) == 1, "charged once, for two clicks"


@pytest.mark.postgres
def test_twin_the_second_click_replays_a_deleted_charge_and_its_re_run_charges_again(
    shop: World,
) -> None:
    with sabotage(RETENTION_DELETES_WHAT_IT_LISTED):
        outcome = _second_click_held_before_its_reliance(shop)
    assert outcome["retention"].rows == 1, outcome
    assert outcome["replay"][1] is Outcome.REPLAYED, "handed A's receipt (ABSENT)"
    assert shop.intents(outcome["first"]) == []
    assert outcome["re-run"][1] is Outcome.SENT, outcome
    assert len(shop.gateway.requests) == 2, "the order charged twice"


def _second_click_meets_retention(world: World, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Retention lists K and stops before deleting it; B's delivery charges meanwhile;
    then B dies and runs again."""
    first, second = _first_click_paid_long_ago(world)
    pause = _PausedRetention(monkeypatch)
    outcome: dict[str, Any] = {"first": first}
    engine: Engine = world.agboss.store.engine
    sweeper = in_thread(lambda: _engine_retention(world), outcome, "retention")
    assert pause.listed.wait(DEADLINE_S), "retention never listed"
    replay = in_thread(lambda: _click(world, second), outcome, "replay")
    wait_until(
        lambda: "replay" in outcome or waiting_backends(engine) >= 1,
        DEADLINE_S,
        message="the second click to end or wait",
    )
    outcome["replay waited"] = "replay" not in outcome
    pause.go_on.set()
    _joined(sweeper, replay)
    world.die()
    outcome["re-run"] = _click(world, second)
    return outcome


@pytest.mark.postgres
def test_a_second_click_that_meets_retention_sends_its_own_charge_never_a_deleted_one(
    shop: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """K is past its retention (design: A12): B may charge anew, but then it relies on its
    own charge only, and its re-run replays that one."""
    outcome = _second_click_meets_retention(shop, monkeypatch)
    assert outcome["replay waited"]
    assert outcome["retention"].rows == 1, outcome
    assert outcome["replay"][1] is Outcome.SENT, outcome
    assert outcome["re-run"][1] is Outcome.REPLAYED, outcome
    assert len(shop.gateway.requests) == 2


@pytest.mark.postgres
def test_twin_a_second_click_that_meets_retention_replays_a_deleted_charge_then_sends(
    shop: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    with sabotage(RETENTION_DELETES_WHAT_IT_LISTED):
        outcome = _second_click_meets_retention(shop, monkeypatch)
    assert not outcome["replay waited"]
    assert outcome["retention"].rows == 1, outcome
    assert outcome["replay"][1] is Outcome.REPLAYED, "handed A's receipt"
    assert outcome["re-run"][1] is Outcome.SENT, "then charged for itself"
    assert len(shop.gateway.requests) == 2


# --- SQLite: the two never overlap ----------------------------------------------------------


@pytest.fixture
def sqlite_executions(tmp_path: Path) -> Iterator[SQLAlchemyExecutionStore]:
    """The execution verbs on a migrated SQLite file of this test's own."""
    if "sqlite" not in services.selected_backends():
        pytest.skip(f"sqlite not in {services.BACKENDS_ENV_VAR}")
    url = sqlite_store_url(tmp_path)
    migrate(url)
    store = SQLAlchemyStore(url)
    yield SQLAlchemyExecutionStore(store)
    store.close()


def _impatient(store: SQLAlchemyStore) -> SQLAlchemyStore:
    """Another store on the same file that never waits for the write lock."""
    return SQLAlchemyStore(store.engine.url, engine_options={"sqlite_busy_timeout_ms": 0})


@pytest.mark.sqlite
def test_on_sqlite_retention_cannot_run_inside_a_replay(
    sqlite_executions: SQLAlchemyExecutionStore,
) -> None:
    store = sqlite_executions.store
    key, second = _settled_by_first(sqlite_executions, INTENT_RECORD)
    used, go_on = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}
    replay = in_thread(
        lambda: _replay(store, second, INTENT_RECORD, key, used=used, go_on=go_on),
        outcome,
        "replay",
    )
    assert used.wait(DEADLINE_S)
    impatient = _impatient(store)
    try:
        with pytest.raises(AGBossSignal):
            _retention(impatient, INTENT_RECORD)
    finally:
        impatient.close()
        go_on.set()
        _joined(replay)
    assert outcome["replay"] == Reliance.RELIED.value
    assert _retention(store, INTENT_RECORD).rows == 0, "B's use keeps it"
    assert _exists(store, INTENT_RECORD, key)


@pytest.mark.sqlite
def test_on_sqlite_a_replay_cannot_begin_inside_retention(
    sqlite_executions: SQLAlchemyExecutionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = sqlite_executions.store
    key, second = _settled_by_first(sqlite_executions, INTENT_RECORD)
    pause = _PausedRetention(monkeypatch)
    outcome: dict[str, Any] = {}
    sweeper = in_thread(lambda: _retention(store, INTENT_RECORD), outcome, "retention")
    assert pause.listed.wait(DEADLINE_S)
    impatient = _impatient(store)
    try:
        with pytest.raises(AGBossSignal):
            _replay(impatient, second, INTENT_RECORD, key)
    finally:
        impatient.close()
        pause.go_on.set()
        _joined(sweeper)
    assert outcome["retention"].rows == 1
    assert _replay(store, second, INTENT_RECORD, key) == "claimed"
