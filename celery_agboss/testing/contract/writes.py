"""Contract cases of fenced writes: the zombie's write (design: PS4), a commit whose answer is lost
(design: PS14), two executions inserting one key at once (design: P2, P3)."""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

from celery_agboss.core import fault_points
from celery_agboss.core.store_protocol import JSON, EffectRecord, IntentStatus, LeaseRef
from celery_agboss.errors import ExecutionFencedError, StoreUnavailableError
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.contract.base import (
    JOIN_SECONDS,
    TTL_MS,
    StoreFactory,
    acquire,
    expire,
    new_intent,
    new_scope,
    open_stores,
    require,
    run_threads,
    write_effect,
)
from celery_agboss.testing.fault_arming import arm_pause, arm_raise

# --- the zombie reaches the write first (design: PS4) ----------------------------------


@dataclass(frozen=True)
class ZombieRace:
    """A zombie's fenced write released at the commit boundary after a take-over."""

    zombie: LeaseRef
    successor: LeaseRef
    zombie_error: BaseException | None
    zombie_wrote: bool
    successor_wrote: bool
    stored: EffectRecord | None


def zombie_race(
    factory: StoreFactory, *, point: str = fault_points.FENCED_BEFORE_BEGIN
) -> ZombieRace:
    """The zombie holder's fenced write pauses at ``point``; meanwhile its lease expires on
    the database clock and a new holder takes over; then the zombie goes on, then the
    new holder writes the same effect (record-and-replay)."""
    clock = VirtualClock()
    with open_stores(factory, 2, clock) as (zombie_store, new_store):
        scope = new_scope("zombie")
        key = f"{scope}:effect"
        zombie = acquire(zombie_store, scope)
        outcome: dict[str, object] = {}
        pause = arm_pause(point, only={"holder": zombie.holder}, timeout=JOIN_SECONDS)

        def zombie_writes() -> None:
            try:
                outcome["wrote"] = write_effect(zombie_store, zombie, key, {"by": "zombie"})[0]
            except BaseException as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=zombie_writes, name="contract-zombie", daemon=True)
        thread.start()
        try:
            pause.wait_reached(JOIN_SECONDS)
            expire(clock)
            successor = acquire(new_store, scope)
        finally:
            pause.release()
            thread.join(JOIN_SECONDS)
        require(not thread.is_alive(), "PS4", "the zombie's write hangs after its release")
        successor_wrote, _ = write_effect(new_store, successor, key, {"by": "successor"})
        error = outcome.get("error")
        return ZombieRace(
            zombie=zombie,
            successor=successor,
            zombie_error=error if isinstance(error, BaseException) else None,
            zombie_wrote=bool(outcome.get("wrote")),
            successor_wrote=successor_wrote,
            stored=new_store.read_effect(key),
        )


def check_zombie_write_is_fenced(factory: StoreFactory) -> None:
    """A zombie's write landing after a take-over is refused in its own transaction
    (design: PS4, P2); nothing of it is stored and the new holder's write stands."""
    race = zombie_race(factory)
    require(
        isinstance(race.zombie_error, ExecutionFencedError),
        "PS4",
        f"the zombie's write was not fenced: error={race.zombie_error!r}, "
        f"wrote={race.zombie_wrote}",
    )
    require(not race.zombie_wrote, "PS4", "the zombie's write was stored")
    require(race.successor_wrote, "PS4", "the new holder replayed instead of writing")
    stored = race.stored
    require(
        stored is not None
        and stored.token == race.successor.token
        and stored.result == {"by": "successor"},
        "PS4",
        f"the stored effect is not the new holder's: {stored}",
    )


# --- a commit whose answer is lost (design: PS14) --------------------------------------------


@dataclass(frozen=True)
class CommitCrash:
    """A fenced write that raised at a commit boundary, and what the retry learned."""

    error: BaseException | None
    found_on_retry: bool
    retry_wrote: bool
    stored: EffectRecord | None


