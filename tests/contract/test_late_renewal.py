"""R19: a renewal after expiry is refused, even when nobody has taken the lease over.

The store half is ``late_renewal_is_refused`` in the contract catalogue; here the
holder's half (a renewer that finds its lease lost stops every later write and send)
and the sabotage twin.
"""

from __future__ import annotations

import uuid

import pytest

from celery_agboss.core.lease import LeaseRenewer, acquire
from celery_agboss.core.protections import RENEW_REVIVES_EXPIRED_LEASE
from celery_agboss.core.store_protocol import RenewOutcome
from celery_agboss.errors import ExecutionFencedError
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.contract.base import TTL_MS, write_effect
from celery_agboss.testing.contract.leases import late_renewal
from celery_agboss.testing.switches import sabotage
from tests.contract.conftest import StoreFactory


def test_a_renewer_that_finds_its_lease_expired_stops_the_holder_for_good(
    store_factory: StoreFactory, db_clock: VirtualClock
) -> None:
    store = store_factory()
    handle = acquire(store, f"r19:{uuid.uuid4().hex}", ttl_ms=TTL_MS)
    assert handle is not None
    renewer = LeaseRenewer(store)
    try:
        db_clock.advance(TTL_MS / 1000 + 1)  # expired on the database clock; nobody took it
        outcome = renewer.renew_now([handle])
        assert outcome == {handle.ref: RenewOutcome.LOST}
        assert handle.lost_reason is not None
        with pytest.raises(ExecutionFencedError):
            handle.assert_held()
        # Its own clocks still say "time left": the lost renewal decides, not them.
        assert handle.seconds_left() > 0
        state = store.read_lease(handle.ref.scope)
        assert state is not None and not state.live
    finally:
        renewer.stop()


def test_with_renewals_reviving_expired_leases_a_holder_comes_back_after_expiry(
    store_factory: StoreFactory,
) -> None:
    """Sabotage twin: the lease the database had declared expired is live again, and the
    revived holder writes under it."""
    with sabotage(RENEW_REVIVES_EXPIRED_LEASE):
        outcome = late_renewal(store_factory)
    assert outcome.renew_result is not None
    assert outcome.batch_outcome is RenewOutcome.RENEWED
    assert outcome.live_after
    assert not outcome.fenced_after


def test_a_revived_lease_lets_a_holder_write_after_the_database_said_expired(
    store_factory: StoreFactory, db_clock: VirtualClock
) -> None:
    """The harm of the twin, end to end: a sweeper saw the lease expired (and would
    re-drive the execution), yet the old holder's late renewal brings it back and its
    write goes in — the sweeper's fresh delivery is then refused the lease."""
    store, sweeper = store_factory(), store_factory()
    scope = f"r19:{uuid.uuid4().hex}"
    handle = acquire(store, scope, ttl_ms=TTL_MS)
    assert handle is not None
    db_clock.advance(TTL_MS / 1000 + 1)
    seen = sweeper.read_lease(scope)
    assert seen is not None and not seen.live  # the sweeper acts on "expired"
    with sabotage(RENEW_REVIVES_EXPIRED_LEASE):
        assert store.renew_lease(handle.ref, TTL_MS) is not None
    written, _ = write_effect(store, handle.ref, f"{scope}:effect", {"by": "revived"})
    assert written
    assert sweeper.acquire_lease(scope, uuid.uuid4().hex, TTL_MS) is None
