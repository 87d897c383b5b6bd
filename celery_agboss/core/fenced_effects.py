"""Fenced effects (design: P2): a write to the store's own database, committed at most once per key,
in the same transaction that checks the lease.

The order is record-and-replay inside one fenced transaction: look the key up; a
record is the answer (after checking the step's name, and the request's fingerprint
when one was given); otherwise run ``fn(conn)`` on the transaction's connection,
store its JSON result under the key, and commit both together. A superseded token
is refused by the fenced transaction itself, before ``fn`` runs. ``fn`` may not end
the transaction: the store refuses ``commit()``, ``rollback()`` and ``close()`` on the
connection it gets (``CommitInsideFencedEffectError``, its guard of every store
transaction) — its writes commit with the record or not at all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from celery_agboss.core import sabotage
from celery_agboss.core.canonical import ensure_json
from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.keys import business_key_handle, fingerprint
from celery_agboss.core.log_events import (
    FENCED_EFFECT_APPLIED,
    FENCED_EFFECT_REPLAYED,
    OUTBOUND_CALL_COMPENSATED,
    log_event,
)
from celery_agboss.core.protections import (
    FENCED_EFFECT_NOT_REPLAYED,
    RECORD_USE_NOT_NOTED,
    REPLAY_AFTER_UNDO,
    RETENTION_DELETES_WHAT_IT_LISTED,
)
from celery_agboss.core.shared_records import compensated_error
from celery_agboss.core.step_identity import Step
from celery_agboss.core.store_protocol import (
    EFFECT_RECORD,
    EffectRecord,
    FencedTransaction,
    LeaseRef,
    Reliance,
    SharedRecord,
)
from celery_agboss.errors import (
    FencedEffectConflictError,
    IdempotencyKeyConflictError,
    OutboundCallCompensatedError,
)

MAX_INSERT_ROUNDS = 3


class EffectHolder(Protocol):
    """What a fenced effect needs from the delivery that runs it."""

    @property
    def settings(self) -> EngineSettings: ...

    @property
    def execution_id(self) -> str: ...

    @property
    def lease_ref(self) -> LeaseRef: ...

    def fenced(
        self, *, engine_only: bool = False, users_writes: bool = False
    ) -> AbstractContextManager[FencedTransaction]:
        """A fenced transaction under this holder's lease (refused once the lease is lost);
        ``engine_only`` when no user code runs in it, ``users_writes`` when a fenced
        effect's ``fn`` does (``Store.fenced``)."""

    def check_cancel(self, tx: FencedTransaction) -> None:
        """Raise ``CancelRequestedError`` when a cancel of the execution was recorded, read
        in ``tx`` — the transaction that would authorise a send or a write — so a cancel
        recorded before it commits is never followed by that send (design: cancel request)."""


class _LostInsert(Exception):
    """Another transaction recorded the key first: roll this one back (fn's writes too)."""


def run_fenced_effect(
    holder: EffectHolder, step: Step, fn: Callable[[Any], Any], *, request: Any = None
) -> Any:
    """Replay the recorded result, or run ``fn(conn)`` and record its result, in one fenced
    transaction, under the key of ``step`` (the delivery decided it: ``step_identity``)."""
    settings = holder.settings
    name, key, business_key_text = step.name, step.key, step.business_key_text
    wanted = None if request is None else fingerprint(settings.pseudonym_key, request)
    log_ref = _log_ref(settings, holder.execution_id, name, key, business_key_text)
    shared = business_key_text is not None
    for _ in range(MAX_INSERT_ROUNDS):
        try:
            with holder.fenced(users_writes=True) as tx:
                holder.check_cancel(tx)  # before a replay too: the body stops here
                record = tx.read_effect(key)
                if record is not None and not sabotage.active(FENCED_EFFECT_NOT_REPLAYED):
                    replayed = _replay(record, name, wanted, log_ref)
                    if sabotage.active(RECORD_USE_NOT_NOTED):
                        return replayed
                    if record.execution_id != holder.execution_id:
                        # Kept while this execution lives (design: retention).
                        tx.record_use(EFFECT_RECORD, key, holder.execution_id)
                    relied = tx.rely_on(EFFECT_RECORD, key, holder.execution_id) if shared else None
                    if relied is Reliance.UNDONE and not sabotage.active(REPLAY_AFTER_UNDO):
                        raise _undone(name, log_ref, tx.read_shared(EFFECT_RECORD, key))
                    if relied is Reliance.ABSENT and not sabotage.active(
                        RETENTION_DELETES_WHAT_IT_LISTED
                    ):
                        raise _LostInsert()  # retention took it: read again, never hand it out
                    return replayed
                result = fn(tx.connection)  # the store refuses an end of tx from fn
                try:
                    ensure_json(result)
                except TypeError as exc:
                    raise TypeError(f"fenced effect {name!r} must return JSON: {exc}") from None
                inserted = tx.insert_effect(
                    EffectRecord(
                        key=key,
                        execution_id=holder.execution_id,
                        name=name,
                        result=result,
                        token=holder.lease_ref.token,
                        created_at_ms=tx.now_ms,
                        fingerprint=wanted,
                        reliance=1 if shared else 0,
                    )
                )
                if not inserted:
                    raise _LostInsert()
                if shared:  # its creator relies on what it wrote (one record for all)
                    tx.rely_on(EFFECT_RECORD, key, holder.execution_id, counted=True)
            log_event(FENCED_EFFECT_APPLIED, **log_ref)
            return result
        except _LostInsert:
            continue  # the winner's record is read (and replayed) in a new transaction
    raise RuntimeError(f"fenced effect {name!r}: its key kept being recorded and lost")


def _log_ref(
    settings: EngineSettings, execution_id: str, name: str, key: str, business: str | None
) -> dict[str, Any]:
    ref: dict[str, Any] = {"effect": name, "execution_id": execution_id}
    if business is None:
        ref["effect_key"] = key
    else:
        ref["business_key_handle"] = business_key_handle(settings.pseudonym_key, business)
    return ref


def _undone(
    name: str, log_ref: dict[str, Any], record: SharedRecord | None
) -> OutboundCallCompensatedError:
    """The effect's undo claimed it before this execution relied on it: never replayed,
    and told undone only once that undo is done."""
    undone = record is None or record.compensated
    log_event(OUTBOUND_CALL_COMPENSATED, logging.WARNING, **log_ref, undone=undone)
    return compensated_error(
        f"fenced effect {name!r}",
        undone=undone,
        undo_by=None if record is None else record.undo_by,
        effect=name,
    )


def _replay(record: EffectRecord, name: str, wanted: str | None, log_ref: dict[str, Any]) -> Any:
    if record.name != name:
        raise FencedEffectConflictError(
            f"the key of fenced effect {name!r} was recorded by a step named {record.name!r}; "
            "a renamed step gets no old result",
            effect=name,
            recorded=record.name,
        )
    if wanted is not None and record.fingerprint is not None and record.fingerprint != wanted:
        raise IdempotencyKeyConflictError(
            f"fenced effect {name!r} was recorded with another request; nothing was written",
            effect=name,
        )
    log_event(FENCED_EFFECT_REPLAYED, **log_ref)
    return record.result


__all__ = ["EffectHolder", "run_fenced_effect"]