def commit_crash(factory: StoreFactory, point: str) -> CommitCrash:
    """A fenced write raises at ``point`` (``FENCED_BEFORE_COMMIT`` or ``FENCED_AFTER_COMMIT``);
    the caller retries and asks the store what happened."""
    clock = VirtualClock()
    with open_stores(factory, 1, clock) as (store,):
        scope = new_scope("commit-crash")
        key = f"{scope}:effect"
        lease = acquire(store, scope)
        # What the caller of a lost commit sees: the store's own "may or may not have
        # committed" error, exactly as a cut connection produces it.
        lost = StoreUnavailableError(f"connection lost at {point}")
        arm_raise(point, lost, only={"holder": lease.holder})
        error: BaseException | None = None
        try:
            write_effect(store, lease, key, {"attempt": 1})
        except StoreUnavailableError as exc:
            error = exc
        found = store.read_effect(key) is not None
        retry_wrote, stored = write_effect(store, lease, key, {"attempt": 2})
        return CommitCrash(
            error=error, found_on_retry=found, retry_wrote=retry_wrote, stored=stored
        )


def check_a_crash_before_commit_commits_nothing(factory: StoreFactory) -> None:
    """A write that died before COMMIT is absent; the retry writes it, once (design: PS14, P2)."""
    crash = commit_crash(factory, fault_points.FENCED_BEFORE_COMMIT)
    require(crash.error is not None, "PS14", "the fault before COMMIT did not fire")
    require(not crash.found_on_retry, "PS14", "a write that died before COMMIT was stored")
    require(
        crash.retry_wrote and crash.stored is not None and crash.stored.result == {"attempt": 2},
        "PS14",
        f"the retry did not write the effect once: {crash}",
    )


def check_a_crash_after_commit_is_found_on_retry(factory: StoreFactory) -> None:
    """A write that committed but whose caller saw an error is found and replayed
    (design: PS14, P2)."""
    crash = commit_crash(factory, fault_points.FENCED_AFTER_COMMIT)
    require(crash.error is not None, "PS14", "the fault after COMMIT did not fire")
    require(crash.found_on_retry, "PS14", "a committed write is missing after the error")
    require(
        not crash.retry_wrote
        and crash.stored is not None
        and crash.stored.result == {"attempt": 1},
        "PS14",
        f"the retry wrote the effect a second time: {crash}",
    )


# --- concurrent inserts of one key --------------------------------------------------------


def check_one_key_inserted_at_once_has_one_winner(factory: StoreFactory) -> None:
    """Two executions insert one intent key and one effect key at the same moment
    (design: P2, P3, PS8): one insert wins, the other reads the winner's row; no unique
    violation escapes."""
    clock = VirtualClock()
    racers = 2
    with open_stores(factory, racers, clock) as stores:
        intent_key = f"{new_scope('insert-race')}:charge"
        effect_key = f"{new_scope('insert-race')}:effect"
        leases = [acquire(store, new_scope(f"insert-race-{i}")) for i, store in enumerate(stores)]
        barrier = threading.Barrier(racers, timeout=JOIN_SECONDS)
        seen: dict[str, tuple[bool, str | None, bool, JSON]] = {}
        lock = threading.Lock()

        def insert(index: int) -> None:
            store, lease = stores[index], leases[index]
            marker = f"racer-{index}"
            barrier.wait()
            with store.fenced(lease, TTL_MS) as tx:
                inserted = tx.insert_intent(new_intent(intent_key, lease, marker))
                row = tx.read_intent(intent_key)
            effect_written, effect = write_effect(store, lease, effect_key, {"by": marker})
            with lock:
                seen[marker] = (
                    inserted,
                    row.fingerprint if row is not None else None,
                    effect_written,
                    effect.result,
                )

        run_threads([functools.partial(insert, i) for i in range(racers)], "insert-race")
        winners = [m for m, (inserted, *_rest) in seen.items() if inserted]
        require(len(winners) == 1, "P3", f"intent inserts that won: {winners} (want one)")
        for marker, (_, fingerprint, _, _) in seen.items():
            require(
                fingerprint == winners[0],
                "P3",
                f"{marker} read intent {fingerprint!r}, not the winner's {winners[0]!r}",
            )
        effect_winners = [m for m, (_, _, written, _) in seen.items() if written]
        require(len(effect_winners) == 1, "P2", f"effect writes that won: {effect_winners}")
        for marker, (*_rest, result) in seen.items():
            require(
                result == {"by": effect_winners[0]},
                "P2",
                f"{marker} was handed {result}, not the winner's effect",
            )
        stored = stores[0].read_intent(intent_key)
        require(
            stored is not None and stored.status is IntentStatus.PENDING and stored.attempt == 1,
            "P3",
            f"the inserted intent is not PENDING attempt 1: {stored}",
        )
