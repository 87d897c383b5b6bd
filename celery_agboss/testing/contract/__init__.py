"""The store contract suite: what any backend of ``core.store_protocol.Store`` must do.

A backend is trusted with money only if it passes these cases. Each case is a plain
function taking a *store factory* — a callable that opens a new ``Store`` (its own
connections) on one shared, migrated, otherwise untouched database — and raises
``ContractViolation`` naming the guarantee it broke. Nothing here imports pytest or
SQLAlchemy, so a custom backend runs the cases with whatever test runner it uses::

    from celery_agboss.testing.contract import CONTRACT_CASES

    @pytest.mark.parametrize("case", CONTRACT_CASES, ids=lambda case: case.name)
    def test_my_store_keeps_the_contract(case, my_store_factory):
        case.check(my_store_factory)

The database clock is moved with ``VirtualClock.attach(store)`` (the protocol's
``clock_offset_source``), never by sleeping. The scenarios behind the cases (in
``base``, ``leases``, ``writes``, ``history``, ``one_statement`` and ``shared_records``)
return what happened instead of judging it, so this package's own tests can switch a
protection off and show the harm.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from celery_agboss.testing.contract.base import (
    ContractViolation,
    StoreFactory,
)
from celery_agboss.testing.contract.history import (
    check_a_first_history_row_is_written_with_its_intent,
    check_a_row_chains_only_to_the_last_row,
)
from celery_agboss.testing.contract.leases import (
    check_acquire_is_never_reentrant,
    check_expiry_is_decided_by_the_database_clock,
    check_late_renewal_is_refused,
    check_live_renewal_extends_on_the_database_clock,
    check_one_winner_per_token,
    check_renewals_skip_a_row_locked_by_a_fenced_transaction,
    check_take_over_fences_the_old_holder,
)
from celery_agboss.testing.contract.one_statement import (
    check_a_one_statement_claim_is_fenced_and_claims_once,
    check_a_one_statement_transition_is_fenced,
    check_a_one_statement_transition_writes_its_row_with_it,
)
from celery_agboss.testing.contract.shared_records import (
    check_a_shared_record_lock_holds_a_second_end_until_the_first_commits,
)
from celery_agboss.testing.contract.writes import (
    check_a_crash_after_commit_is_found_on_retry,
    check_a_crash_before_commit_commits_nothing,
    check_one_key_inserted_at_once_has_one_winner,
    check_zombie_write_is_fenced,
)


@dataclass(frozen=True)
class ContractCase:
    """One guarantee a backend must keep, and the check that proves it."""

    name: str
    guarantee: str
    check: Callable[[StoreFactory], None]

    def __str__(self) -> str:
        return self.name


CONTRACT_CASES: tuple[ContractCase, ...] = (
    ContractCase("one_winner_per_token", "P1", check_one_winner_per_token),
    ContractCase("acquire_is_never_reentrant", "P1", check_acquire_is_never_reentrant),
    ContractCase("take_over_fences_the_old_holder", "P1", check_take_over_fences_the_old_holder),
    ContractCase("late_renewal_is_refused", "R19", check_late_renewal_is_refused),
    ContractCase(
        "live_renewal_extends_on_the_database_clock",
        "PS13",
        check_live_renewal_extends_on_the_database_clock,
    ),
    ContractCase("zombie_write_is_fenced", "PS4", check_zombie_write_is_fenced),
    ContractCase(
        "expiry_is_decided_by_the_database_clock",
        "PS13",
        check_expiry_is_decided_by_the_database_clock,
    ),
    ContractCase(
        "a_crash_before_commit_commits_nothing", "PS14", check_a_crash_before_commit_commits_nothing
    ),
    ContractCase(
        "a_crash_after_commit_is_found_on_retry",
        "PS14",
        check_a_crash_after_commit_is_found_on_retry,
    ),
    ContractCase(
        "one_key_inserted_at_once_has_one_winner",
        "P2",
        check_one_key_inserted_at_once_has_one_winner,
    ),
    ContractCase(
        "renewals_skip_a_row_locked_by_a_fenced_transaction",
        "P1",
        check_renewals_skip_a_row_locked_by_a_fenced_transaction,
    ),
    ContractCase(
        "a_first_history_row_is_written_with_its_intent",
        "quarantine record",
        check_a_first_history_row_is_written_with_its_intent,
    ),
    ContractCase(
        "a_history_row_chains_only_to_the_last_row",
        "quarantine record",
        check_a_row_chains_only_to_the_last_row,
    ),
    ContractCase(
        "a_one_statement_transition_is_fenced",
        "P1",
        check_a_one_statement_transition_is_fenced,
    ),
    ContractCase(
        "a_one_statement_claim_is_fenced_and_claims_once",
        "P3",
        check_a_one_statement_claim_is_fenced_and_claims_once,
    ),
    ContractCase(
        "a_one_statement_transition_writes_its_row_with_it",
        "one round trip per state change",
        check_a_one_statement_transition_writes_its_row_with_it,
    ),
    ContractCase(
        "a_shared_record_lock_holds_a_second_end_until_the_first_commits",
        "compensated step",
        check_a_shared_record_lock_holds_a_second_end_until_the_first_commits,
    ),
)


def run_contract(
    factory: StoreFactory, cases: Sequence[ContractCase] = CONTRACT_CASES
) -> dict[str, BaseException | None]:
    """Run every case; returns each case's name and its failure (None when it passed)."""
    report: dict[str, BaseException | None] = {}
    for case in cases:
        try:
            case.check(factory)
        except Exception as exc:  # collected for the report
            report[case.name] = exc
        else:
            report[case.name] = None
    return report


__all__ = [
    "CONTRACT_CASES",
    "ContractCase",
    "ContractViolation",
    "StoreFactory",
    "run_contract",
]
