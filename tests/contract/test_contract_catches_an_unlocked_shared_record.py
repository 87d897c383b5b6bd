"""Sabotage twin of the contract's shared-record lock case: a custom backend whose
``lock_shared`` does nothing must fail it on PostgreSQL, where writers run side by side
and only that lock makes two undos' ends judge one step one after the other. On SQLite,
whose writers run one at a time, the same backend keeps the promise without it, as the
protocol allows. The control, the real store passing the case on both, is
``test_store_contract.py``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from celery_agboss.core.store_protocol import EFFECT_RECORD, INTENT_RECORD, Store
from celery_agboss.testing.contract import CONTRACT_CASES, ContractViolation, run_contract
from celery_agboss.testing.contract.shared_records import GUARANTEE, two_ends_lock_one_record
from tests.contract.conftest import StoreFactory

CASE = "a_shared_record_lock_holds_a_second_end_until_the_first_commits"
SLOW_READ_SECONDS = 0.05


class _UnlockedTransaction:
    """A transaction whose ``lock_shared`` returns at once, locking nothing."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def lock_shared(self, kind: str, record_key: str) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _SlowReadingTransaction(_UnlockedTransaction):
    """The same, on a loaded machine: each read of a record takes a while."""

    def read_effect(self, key: str) -> Any:
        time.sleep(SLOW_READ_SECONDS)
        return self.inner.read_effect(key)


class UnlockedSharedRecordStore:
    """A custom backend that left ``lock_shared`` empty; everything else is the real store."""

    transaction_type: type[_UnlockedTransaction] = _UnlockedTransaction

    def __init__(self, inner: Store) -> None:
        object.__setattr__(self, "inner", inner)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        with self.inner.transaction() as tx:
            yield self.transaction_type(tx)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.inner, name, value)  # clock_offset_source, as VirtualClock.attach sets it


class SlowUnlockedSharedRecordStore(UnlockedSharedRecordStore):
    transaction_type = _SlowReadingTransaction


def _unlocked(store_factory: StoreFactory, *, slow: bool = False) -> Any:
    def factory() -> Store:
        made = SlowUnlockedSharedRecordStore if slow else UnlockedSharedRecordStore
        return made(store_factory())

    return factory


def _case() -> Any:
    (case,) = [case for case in CONTRACT_CASES if case.name == CASE]
    return case


def test_a_backend_without_the_shared_record_lock_fails_on_postgresql(
    store_factory: StoreFactory, store_backend: str
) -> None:
    report = run_contract(_unlocked(store_factory), [_case()])
    if store_backend == "sqlite":
        assert report == {CASE: None}, "one writer at a time needs no lock"
        return
    failure = report[CASE]
    assert isinstance(failure, ContractViolation), failure
    assert str(failure).startswith(f"[{GUARANTEE}]"), failure
    assert "got past lock_shared" in str(failure), failure


def test_without_the_lock_a_second_end_judges_without_the_first_ends_mark(
    store_factory: StoreFactory, store_backend: str
) -> None:
    """The harm the case guards, on each kind of record: the second end reads before the
    first committed and misses its mark (the step would stay claimed for ever). With one
    writer at a time, the second end's transaction waits at its begin instead."""
    for kind in (INTENT_RECORD, EFFECT_RECORD):
        race = two_ends_lock_one_record(_unlocked(store_factory), kind)
        assert race.second_finished and race.second_error is None, race
        if store_backend == "sqlite":
            assert not race.second_began_early and race.first_mark_seen, race
        else:
            assert race.second_passed_early and not race.first_mark_seen, race
            assert race.own_mark_seen, race


def test_a_slow_second_end_still_reads_before_the_first_commits(
    store_factory: StoreFactory, store_backend: str
) -> None:
    """The harness holds the first end open until a second end that got past the lock has
    read: before, the first committed as soon as the second passed, and a second end slow
    to read (a loaded CI machine) saw the first's mark, so the twin above failed now and
    then. Each read here takes 50 ms."""
    for kind in (INTENT_RECORD, EFFECT_RECORD):
        race = two_ends_lock_one_record(_unlocked(store_factory, slow=True), kind)
        assert race.own_mark_seen and race.second_error is None, race
        if store_backend == "sqlite":  # the second end waits at its begin: nothing races
            assert not race.second_began_early and race.first_mark_seen, race
        else:
            assert race.second_passed_early and not race.first_mark_seen, race
