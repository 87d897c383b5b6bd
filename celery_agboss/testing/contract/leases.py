"""Contract cases of the lease: one owner, no revival, the database clock, renewals beside
a running fenced transaction (design: P1, R19, PS13, renewal)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from celery_agboss.core.store_protocol import EffectRecord, LeaseGrant, RenewOutcome, Store
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.contract.base import (
    JOIN_SECONDS,
    TTL_MS,
    StoreFactory,
    acquire,
    expire,
    is_fenced,
    new_holder,
    new_scope,
    open_stores,
    require,
    run_threads,
    write_effect,
)

# --- one owner (design: P1) ------------------------------------------------------


@dataclass
class AcquireRound:
    """One round of concurrent acquirers: who won, with which token."""

    grants: list[LeaseGrant]
    refused: int


def _acquire_round(stores: Sequence[Store], scope: str, number: int) -> AcquireRound:
    """Every store tries to acquire ``scope`` for a new holder, released by one barrier."""
    barrier = threading.Barrier(len(stores), timeout=JOIN_SECONDS)
    outcome = AcquireRound(grants=[], refused=0)
    lock = threading.Lock()

    def contend(store: Store) -> None:
        holder = new_holder()  # minted per delivery: never re-entrant
        barrier.wait()
        grant = store.acquire_lease(scope, holder, TTL_MS)
        with lock:
            if grant is None:
                outcome.refused += 1
            else:
                outcome.grants.append(grant)

    run_threads([functools.partial(contend, s) for s in stores], f"acquire-round-{number}")
    return outcome


def concurrent_acquire_rounds(
    factory: StoreFactory, *, acquirers: int = 20, rounds: int = 3
) -> list[AcquireRound]:
    """``acquirers`` threads (each its own store) race for one scope, released together;
    between rounds the winner's lease expires (even rounds) or is released (odd ones)."""
    clock = VirtualClock()
    scope = new_scope("race")
    results: list[AcquireRound] = []
    with open_stores(factory, acquirers, clock) as stores:
        for number in range(rounds):
            outcome = _acquire_round(stores, scope, number)
            results.append(outcome)
            if len(outcome.grants) == 1:
                if number % 2 == 0:
                    expire(clock)
                else:
                    stores[0].release_lease(outcome.grants[0].lease)
    return results


def check_one_winner_per_token(factory: StoreFactory) -> None:
    """Concurrent acquirers get one winner per round; tokens grow by one per take-over
    (design: P1)."""
    rounds = concurrent_acquire_rounds(factory)
    previous: int | None = None
    for number, outcome in enumerate(rounds):
        winners = [grant.lease for grant in outcome.grants]
        require(
            len(winners) == 1,
            "P1",
            f"round {number}: {len(winners)} acquirers won one scope at once: {winners}",
        )
        token = winners[0].token
        if previous is None:
            require(token >= 1, "P1", f"the first token is {token}, not a positive number")
        else:
            require(
                token == previous + 1,
                "P1",
                f"round {number}: a take-over got token {token} after {previous} (want +1)",
            )
            require(outcome.grants[0].took_over, "P1", "a take-over was not reported as one")
        previous = token


def check_acquire_is_never_reentrant(factory: StoreFactory) -> None:
    """A live lease refuses its own holder too (design: P1, trap 2): a second copy of one
    delivery on the same worker must not run the body."""
    clock = VirtualClock()
    with open_stores(factory, 1, clock) as (store,):
        scope = new_scope("reentrant")
        holder = new_holder()
        first = store.acquire_lease(scope, holder, TTL_MS)
        require(first is not None, "P1", "a free scope could not be acquired")
        again = store.acquire_lease(scope, holder, TTL_MS)
        require(again is None, "P1", f"a live lease was granted again to its holder: {again}")
        other = store.acquire_lease(scope, new_holder(), TTL_MS)
        require(other is None, "P1", f"a live lease was granted to another holder: {other}")


