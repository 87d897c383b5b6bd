"""The quarantine record: an ambiguous payment leaves a chained, verifiable history."""

from __future__ import annotations

import dataclasses
import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_agboss.core.history import (
    HistoryEvent,
    HistoryVerdict,
    history_digest,
    next_history_row,
    verify_history,
)
from celery_agboss.core.store_protocol import HistoryRow, IntentStatus
from celery_agboss.errors import ConfigurationError

KEY = b"0123456789abcdef0123456789abcdef"
INTENT = "default:t:task-1:stripe.charge"


def _row(previous: HistoryRow | None, event: HistoryEvent, **fields: Any) -> HistoryRow:
    values: dict[str, Any] = {
        "idempotency_key": INTENT,
        "at_ms": 1_700_000_000_000 + (previous.seq if previous else 0) * 1000,
        "from_status": IntentStatus.PENDING,
        "to_status": IntentStatus.PENDING,
        "attempt": 1,
        "holder": "holder-1",
        "token": 1,
        "detail": {},
    }
    values.update(fields)
    return next_history_row(KEY, previous, event=event, **values)


def _unknown_outcome_then_reconciled() -> list[HistoryRow]:
    """A charge whose answer was lost: quarantined, taken over, reconciled."""
    claimed = _row(None, HistoryEvent.CLAIMED, from_status=None)
    sent = _row(claimed, HistoryEvent.SENT)
    unknown = _row(sent, HistoryEvent.OUTCOME_UNKNOWN, detail={"reason": "timeout"})
    taken = _row(unknown, HistoryEvent.TAKEN_FOR_RECONCILE, holder="holder-2", token=2)
    done = _row(
        taken,
        HistoryEvent.RECONCILED_COMPLETED,
        to_status=IntentStatus.COMPLETED,
        holder="holder-2",
        token=2,
        detail={"gateway_transaction_id": "ch_1"},
    )
    return [claimed, sent, unknown, taken, done]


def test_an_unknown_outcome_leaves_a_chained_record_that_never_says_failed() -> None:
    rows = _unknown_outcome_then_reconciled()
    assert verify_history(KEY, rows, expected_last_status="COMPLETED") == HistoryVerdict(
        True, None, "5 rows chained"
    )
    unknown = rows[2]
    assert (unknown.event, unknown.from_status, unknown.to_status) == (
        "outcome-unknown",
        "PENDING",
        "PENDING",
    )
    assert "FAILED" not in {row.to_status for row in rows}
    assert [row.seq for row in rows] == [1, 2, 3, 4, 5]
    assert rows[0].prev_digest is None
    assert all(row.prev_digest == before.digest for before, row in itertools.pairwise(rows))


def test_the_first_row_digest_is_pinned() -> None:
    row = _row(None, HistoryEvent.CLAIMED, from_status=None)
    # HMAC-SHA256 computed independently with openssl over the domain and the canonical
    # JSON of every field but the digest and the time.
    assert row.digest == ("v2:00855559124abd83ef893f12ff4978edd9e1dce8d502a70a9d774b66fa3f2c53")
    assert history_digest(KEY, row) == row.digest


V1_FIRST_ROW_DIGEST = "378225adf1237619d5e11406b28e10c2eaf8464659e5a8f3451b04ac6deb4c37"
"""The same row as written before version 2: its digest covers its time as well."""


def test_a_row_written_before_version_2_still_verifies_and_covers_its_time() -> None:
    row = dataclasses.replace(
        _row(None, HistoryEvent.CLAIMED, from_status=None), digest=V1_FIRST_ROW_DIGEST
    )
    assert history_digest(KEY, row) == V1_FIRST_ROW_DIGEST
    assert verify_history(KEY, [row]).ok
    moved = verify_history(KEY, [dataclasses.replace(row, at_ms=row.at_ms + 1)])
    assert (moved.ok, moved.first_broken_seq) == (False, 1)
    after = _row(row, HistoryEvent.SENT)
    assert verify_history(KEY, [row, after]).ok, "a version 2 row chains to a version 1 row"


def test_a_rows_time_is_stored_beside_its_digest() -> None:
    """The database time is written by the statement that writes the row: outside the
    digest, so changing it alone breaks nothing, and the chain still holds."""
    rows = _unknown_outcome_then_reconciled()
    rows[2] = dataclasses.replace(rows[2], at_ms=1)
    assert verify_history(KEY, rows).ok


def test_enum_values_are_stored_as_plain_strings() -> None:
    row = _row(None, HistoryEvent.CLAIMED, from_status=None)
    assert type(row.event) is str and type(row.to_status) is str


def test_a_chain_survives_a_round_trip_through_json_storage() -> None:
    rows = _unknown_outcome_then_reconciled()
    stored = [json.loads(json.dumps(dataclasses.asdict(row))) for row in rows]
    assert verify_history(KEY, [HistoryRow(**row) for row in stored]).ok


_CHANGES: dict[str, Any] = {
    "idempotency_key": "default:t:task-2:stripe.charge",
    "seq": 99,
    "event": "failed-definite",
    "from_status": "FAILED",
    "to_status": "FAILED",
    "attempt": 7,
    "holder": "mallory",
    "token": 42,
    "detail": {"reason": "edited"},
    "prev_digest": "0" * 64,
    "digest": "v2:" + "f" * 64,
    "execution_id": "exec-mallory",
}


@given(index=st.integers(min_value=0, max_value=4), field=st.sampled_from(sorted(_CHANGES)))
def test_changing_any_single_field_of_any_row_is_detected_with_that_rows_seq(
    index: int, field: str
) -> None:
    rows = _unknown_outcome_then_reconciled()
    rows[index] = dataclasses.replace(rows[index], **{field: _CHANGES[field]})
    verdict = verify_history(KEY, rows)
    assert not verdict.ok
    assert verdict.first_broken_seq == index + 1, verdict.reason


