"""The contract suite fails a backend that breaks a guarantee, naming the guarantee.

A suite that passes every store proves nothing; here it is run against the real
store with one protection switched off, and against a hand-broken wrapper, and
must report exactly the case that guards the broken protection.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from celery_agboss.core.protections import (
    LEASE_CHECK_IN_SEPARATE_ROUND_TRIP,
    ONE_STATEMENT_WITHOUT_FENCE,
    RENEW_REVIVES_EXPIRED_LEASE,
)
from celery_agboss.core.store_protocol import LeaseGrant, Store
from celery_agboss.testing.contract import (
    CONTRACT_CASES,
    ContractViolation,
    StoreFactory,
    run_contract,
)
from celery_agboss.testing.switches import sabotage
from tests.contract.conftest import StoreFactory as SQLStoreFactory


def _cases(*names: str) -> list[Any]:
    chosen = [case for case in CONTRACT_CASES if case.name in names]
    assert len(chosen) == len(names)
    return chosen


def test_a_store_checking_the_lease_in_a_separate_round_trip_fails_ps4(
    store_factory: SQLStoreFactory,
) -> None:
    with sabotage(LEASE_CHECK_IN_SEPARATE_ROUND_TRIP):
        report = run_contract(store_factory, _cases("zombie_write_is_fenced"))
    failure = report["zombie_write_is_fenced"]
    assert isinstance(failure, ContractViolation) and str(failure).startswith("[PS4]")


def test_a_store_reviving_expired_leases_fails_r19(store_factory: SQLStoreFactory) -> None:
    with sabotage(RENEW_REVIVES_EXPIRED_LEASE):
        report = run_contract(
            store_factory, _cases("late_renewal_is_refused", "acquire_is_never_reentrant")
        )
    failure = report["late_renewal_is_refused"]
    assert isinstance(failure, ContractViolation) and str(failure).startswith("[R19]")
    assert report["acquire_is_never_reentrant"] is None


class ReentrantStore:
    """A custom backend with a classic bug: a holder that asks again gets its lease again."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.granted: dict[tuple[str, str], LeaseGrant] = {}

    def acquire_lease(self, scope: str, holder: str, ttl_ms: int) -> LeaseGrant | None:
        grant = self.inner.acquire_lease(scope, holder, ttl_ms)
        if grant is not None:
            self.granted[(scope, holder)] = grant
            return grant
        return self.granted.get((scope, holder))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "clock_offset_source":
            setattr(self.inner, name, value)
        else:
            object.__setattr__(self, name, value)


def test_a_custom_store_with_a_re_entrant_acquire_fails_p1(store_factory: SQLStoreFactory) -> None:
    def broken_factory() -> Store:
        return ReentrantStore(store_factory())  # type: ignore[return-value]

    factory: StoreFactory = broken_factory
    report = run_contract(factory, _cases("acquire_is_never_reentrant", "late_renewal_is_refused"))
    failure = report["acquire_is_never_reentrant"]
    assert isinstance(failure, ContractViolation) and str(failure).startswith("[P1]")
    assert report["late_renewal_is_refused"] is None


class _HistoryBlindTransaction:
    """A transaction whose chained append reports success when it wrote nothing, and
    whose claim leaves its first history row out."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def insert_intent(self, intent: Any, first_history: Any = None) -> bool:
        return bool(self.inner.insert_intent(intent))

    def append_history_after(self, row: Any) -> bool:
        self.inner.append_history_after(row)
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class HistoryBlindStore(ReentrantStore):
    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        with self.inner.transaction() as tx:
            yield _HistoryBlindTransaction(tx)


def test_a_custom_store_blind_to_its_history_fails_the_quarantine_record(
    store_factory: SQLStoreFactory,
) -> None:
    def broken_factory() -> Store:
        return HistoryBlindStore(store_factory())  # type: ignore[return-value]

    names = (
        "a_first_history_row_is_written_with_its_intent",
        "a_history_row_chains_only_to_the_last_row",
    )
    report = run_contract(broken_factory, _cases(*names))
    for name in names:
        failure = report[name]
        assert isinstance(failure, ContractViolation), (name, failure)
        assert str(failure).startswith("[quarantine record]"), str(failure)


def test_a_one_statement_transition_without_its_fence_fails_p1(
    store_factory: SQLStoreFactory, store_backend: str
) -> None:
    """Sabotage twin of the fence inside PostgreSQL's one-statement claim and transition:
    a holder whose lease expired claims and changes the intent (SQLite has no such
    statement)."""
    if store_backend == "sqlite":
        pytest.skip("SQLite runs the fenced transaction; there is no one statement to break")
    names = (
        "a_one_statement_transition_is_fenced",
        "a_one_statement_claim_is_fenced_and_claims_once",
    )
    with sabotage(ONE_STATEMENT_WITHOUT_FENCE):
        report = run_contract(store_factory, _cases(*names))
    for name in names:
        failure = report[name]
        assert isinstance(failure, ContractViolation), (name, failure)
        assert str(failure).startswith("[P1]"), failure
