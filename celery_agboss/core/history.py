"""The quarantine record: every transition of an intent, chained by keyed digests.

An operator must be able to prove that an ambiguous payment was quarantined (kept
``PENDING``, then reconciled or handed to a person), never marked failed. Each row
carries an HMAC-SHA256, under the pseudonym key, of all its fields (but the database
time, stored beside it: ``history_digest``) and of the previous row's digest;
``verify_history`` recomputes the chain and names the first row that does not hold: a
changed field, a missing or reordered row, a broken link.

The chain rests on the pseudonym key staying secret from whoever can write the
table: with the key, anyone can forge a whole new chain. Deleting rows at the *end*
leaves a valid shorter chain; pass ``expected_last_status`` (the intent's current
status) to catch that too.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from celery_agboss.core.canonical import canonical_json, json_path
from celery_agboss.core.keys import MIN_PSEUDONYM_KEY_BYTES
from celery_agboss.core.store_protocol import JSON, HistoryRow
from celery_agboss.errors import ConfigurationError

__all__ = ["HistoryEvent", "HistoryVerdict", "history_digest", "next_history_row", "verify_history"]

_HISTORY_DOMAIN = b"agboss.history.v1\x00"
_HISTORY_DOMAIN_V2 = b"agboss.history.v2\x00"
DIGEST_V2_PREFIX = "v2:"
"""How a version 2 digest begins (the row's time outside it: ``history_digest``)."""


class HistoryEvent(str, enum.Enum):
    """The stable vocabulary of history rows. Adding a member is safe; renaming one is not."""

    CLAIMED = "claimed"  # no row → PENDING attempt 1, or FAILED → PENDING attempt + 1
    SENT = "sent"  # the send was started under the claim (still PENDING)
    COMPLETED = "completed"  # the gateway answered: PENDING → COMPLETED
    FAILED_DEFINITE = "failed-definite"  # a documented "nothing processed": PENDING → FAILED
    OUTCOME_UNKNOWN = "outcome-unknown"  # timeout, error, lost lease: stays PENDING
    TAKEN_FOR_RECONCILE = "taken-for-reconcile"  # PENDING, owner changes to the reconciler
    RECONCILED_COMPLETED = "reconciled-completed"  # lookup found it: PENDING → COMPLETED
    RECONCILED_NOT_SENT = "reconciled-not-sent"  # lookup proved absence: attempt + 1
    UNRECONCILED = "unreconciled"  # lookup cannot tell: PENDING, flagged for an operator
    RESOLVED_BY_OPERATOR = "resolved-by-operator"  # a person decided
    RESULT_NOT_STORED = "result-not-stored"  # COMPLETED with a not-stored marker (design: R24)
    FINGERPRINT_CONFLICT = "fingerprint-conflict"  # its own pending intent, another request
    LOOKUP_FAILED = "lookup-failed"  # reconcile raised or timed out: PENDING, handed back
    # A cancelled execution's intent whose lookup proved it never reached the gateway:
    # PENDING → FAILED, never resent (not a gateway's "nothing processed" answer).
    NOT_SENT_PROVEN = "not-sent-proven"


@dataclass(frozen=True)
class HistoryVerdict:
    """Whether a chain holds; if not, the seq of the first row that does not, and why."""

    ok: bool
    first_broken_seq: int | None
    reason: str


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def _refuse_floats(value: Any, path: str) -> None:
    # A float's text can change in storage (PostgreSQL jsonb prints 1e300 as digits,
    # read back as an int): the digest would break with no tampering at all.
    if isinstance(value, float):
        raise TypeError(f"history detail at {path} is a float; store it as a str or an int")
    if isinstance(value, dict):
        for key, item in value.items():
            _refuse_floats(item, json_path(path, str(key)))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _refuse_floats(item, json_path(path, index))


def _require_key(pseudonym_key: bytes) -> None:
    if not isinstance(pseudonym_key, bytes) or len(pseudonym_key) < MIN_PSEUDONYM_KEY_BYTES:
        raise ConfigurationError(
            "the history chain needs the pseudonym key as bytes (pseudonym_key_bytes())",
            setting="agboss_pseudonym_key",
        )


def _fields(row: HistoryRow) -> dict[str, Any]:
    """What a digest covers. ``execution_id`` only when the row names one: rows written
    before executions were named (and the sweep's and operators') hash as they did, so
    old chains still verify, and a name added or removed later breaks the digest."""
    fields = {
        "idempotency_key": row.idempotency_key,
        "seq": row.seq,
        "at_ms": row.at_ms,
        "event": row.event,
        "from_status": row.from_status,
        "to_status": row.to_status,
        "attempt": row.attempt,
        "holder": row.holder,
        "token": row.token,
        "detail": row.detail,
        "prev_digest": row.prev_digest,
    }
    if row.execution_id is not None:
        fields["execution_id"] = row.execution_id
    return fields


def history_digest(pseudonym_key: bytes, row: HistoryRow) -> str:
    """The digest ``row`` must carry, by the version it was written in.

    Rows written now (and a row not signed yet, ``digest=""``) are version 2:
    ``"v2:"`` and the HMAC-SHA256 (hex) of the canonical JSON of every field but
    ``digest`` and ``at_ms``. The database time is stored beside the digest, not in it,
    so one statement can read the clock, set the intent and insert its history row.
    Rows written before carry a bare hex digest that covers ``at_ms`` too (version 1),
    and still verify."""
    _require_key(pseudonym_key)
    fields = _fields(row)
    if str(row.digest).startswith(DIGEST_V2_PREFIX) or row.digest == "":
        del fields["at_ms"]
        text = canonical_json(fields)
        mac = hmac.new(pseudonym_key, _HISTORY_DOMAIN_V2 + text.encode("utf-8"), hashlib.sha256)
        return DIGEST_V2_PREFIX + mac.hexdigest()
    text = canonical_json(fields)
    return hmac.new(
        pseudonym_key, _HISTORY_DOMAIN + text.encode("utf-8"), hashlib.sha256
    ).hexdigest()


def _int(name: str, value: object, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"history field {name} must be an int, not {value!r}")


def next_history_row(
    pseudonym_key: bytes,
    previous: HistoryRow | None,
    *,
    idempotency_key: str,
    at_ms: int,
    event: HistoryEvent | str,
    from_status: str | None,
    to_status: str,
    attempt: int,
    holder: str | None,
    token: int | None,
    detail: JSON,
    execution_id: str | None = None,
) -> HistoryRow:
    """The row that follows ``previous`` (or the first row of the intent), with its digest.
    ``execution_id``: the execution whose delivery made the transition (who sent, who
    took over, who reconciled), None for the sweep and operators.

    ``detail`` is stored in clear: put ids and reasons in it, never request data.
    Enum values (``IntentStatus``, ``HistoryEvent``) are stored as their plain strings.
    """
    event = _plain(event)
    if event not in {member.value for member in HistoryEvent}:
        raise ValueError(
            f"unknown history event {event!r}; use a HistoryEvent "
            f"({', '.join(member.value for member in HistoryEvent)})"
        )
    if not isinstance(idempotency_key, str) or not idempotency_key:
        raise ValueError("a history row needs the intent's idempotency key")
    if previous is not None and previous.idempotency_key != idempotency_key:
        raise ValueError("the previous history row belongs to another intent")
    _int("at_ms", at_ms)
    _int("attempt", attempt)
    _int("token", token, optional=True)
    _refuse_floats(detail, "$")
    from_status = _plain(from_status)
    to_status = _plain(to_status)
    unsigned = HistoryRow(
        idempotency_key=idempotency_key,
        seq=1 if previous is None else previous.seq + 1,
        at_ms=at_ms,
        event=event,
        from_status=from_status,
        to_status=to_status,
        attempt=attempt,
        holder=holder,
        token=token,
        detail=detail,
        prev_digest=None if previous is None else previous.digest,
        digest="",
        execution_id=execution_id,
    )
    return HistoryRow(
        **{
            **_fields(unsigned),
            "execution_id": execution_id,
            "digest": history_digest(pseudonym_key, unsigned),
        }
    )


def verify_history(
    pseudonym_key: bytes,
    rows: Sequence[HistoryRow],
    *,
    idempotency_key: str | None = None,
    expected_last_status: str | None = None,
) -> HistoryVerdict:
    """Check a chain in store order (by seq) and name its first broken row.

    ``first_broken_seq`` is the seq that *should* stand where the chain first fails:
    a missing row is named by its own seq, a changed row by its seq.
    """
    _require_key(pseudonym_key)
    if not rows:
        if expected_last_status is not None:
            return HistoryVerdict(False, 1, "no history rows, yet the intent exists")
        return HistoryVerdict(True, None, "no history rows")
    intent = idempotency_key if idempotency_key is not None else rows[0].idempotency_key
    for index, row in enumerate(rows):
        expected = index + 1
        verdict = _check_row(pseudonym_key, row, expected, rows[index - 1] if index else None)
        if verdict is not None and row.seq != expected:
            later = {other.seq for other in rows[index + 1 :]}
            if expected in later:
                why = f"rows are out of order: seq {row.seq!r} stands where {expected} belongs"
                verdict = HistoryVerdict(False, expected, why)
        if verdict is not None:
            return verdict
        if row.idempotency_key != intent:
            return HistoryVerdict(False, expected, f"row {expected} belongs to another intent")
    last = rows[-1]
    expected_last = _plain(expected_last_status)
    if expected_last is not None and last.to_status != expected_last:
        return HistoryVerdict(
            False,
            last.seq + 1,
            f"the chain ends at row {last.seq} in {last.to_status!r} but the intent is "
            f"{expected_last!r}: rows are missing at the end",
        )
    return HistoryVerdict(True, None, f"{len(rows)} rows chained")


def _check_row(
    pseudonym_key: bytes, row: HistoryRow, expected: int, previous: HistoryRow | None
) -> HistoryVerdict | None:
    if row.seq != expected:
        if isinstance(row.seq, int) and row.seq > expected:
            why = f"row {expected} is missing (found seq {row.seq} in its place)"
        else:
            why = f"rows are repeated or out of order: seq {row.seq!r} where {expected} belongs"
        return HistoryVerdict(False, expected, why)
    try:
        digest = history_digest(pseudonym_key, row)
    except (TypeError, ValueError) as exc:
        return HistoryVerdict(False, expected, f"row {expected} cannot be hashed: {exc}")
    if not hmac.compare_digest(digest, str(row.digest)):
        return HistoryVerdict(
            False, expected, f"row {expected} does not match its digest: a field was changed"
        )
    if previous is None and row.prev_digest is not None:
        return HistoryVerdict(
            False, expected, "the first row carries a previous digest: rows before it are missing"
        )
    if previous is not None and row.prev_digest != previous.digest:
        return HistoryVerdict(
            False, expected, f"row {expected} does not link to row {previous.seq}'s digest"
        )
    return None