def test_a_row_names_the_execution_that_made_it_under_its_digest() -> None:
    claimed = _row(None, HistoryEvent.CLAIMED, from_status=None, execution_id="exec-a")
    assert claimed.execution_id == "exec-a"
    assert verify_history(KEY, [claimed]).ok
    for other in ("exec-b", None):
        verdict = verify_history(KEY, [dataclasses.replace(claimed, execution_id=other)])
        assert (verdict.ok, verdict.first_broken_seq) == (False, 1), other


def test_rows_written_before_executions_were_named_still_verify_beside_new_ones() -> None:
    """A chain begun before the upgrade (rows without an execution) goes on after it."""
    old = _unknown_outcome_then_reconciled()[:3]
    taken = _row(old[-1], HistoryEvent.TAKEN_FOR_RECONCILE, execution_id="exec-b", token=2)
    assert all(row.execution_id is None for row in old)
    assert verify_history(KEY, [*old, taken]).ok
    assert old[0].digest == _row(None, HistoryEvent.CLAIMED, from_status=None).digest


def test_a_missing_row_is_named_by_its_seq() -> None:
    rows = _unknown_outcome_then_reconciled()
    verdict = verify_history(KEY, rows[:2] + rows[3:])
    assert (verdict.ok, verdict.first_broken_seq) == (False, 3)
    assert "missing" in verdict.reason


def test_reordered_rows_are_named_by_the_first_misplaced_seq() -> None:
    rows = _unknown_outcome_then_reconciled()
    verdict = verify_history(KEY, [rows[0], rows[2], rows[1], rows[3], rows[4]])
    assert (verdict.ok, verdict.first_broken_seq) == (False, 2)
    assert "out of order" in verdict.reason


def test_a_chain_whose_head_was_cut_is_broken_at_row_one() -> None:
    rows = _unknown_outcome_then_reconciled()
    assert verify_history(KEY, rows[1:]).first_broken_seq == 1


def test_a_first_row_carrying_a_previous_digest_is_named() -> None:
    rows = _unknown_outcome_then_reconciled()
    forged = dataclasses.replace(rows[0], prev_digest="0" * 64)
    forged = dataclasses.replace(forged, digest=history_digest(KEY, forged))
    verdict = verify_history(KEY, [forged])
    assert (verdict.ok, verdict.first_broken_seq) == (False, 1)
    assert "previous digest" in verdict.reason


def test_a_row_rehashed_without_relinking_breaks_the_next_link() -> None:
    rows = _unknown_outcome_then_reconciled()
    edited = dataclasses.replace(rows[2], to_status="FAILED")
    rows[2] = dataclasses.replace(edited, digest=history_digest(KEY, edited))
    verdict = verify_history(KEY, rows)
    assert (verdict.ok, verdict.first_broken_seq) == (False, 4)
    assert "link" in verdict.reason


def test_rows_cut_from_the_end_are_caught_against_the_intents_status() -> None:
    rows = _unknown_outcome_then_reconciled()
    assert verify_history(KEY, rows[:3]).ok  # the chain alone cannot see a cut tail
    verdict = verify_history(KEY, rows[:3], expected_last_status=IntentStatus.COMPLETED)
    assert (verdict.ok, verdict.first_broken_seq) == (False, 4)


def test_rows_of_another_intent_are_refused() -> None:
    rows = _unknown_outcome_then_reconciled()
    verdict = verify_history(KEY, rows, idempotency_key="default:t:other:stripe.charge")
    assert (verdict.ok, verdict.first_broken_seq) == (False, 1)


def test_another_pseudonym_key_cannot_verify_the_chain() -> None:
    rows = _unknown_outcome_then_reconciled()
    verdict = verify_history(b"fedcba9876543210fedcba9876543210", rows)
    assert (verdict.ok, verdict.first_broken_seq) == (False, 1)


def test_an_empty_history_is_fine_only_when_no_intent_is_expected() -> None:
    assert verify_history(KEY, []).ok
    assert verify_history(KEY, [], expected_last_status="PENDING").first_broken_seq == 1


def test_an_unknown_event_is_refused() -> None:
    with pytest.raises(ValueError, match="HistoryEvent"):
        next_history_row(
            KEY,
            None,
            idempotency_key=INTENT,
            at_ms=1,
            event="marked-failed",
            from_status=None,
            to_status="FAILED",
            attempt=1,
            holder=None,
            token=None,
            detail=None,
        )


def test_a_float_in_the_detail_is_refused_because_storage_may_rewrite_it() -> None:
    with pytest.raises(TypeError, match=r"\$\.amount"):
        _row(None, HistoryEvent.CLAIMED, detail={"amount": 10.5})


def test_a_previous_row_of_another_intent_is_refused() -> None:
    first = _row(None, HistoryEvent.CLAIMED)
    with pytest.raises(ValueError, match="another intent"):
        _row(first, HistoryEvent.SENT, idempotency_key="default:t:other:x.y")


def test_the_chain_needs_the_pseudonym_key_bytes() -> None:
    with pytest.raises(ConfigurationError):
        verify_history(b"", [])


def test_every_event_is_a_stable_kebab_case_string() -> None:
    assert {event.value for event in HistoryEvent} >= {
        "claimed",
        "sent",
        "completed",
        "failed-definite",
        "outcome-unknown",
        "taken-for-reconcile",
        "reconciled-completed",
        "reconciled-not-sent",
        "unreconciled",
        "resolved-by-operator",
        "result-not-stored",
    }
    assert all(
        event.value == event.value.lower() and " " not in event.value for event in HistoryEvent
    )
