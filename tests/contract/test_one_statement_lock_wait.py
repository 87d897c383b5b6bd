"""The one-statement settle waits on a lease row another transaction holds, and sees
what that transaction committed (design: one round trip per state change).

A take-over holds the lease row locked (its token bumped, not yet committed) when the
holder's settle is sent. The statement's fence waits for that row; once the take-over
commits, PostgreSQL re-reads the row it waited for, finds another token, and the whole
statement writes nothing: the settle is refused as fenced, the intent stays PENDING
with its one history row. Its twin drops the statement's join to the fence: the zombie
then completes the intent under the new holder's lease.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from celery_agboss.core.protections import ONE_STATEMENT_WITHOUT_FENCE
from celery_agboss.core.store_protocol import (
    IntentStatus,
    IntentTransition,
    LeaseRef,
    OneStatementTransition,
)
from celery_agboss.errors import ExecutionFencedError
from celery_agboss.store.migrate import migrate
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.testing.switches import sabotage
from tests.conftest import TemplateFactory
from tests.contract.one_statement_world import TTL_MS, claimed_settle
from tests.support.databases import TemplateDatabase
from tests.support.lock_waits import during_a_change

pytestmark = pytest.mark.postgres


@pytest.fixture
def store(
    postgres_templates: TemplateFactory, clone_postgres: Callable[[TemplateDatabase], str]
) -> Iterator[SQLAlchemyStore]:
    opened = SQLAlchemyStore(clone_postgres(postgres_templates("store", migrate)))
    yield opened
    opened.close()


def _claimed(store: SQLAlchemyStore) -> tuple[LeaseRef, IntentTransition]:
    grant = store.acquire_lease("lock-wait", "zombie", TTL_MS)
    assert grant is not None
    return grant.lease, claimed_settle(store, grant.lease)


def _settle_during_a_take_over(
    store: SQLAlchemyStore,
) -> tuple[OneStatementTransition | BaseException | None, IntentStatus]:
    """The zombie's settle sent while a take-over holds the lease row; the take-over
    commits once the settle waits for it. What the settle returned (or raised), and the
    intent's status after both."""
    lease, change = _claimed(store)
    outcome = during_a_change(
        store.engine,
        "UPDATE agboss_leases SET holder = 'successor', token = token + 1 WHERE scope = :scope",
        {"scope": lease.scope},
        lambda: store.transition_in_one(lease, TTL_MS, change),
    )
    record = store.read_intent(change.key)
    assert record is not None
    return outcome, record.status


def test_a_take_over_committed_during_the_settles_lock_wait_fences_it(
    store: SQLAlchemyStore,
) -> None:
    outcome, status = _settle_during_a_take_over(store)
    assert isinstance(outcome, ExecutionFencedError), outcome
    assert status is IntentStatus.PENDING
    assert len(store.read_history("default:t:lock-wait:shop.charge")) == 1


def test_without_the_fence_in_the_statement_the_zombie_completes_the_intent(
    store: SQLAlchemyStore,
) -> None:
    """Sabotage twin: the compare-and-set no longer joins the fence's row."""
    with sabotage(ONE_STATEMENT_WITHOUT_FENCE):
        _, status = _settle_during_a_take_over(store)
    assert status is IntentStatus.COMPLETED