def check_take_over_fences_the_old_holder(factory: StoreFactory) -> None:
    """After a take-over the old token writes nothing, renews nothing, releases nothing
    (design: P1, P2)."""
    clock = VirtualClock()
    with open_stores(factory, 2, clock) as (old_store, new_store):
        scope = new_scope("takeover")
        old = acquire(old_store, scope)
        require(
            new_store.acquire_lease(scope, new_holder(), TTL_MS) is None,
            "P1",
            "a live lease was taken over",
        )
        expire(clock)
        state = new_store.read_lease(scope)
        require(
            state is not None and not state.live,
            "P1",
            f"a lease past its expiry on the database clock reads as live: {state}",
        )
        new = acquire(new_store, scope)
        require(new.token == old.token + 1, "P1", f"take-over token {new.token} after {old.token}")
        require(is_fenced(old_store, old), "P2", "a stale token opened a fenced transaction")
        require(
            old_store.renew_lease(old, TTL_MS) is None, "R19", "a stale token renewed the lease"
        )
        require(not old_store.release_lease(old), "P1", "a stale token released the new lease")
        state = new_store.read_lease(scope)
        require(
            state is not None and state.live and state.holder == new.holder,
            "P1",
            f"after a stale release the new holder's lease is not live: {state}",
        )
        written, record = write_effect(new_store, new, f"{scope}:effect", {"by": "new"})
        require(written and record.token == new.token, "P2", "the new holder could not write")


# --- renewals never revive (design: R19) -------------------------------------------


@dataclass(frozen=True)
class LateRenewal:
    """What a renewal sent after the lease expired (nobody took it over) got."""

    renew_result: int | None
    batch_outcome: RenewOutcome | None
    live_after: bool
    fenced_after: bool


def late_renewal(factory: StoreFactory) -> LateRenewal:
    """A holder renews after its lease expired on the database clock, no take-over between."""
    clock = VirtualClock()
    with open_stores(factory, 1, clock) as (store,):
        single = acquire(store, new_scope("late-renew"))
        batched = acquire(store, new_scope("late-renew-batch"))
        expire(clock)
        renewed = store.renew_lease(single, TTL_MS)
        outcomes = store.renew_leases([batched], TTL_MS)
        state = store.read_lease(single.scope)
        return LateRenewal(
            renew_result=renewed,
            batch_outcome=outcomes.get(batched),
            live_after=bool(state is not None and state.live),
            fenced_after=is_fenced(store, single),
        )


def check_late_renewal_is_refused(factory: StoreFactory) -> None:
    """A renewal after expiry is refused, even when nobody has taken the lease (design: R19)."""
    outcome = late_renewal(factory)
    require(outcome.renew_result is None, "R19", f"an expired lease was renewed: {outcome}")
    require(
        outcome.batch_outcome is RenewOutcome.LOST,
        "R19",
        f"a batch renewal of an expired lease said {outcome.batch_outcome}, not LOST",
    )
    require(not outcome.live_after, "R19", "an expired lease is live again after a renewal")
    require(outcome.fenced_after, "R19", "an expired lease still opens fenced transactions")


def check_live_renewal_extends_on_the_database_clock(factory: StoreFactory) -> None:
    """A renewal of a live lease moves its expiry to (database now + ttl)."""
    clock = VirtualClock()
    with open_stores(factory, 1, clock) as (store,):
        lease = acquire(store, new_scope("renew"))
        clock.advance(TTL_MS / 2000)
        before = store.now_ms()
        expires = store.renew_lease(lease, TTL_MS)
        after = store.now_ms()
        require(expires is not None, "P1", "a live lease could not be renewed")
        assert expires is not None
        require(
            before + TTL_MS <= expires <= after + TTL_MS,
            "PS13",
            f"renewed expiry {expires} is not database now + ttl ({before}..{after} + {TTL_MS})",
        )
        outcome = store.renew_leases([lease], TTL_MS)
        require(outcome.get(lease) is RenewOutcome.RENEWED, "P1", f"batch renewal: {outcome}")


