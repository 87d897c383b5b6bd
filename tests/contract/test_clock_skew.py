"""PS13 (design: P1): clocks that run ahead, behind, or are stepped mid-lease.

Who holds a lease is decided on the database clock alone; a holder stops trusting
its lease by its own deadline — the TTL counted from when the acquire or renewal was
sent, on its monotonic *and* its wall clock, minus a 1 s margin — whichever passes
first. Each guarantee has a sabotage twin that shows two live holders, or a holder
acting past its deadline.
"""

from __future__ import annotations

import uuid

import pytest

from celery_agboss.core.lease import SAFETY_MARGIN_SECONDS, LeaseHandle, LeaseRenewer, acquire
from celery_agboss.core.protections import EXPIRY_BY_CALLER_CLOCK, HOLDER_TRUSTS_LEASE_FOREVER
from celery_agboss.core.store_protocol import RenewOutcome
from celery_agboss.errors import ExecutionFencedError
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.testing.clock import SkewedHolderClock, VirtualClock
from celery_agboss.testing.contract.base import write_effect
from celery_agboss.testing.switches import sabotage
from tests.contract.conftest import StoreFactory

TTL_MS = 10_000
TTL_S = TTL_MS / 1000
AHEAD_MS = 60_000


def _scope() -> str:
    return f"ps13:{uuid.uuid4().hex}"


def _acquire(store: SQLAlchemyStore, scope: str, clock: SkewedHolderClock) -> LeaseHandle:
    handle = acquire(store, scope, ttl_ms=TTL_MS, clock=clock)
    assert handle is not None
    return handle


def _trusting(*handles: LeaseHandle) -> list[LeaseHandle]:
    return [handle for handle in handles if handle.is_trusted()]


# --- the database decides ----------------------------------------------------------------


def test_an_acquirer_whose_clock_runs_ahead_cannot_take_a_live_lease(
    store_factory: StoreFactory,
) -> None:
    holder_store, ahead_store = store_factory(), store_factory()
    ahead_store.caller_clock_skew_ms = AHEAD_MS  # this pod's clock is a minute fast
    scope = _scope()
    holder = _acquire(holder_store, scope, SkewedHolderClock())
    ahead = acquire(ahead_store, scope, ttl_ms=TTL_MS, clock=SkewedHolderClock(wall_skew=60))
    assert ahead is None
    state = holder_store.read_lease(scope)
    assert state is not None and state.live and state.holder == holder.ref.holder
    assert _trusting(holder) == [holder]


def test_with_expiry_decided_by_the_callers_clock_an_ahead_pod_takes_a_live_lease(
    store_factory: StoreFactory,
) -> None:
    """Sabotage twin: the pod a minute ahead sees the live lease as expired and takes it:
    two deliveries trust one lease, so both would send."""
    holder_store, ahead_store = store_factory(), store_factory()
    ahead_store.caller_clock_skew_ms = AHEAD_MS
    scope = _scope()
    with sabotage(EXPIRY_BY_CALLER_CLOCK):
        holder = _acquire(holder_store, scope, SkewedHolderClock())
        ahead = acquire(ahead_store, scope, ttl_ms=TTL_MS, clock=SkewedHolderClock(wall_skew=60))
    assert ahead is not None and ahead.ref.token == holder.ref.token + 1
    assert _trusting(holder, ahead) == [holder, ahead]  # two live holders: P1 broken


def test_a_holder_whose_clock_runs_behind_is_fenced_at_the_database_expiry(
    store_factory: StoreFactory, db_clock: VirtualClock
) -> None:
    store = store_factory()
    scope = _scope()
    slow = SkewedHolderClock(wall_skew=-30, mono_skew=-30)
    handle = _acquire(store, scope, slow)
    db_clock.advance(TTL_S + 1)  # the database's time passed; the slow holder saw none of it
    assert handle.is_trusted()  # its own clocks still say there is time
    with pytest.raises(ExecutionFencedError):
        write_effect(store, handle.ref, f"{scope}:effect", {"by": "slow"})
    assert store.read_effect(f"{scope}:effect") is None
    # Its next renewal finds the lease lost, and from then on it refuses by itself too.
    assert LeaseRenewer(store).renew_now([handle]) == {handle.ref: RenewOutcome.LOST}
    with pytest.raises(ExecutionFencedError):
        handle.assert_held()


# --- the holder's own deadline -------------------------------------------------------------


def test_a_holder_trusts_its_lease_until_ttl_minus_the_margin_on_its_own_clocks(
    store_factory: StoreFactory,
) -> None:
    store = store_factory()
    clock = SkewedHolderClock()
    handle = _acquire(store, _scope(), clock)
    clock.advance(TTL_S - SAFETY_MARGIN_SECONDS - 0.5)
    handle.assert_held()
    clock.advance(0.6)
    with pytest.raises(ExecutionFencedError):
        handle.assert_held()
    # The database still has the lease live: the holder stopped first, on its own.
    state = store.read_lease(handle.ref.scope)
    assert state is not None and state.live


def test_a_wall_clock_stepped_back_mid_lease_does_not_extend_the_trust(
    store_factory: StoreFactory,
) -> None:
    clock = SkewedHolderClock()
    handle = _acquire(store_factory(), _scope(), clock)
    clock.step_wall(-3600)  # NTP steps the wall clock an hour back
    clock.advance(TTL_S - SAFETY_MARGIN_SECONDS + 0.1)
    assert handle.seconds_left() < 0  # the monotonic deadline passed
    with pytest.raises(ExecutionFencedError):
        handle.assert_held()


def test_a_wall_clock_stepped_forward_mid_lease_ends_the_trust_early(
    store_factory: StoreFactory,
) -> None:
    clock = SkewedHolderClock()
    handle = _acquire(store_factory(), _scope(), clock)
    clock.step_wall(TTL_S)  # the monotonic clock barely moved; the wall clock jumped
    with pytest.raises(ExecutionFencedError):
        handle.assert_held()


def test_a_renewal_moves_the_deadline_from_when_it_was_sent(
    store_factory: StoreFactory, db_clock: VirtualClock
) -> None:
    store = store_factory()
    clock = SkewedHolderClock()
    handle = _acquire(store, _scope(), clock)
    clock.advance(TTL_S / 2)
    db_clock.advance(TTL_S / 2)
    assert LeaseRenewer(store).renew_now([handle]) == {handle.ref: RenewOutcome.RENEWED}
    clock.advance(TTL_S - SAFETY_MARGIN_SECONDS - 0.5)  # past the first deadline
    handle.assert_held()


def test_with_the_holder_trusting_its_lease_forever_it_acts_past_its_deadline(
    store_factory: StoreFactory, db_clock: VirtualClock
) -> None:
    """Sabotage twin: past its deadline on both clocks, and past the database's expiry
    after another holder took over, the old holder still believes it holds the lease."""
    store = store_factory()
    clock = SkewedHolderClock()
    scope = _scope()
    old = _acquire(store, scope, clock)
    clock.advance(TTL_S + 5)
    db_clock.advance(TTL_S + 5)
    new = _acquire(store_factory(), scope, SkewedHolderClock())
    with sabotage(HOLDER_TRUSTS_LEASE_FOREVER):
        old.assert_held()  # would go on to send: two holders act at once
        assert _trusting(old, new) == [old, new]
    with pytest.raises(ExecutionFencedError):
        old.assert_held()
