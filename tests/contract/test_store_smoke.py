"""A first pass over the store on every backend: lease, renew, fence, release.

The full contract (concurrent acquirers, PS4, PS13, R19, PS14, migrations) lives
in the other files of this folder; this one only shows the verbs work end to end.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import exc as sa_exc
from sqlalchemy import text

from celery_agboss.core import sabotage
from celery_agboss.core.fault_points import FENCED_BEFORE_BEGIN
from celery_agboss.core.protections import (
    EXPIRY_BY_CALLER_CLOCK,
    LEASE_CHECK_IN_SEPARATE_ROUND_TRIP,
    RENEW_REVIVES_EXPIRED_LEASE,
)
from celery_agboss.core.store_protocol import (
    EffectRecord,
    IntentGuard,
    IntentStatus,
    IntentUpdate,
    LeaseRef,
    NewIntent,
    RenewOutcome,
)
from celery_agboss.errors import (
    CommitInsideFencedEffectError,
    ConfigurationError,
    ExecutionFencedError,
    StoreLockTimeoutError,
    StoreUnavailableError,
)
from celery_agboss.store.databases import create_store_engine
from celery_agboss.store.migrate import alembic_config, current_revision, migrate
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.fault_arming import arm_pause
from tests.contract.conftest import granted

TTL = 30_000


def test_a_lease_is_acquired_once_and_never_re_entrant(store: SQLAlchemyStore) -> None:
    grant = granted(store, "exec-1", TTL)
    assert grant.lease == LeaseRef("exec-1", "holder-a", 1)
    assert not grant.took_over
    assert grant.expires_at_ms - grant.db_now_ms == TTL
    assert store.acquire_lease("exec-1", "holder-a", TTL) is None
    assert store.acquire_lease("exec-1", "holder-b", TTL) is None


def test_an_expired_lease_is_taken_over_with_the_next_token_and_not_renewed(
    store: SQLAlchemyStore, db_clock: VirtualClock
) -> None:
    first = granted(store, "exec-1", TTL)
    db_clock.advance(31)
    assert store.renew_lease(first.lease, TTL) is None
    second = store.acquire_lease("exec-1", "holder-b", TTL)
    assert second is not None and second.took_over
    assert second.lease.token == 2
    state = store.read_lease("exec-1")
    assert state is not None and state.live and state.holder == "holder-b"


def test_renewals_extend_live_leases_and_report_lost_ones(
    store: SQLAlchemyStore, db_clock: VirtualClock
) -> None:
    mine = store.acquire_lease("exec-1", "holder-a", TTL)
    other = store.acquire_lease("exec-2", "holder-a", 1_000)
    assert mine is not None and other is not None
    db_clock.advance(2)
    outcome = store.renew_leases([mine.lease, other.lease], TTL)
    assert outcome == {mine.lease: RenewOutcome.RENEWED, other.lease: RenewOutcome.LOST}
    renewed = store.read_lease("exec-1")
    assert renewed is not None and renewed.expires_at_ms > mine.expires_at_ms


def test_a_released_lease_is_taken_over_and_the_old_holder_is_fenced(
    store: SQLAlchemyStore,
) -> None:
    first = granted(store, "exec-1", TTL)
    assert store.release_lease(first.lease)
    assert not store.release_lease(first.lease)
    second = store.acquire_lease("exec-1", "holder-b", TTL)
    assert second is not None and second.lease.token == 2
    with pytest.raises(ExecutionFencedError), store.fenced(first.lease, TTL):
        pytest.fail("a fenced transaction opened for a released lease")


def test_a_fenced_transaction_extends_the_lease_and_commits_its_writes(
    store: SQLAlchemyStore, db_clock: VirtualClock
) -> None:
    grant = granted(store, "exec-1", TTL)
    db_clock.advance(20)
    with store.fenced(grant.lease, TTL) as tx:
        assert tx.expires_at_ms == tx.now_ms + TTL
        intent = NewIntent("k-1", "exec-1", "stripe.charge", None, "fp", {"amount": 1}, grant.lease)
        assert tx.insert_intent(intent)
        assert not tx.insert_intent(intent)
        assert tx.insert_effect(EffectRecord("e-1", "exec-1", "mark-paid", {"ok": True}, 1, 0))
    db_clock.advance(20)  # 40 s after acquiring: alive only thanks to the extension
    state = store.read_lease("exec-1")
    assert state is not None and state.live
    record = store.read_intent("k-1")
    assert record is not None and record.status is IntentStatus.PENDING and record.owner_live
    effect = store.read_effect("e-1")
    assert effect is not None and effect.result == {"ok": True}


def test_a_compare_and_set_matches_its_full_guard_once(store: SQLAlchemyStore) -> None:
    grant = granted(store, "exec-1", TTL)
    settle = IntentUpdate(status=IntentStatus.COMPLETED, result={"id": "ch_1"}, complete=True)
    with store.fenced(grant.lease, TTL) as tx:
        tx.insert_intent(NewIntent("k-1", "exec-1", "stripe.charge", None, "fp", {}, grant.lease))
        guard = IntentGuard(IntentStatus.PENDING, 1, grant.lease)
        assert tx.update_intent("k-1", guard, settle)
        assert not tx.update_intent("k-1", guard, settle)
    record = store.read_intent("k-1")
    assert record is not None
    assert record.status is IntentStatus.COMPLETED and record.result == {"id": "ch_1"}
    assert record.completed_at_ms is not None


def test_an_exception_in_a_fenced_transaction_rolls_it_back(store: SQLAlchemyStore) -> None:
    grant = granted(store, "exec-1", TTL)

    class Boom(Exception):
        pass

    with pytest.raises(Boom), store.fenced(grant.lease, TTL) as tx:
        tx.insert_effect(EffectRecord("e-1", "exec-1", "mark-paid", 1, 1, 0))
        raise Boom()
    assert store.read_effect("e-1") is None


def test_a_commit_from_inside_a_fenced_transaction_is_refused_and_nothing_commits(
    store: SQLAlchemyStore,
) -> None:
    grant = granted(store, "exec-1", TTL)
    with pytest.raises(CommitInsideFencedEffectError), store.fenced(grant.lease, TTL) as tx:
        tx.insert_effect(EffectRecord("e-1", "exec-1", "mark-paid", 1, 1, 0))
        tx.connection.commit()
    assert store.read_effect("e-1") is None
    with store.fenced(grant.lease, TTL) as tx:  # the store is still usable
        assert tx.read_effect("e-1") is None


def test_a_lock_held_past_the_timeout_is_a_store_lock_timeout(
    store: SQLAlchemyStore, store_url: str, store_backend: str
) -> None:
    grant = granted(store, "exec-1", TTL)
    impatient = SQLAlchemyStore(create_store_engine(store_url, sqlite_busy_timeout_ms=200))
    try:
        # The first holds the lease row (and, on SQLite, the database's write lock).
        with (
            store.fenced(grant.lease, TTL),
            pytest.raises(StoreLockTimeoutError),
            impatient.fenced(grant.lease, 400),
        ):
            pytest.fail("a second fenced transaction got the locked lease row")
    finally:
        impatient.engine.dispose()


def test_an_unreachable_database_is_store_unavailable() -> None:
    with SQLAlchemyStore("postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=2") as down:
        with pytest.raises(StoreUnavailableError):
            down.acquire_lease("exec-1", "holder-a", TTL)
        with pytest.raises(StoreUnavailableError), down.transaction():
            pytest.fail("a transaction began on an unreachable database")


@pytest.mark.parametrize("url", ["sqlite:///relative/agboss.db", "sqlite://", "sqlite:///:memory:"])
def test_a_sqlite_store_needs_an_absolute_path(url: str) -> None:
    with pytest.raises(ConfigurationError, match=r"agboss_database_url.*absolute path"):
        SQLAlchemyStore(url)


def test_an_application_error_inside_a_transaction_stays_the_applications(
    store: SQLAlchemyStore,
) -> None:
    grant = granted(store, "exec-1", TTL)
    with pytest.raises(sa_exc.DBAPIError), store.fenced(grant.lease, TTL) as tx:
        tx.connection.execute(text("SELECT * FROM no_such_table_of_the_app"))


def test_migrating_twice_changes_nothing(store_url: str) -> None:
    migrate(store_url)
    migrate(store_url)
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None and current_revision(store_url) == head


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_uses_connections_of_its_own(store: SQLAlchemyStore) -> None:
    grant = store.acquire_lease("exec-1", "holder-a", TTL)  # the parent's pool has a connection
    assert grant is not None
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            child_grant = store.acquire_lease("exec-2", "holder-child", TTL)
            code = 0 if child_grant is not None else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with store.fenced(grant.lease, TTL) as tx:  # the parent's connection still works
        assert tx.read_lease("exec-2") is not None


# --- the store's sabotage switches do remove their protection --------------------------


def test_with_r19s_protection_off_a_renewal_revives_an_expired_lease(
    store: SQLAlchemyStore, db_clock: VirtualClock
) -> None:
    grant = granted(store, "exec-1", TTL)
    db_clock.advance(31)
    with sabotage.switched_off(RENEW_REVIVES_EXPIRED_LEASE):
        assert store.renew_lease(grant.lease, TTL) is not None  # the harm
        assert store.renew_leases([grant.lease], TTL) == {grant.lease: RenewOutcome.RENEWED}
    db_clock.advance(31)
    assert store.renew_lease(grant.lease, TTL) is None


def test_with_ps13s_protection_off_a_caller_clock_ahead_takes_over_a_live_lease(
    store: SQLAlchemyStore, store_factory: Callable[..., SQLAlchemyStore]
) -> None:
    granted(store, "exec-1", TTL)
    rival = store_factory()
    rival.caller_clock_skew_ms = 60_000
    assert rival.acquire_lease("exec-1", "holder-b", TTL) is None  # the database clock decides
    with sabotage.switched_off(EXPIRY_BY_CALLER_CLOCK):
        stolen = rival.acquire_lease("exec-1", "holder-b", TTL)
    assert stolen is not None and stolen.lease.token == 2  # the harm: a live lease taken


@pytest.mark.parametrize("protected", [True, False], ids=["protected", "sabotaged"])
def test_ps4_a_zombie_paused_at_its_fence_writes_nothing_after_a_take_over(
    store: SQLAlchemyStore,
    store_factory: Callable[..., SQLAlchemyStore],
    db_clock: VirtualClock,
    protected: bool,
) -> None:
    zombie = store.acquire_lease("exec-1", "holder-zombie", TTL)
    assert zombie is not None
    outcome: list[BaseException | None] = []

    def zombie_writes() -> None:
        try:
            with store.fenced(zombie.lease, TTL) as tx:
                tx.insert_effect(EffectRecord("e-1", "exec-1", "zombie", 1, zombie.lease.token, 0))
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    switches = () if protected else (LEASE_CHECK_IN_SEPARATE_ROUND_TRIP,)
    with sabotage.switched_off(*switches), arm_pause(FENCED_BEFORE_BEGIN) as paused:
        thread = threading.Thread(target=zombie_writes, daemon=True)
        thread.start()
        paused.wait_reached()
        db_clock.advance(TTL / 1000 + 1)
        taker = store_factory().acquire_lease("exec-1", "holder-new", TTL)
        assert taker is not None
        paused.release()
        thread.join(10)
    assert not thread.is_alive()
    if protected:
        assert isinstance(outcome[0], ExecutionFencedError)
        assert store.read_effect("e-1") is None
    else:
        assert outcome == [None]  # the harm: written under a lease someone else holds
        assert store.read_effect("e-1") is not None