# --- expiry by the database clock (design: PS13) -----------------------------------------


def check_expiry_is_decided_by_the_database_clock(factory: StoreFactory) -> None:
    """A lease lives exactly until its expiry on the database clock (design: PS13): no earlier
    take-over, fenced right after."""
    clock = VirtualClock()
    with open_stores(factory, 2, clock) as (holder_store, rival_store):
        scope = new_scope("db-clock")
        grant = holder_store.acquire_lease(scope, new_holder(), TTL_MS)
        require(grant is not None, "P1", "a free scope could not be acquired")
        assert grant is not None
        require(
            grant.expires_at_ms == grant.db_now_ms + TTL_MS,
            "PS13",
            f"expiry {grant.expires_at_ms} is not database now {grant.db_now_ms} + ttl",
        )
        clock.advance(TTL_MS / 1000 - 2)
        require(
            rival_store.acquire_lease(scope, new_holder(), TTL_MS) is None,
            "PS13",
            "a lease was taken over before its expiry on the database clock",
        )
        require(not is_fenced(holder_store, grant.lease), "PS13", "a live lease was fenced")
        # The fenced transaction just extended it: move past that extension too.
        expire(clock)
        require(is_fenced(holder_store, grant.lease), "PS13", "an expired lease wrote")
        taken = rival_store.acquire_lease(scope, new_holder(), TTL_MS)
        require(taken is not None, "PS13", "an expired lease could not be taken over")


# --- renewals beside a long fenced transaction -------------------------------------------------


def check_renewals_skip_a_row_locked_by_a_fenced_transaction(
    factory: StoreFactory, *, hold_seconds: float = 1.0
) -> None:
    """While one execution's fenced transaction is open, a batch renewal (design: renewal) of
    the process's leases renews the others and reports the locked one BUSY (never LOST) — or, on a
    backend with one write lock for the whole database (SQLite), waits its turn."""
    clock = VirtualClock()
    with open_stores(factory, 2, clock) as (worker_store, renewer_store):
        leases = [acquire(worker_store, new_scope(f"busy-{i}")) for i in range(3)]
        busy = leases[0]
        entered = threading.Event()
        finish = threading.Event()

        def long_effect() -> None:
            with worker_store.fenced(busy, TTL_MS) as tx:
                tx.insert_effect(
                    EffectRecord(
                        f"{busy.scope}:slow", busy.scope, "contract.slow", None, busy.token, 0
                    )
                )
                entered.set()
                finish.wait(JOIN_SECONDS)

        thread = threading.Thread(target=long_effect, name="contract-long-effect", daemon=True)
        thread.start()
        try:
            require(entered.wait(JOIN_SECONDS), "P1", "the long fenced transaction never began")
            timer = threading.Timer(hold_seconds, finish.set)
            timer.start()
            started = time.monotonic()
            outcomes = renewer_store.renew_leases(leases, TTL_MS)
            waited = time.monotonic() - started
            timer.cancel()
        finally:
            finish.set()
            thread.join(JOIN_SECONDS)
        for lease in leases[1:]:
            require(
                outcomes.get(lease) is RenewOutcome.RENEWED,
                "P1",
                f"a lease beside a fenced transaction was not renewed: {outcomes.get(lease)}",
            )
        require(
            outcomes.get(busy) in (RenewOutcome.BUSY, RenewOutcome.RENEWED),
            "P1",
            f"the lease of a running fenced transaction was reported {outcomes.get(busy)}",
        )
        if outcomes.get(busy) is RenewOutcome.BUSY:
            require(
                waited < hold_seconds,
                "P1",
                f"the renewal reported BUSY only after waiting {waited:.2f}s for the lock",
            )
        for lease in leases:
            state = renewer_store.read_lease(lease.scope)
            require(state is not None and state.live, "P1", f"a lease was lost: {state}")
