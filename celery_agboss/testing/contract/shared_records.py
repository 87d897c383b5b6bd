"""Contract case of a record several executions share: its row lock (``lock_shared``).

Two ends of one shared step's undo each write their mark, then judge the step from every
mark. Unless the second waits for the first's commit before it reads, each misses the
other's mark and the step stays claimed for ever (design: compensated step). A backend
whose writers run one at a time (SQLite) keeps this without a lock: its second
transaction already waits at its begin, which the case accepts.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from celery_agboss.core.store_protocol import EFFECT_RECORD, INTENT_RECORD, EffectRecord, Store
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.contract.base import (
    JOIN_SECONDS,
    StoreFactory,
    acquire,
    new_intent,
    new_scope,
    open_stores,
    require,
    write_effect,
)

GUARANTEE = "compensated step"

HOLD_SECONDS = 0.3
"""How long the second end must stay behind the first's open lock, at each of its steps."""


@dataclass(frozen=True)
class SharedLockRace:
    """Two ends locking one shared record: what the second did while the first was open."""

    kind: str
    second_began_early: bool  # its transaction began before the first committed
    second_passed_early: bool  # its lock_shared returned before the first committed
    second_finished: bool  # it ended within the deadline once the first committed
    second_error: BaseException | None
    first_mark_seen: bool  # the second end's judgement read the first end's mark
    own_mark_seen: bool  # ... and its own


def _recorded(store: Store, kind: str) -> tuple[str, int]:
    """A committed shared record of ``kind``: its key, and a token for the marks."""
    lease = acquire(store, new_scope(f"shared-lock-{kind}"))
    key = f"{lease.scope}:step"
    if kind == INTENT_RECORD:
        with store.transaction() as tx:
            inserted = tx.insert_intent(new_intent(key, lease))
        require(inserted, "P3", f"a new intent {key!r} was not inserted")
    else:
        write_effect(store, lease, key, {"step": "charged"})
    return key, lease.token


def _mark(key: str, token: int) -> EffectRecord:
    return EffectRecord(key, key, "contract.undo-mark", {"undone": True}, token, 0)


def two_ends_lock_one_record(
    factory: StoreFactory, kind: str, *, hold_seconds: float = HOLD_SECONDS
) -> SharedLockRace:
    """The first end writes its mark and locks the record; the second (a thread, its own
    store) writes its mark, locks the record and reads both marks. The first commits only
    after the second had ``hold_seconds`` to begin and as long again to pass its lock; a
    second that got past (a lock that holds nothing) reads before the first commits, so
    what it read is what a lock-less backend lets it judge by, every run."""
    with open_stores(factory, 2, VirtualClock()) as (first_store, second_store):
        key, token = _recorded(second_store, kind)  # the second store's pool is warm
        first_mark, second_mark = f"{key}:undo-first", f"{key}:undo-second"
        began, passed, read = threading.Event(), threading.Event(), threading.Event()
        seen: dict[str, bool] = {}
        errors: list[BaseException] = []

        def second_end() -> None:
            try:
                with second_store.transaction() as tx:
                    began.set()
                    tx.insert_effect(_mark(second_mark, token))
                    tx.lock_shared(kind, key)
                    passed.set()
                    for mark in (first_mark, second_mark):
                        seen[mark] = tx.read_effect(mark) is not None
                    read.set()
            except BaseException as exc:  # judged by the caller
                errors.append(exc)

        thread = threading.Thread(target=second_end, name="contract-second-end", daemon=True)
        try:
            with first_store.transaction() as tx:
                tx.insert_effect(_mark(first_mark, token))
                tx.lock_shared(kind, key)
                thread.start()
                began.wait(hold_seconds)
                began_early = began.is_set()
                passed_early = passed.wait(hold_seconds)
                if passed_early:  # no lock held it: its reads come before this commit
                    read.wait(JOIN_SECONDS)
        finally:
            if thread.ident is not None:
                thread.join(JOIN_SECONDS)
        return SharedLockRace(
            kind=kind,
            second_began_early=began_early,
            second_passed_early=passed_early,
            second_finished=not thread.is_alive(),
            second_error=errors[0] if errors else None,
            first_mark_seen=seen.get(first_mark, False),
            own_mark_seen=seen.get(second_mark, False),
        )


def check_a_shared_record_lock_holds_a_second_end_until_the_first_commits(
    factory: StoreFactory,
) -> None:
    """On an intent's and on a fenced effect's record: a second transaction's
    ``lock_shared`` returns only once the first's ended, and then reads the mark the first
    committed (design: compensated step). Left empty on a backend with concurrent writers,
    two undos finishing at once each judge the step without the other's mark."""
    for kind in (INTENT_RECORD, EFFECT_RECORD):
        race = two_ends_lock_one_record(factory, kind)
        require(
            not race.second_passed_early,
            GUARANTEE,
            f"{kind} record: a second end got past lock_shared while the first held it",
        )
        require(
            race.second_finished,
            GUARANTEE,
            f"{kind} record: the second end still waits {JOIN_SECONDS:g}s after the first "
            "committed",
        )
        if race.second_error is not None:
            raise race.second_error
        require(
            race.first_mark_seen and race.own_mark_seen,
            GUARANTEE,
            f"{kind} record: after its lock the second end read the first's mark "
            f"{race.first_mark_seen}, its own {race.own_mark_seen} (want both)",
        )
