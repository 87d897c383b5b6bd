"""The undo of a step several executions may share, decided from its record.

``core.compensation`` runs an execution's undos; before the first undo of a step it asks
here what to do with the step (``decide_step``): ``shared_records.undo_decision`` over the
record as the store reads it, and — when it undoes — the claim of the record by a
compare-and-set on the reliance that decision read, in the same fenced transaction. A
claim that misses (another execution relied on the step, or claimed it, meanwhile) reads
and decides again. A holder past its lease decides nothing (design: P5).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from celery_agboss.core import sabotage
from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.fault_points import UNDO_BEFORE_CLAIM, fault_point
from celery_agboss.core.keys import business_key_handle
from celery_agboss.core.log_events import UNDO_COVERED, UNDO_KEPT, UNDO_WAITS, log_event
from celery_agboss.core.protections import FENCED_HOLDER_STARTS_UNDO
from celery_agboss.core.shared_records import UndoDecision, UndoOutcome, undo_decision
from celery_agboss.core.store_protocol import (
    EFFECT_RECORD,
    INTENT_RECORD,
    SharedRecord,
    StoreTransaction,
)
from celery_agboss.core.undo_steps import UndoDeclaration
from celery_agboss.errors import OutboundCallInFlightError

MAX_DECISION_ROUNDS = 8
"""Reads and claims one step's undo decision may go through before it reports contention."""


def decide_step(ctx: ExecutionContext, declaration: UndoDeclaration) -> UndoDecision:
    """What this execution does with the step an undo belongs to (the one rule,
    ``shared_records.undo_decision``), read and — when it undoes — claimed in one fenced
    transaction: the claim matches the record's reliance as read, so an execution that
    relied on it meanwhile makes it miss, and the decision is taken again."""
    me = ctx.execution_id
    for _ in range(MAX_DECISION_ROUNDS):
        with _decision_transaction(ctx) as tx:
            kind, record = _step_record(tx, declaration)
            if record is None:
                return UndoDecision(UndoOutcome.UNDO)  # nothing left to share it with
            decision = undo_decision(record, me)
            claims = decision.outcome is UndoOutcome.UNDO and record.undo_by is None
            if claims:
                fault_point(UNDO_BEFORE_CLAIM, execution_id=me, key=record.key)
            if claims and not tx.claim_undo(kind, record.key, me, record.reliance):
                continue
        _log_decision(ctx, declaration, decision)
        return decision
    raise OutboundCallInFlightError(
        "the step kept changing while its undo was being decided; another execution is "
        "working on it",
        execution_id=me,
    )


def _decision_transaction(ctx: ExecutionContext) -> AbstractContextManager[StoreTransaction]:
    if sabotage.active(FENCED_HOLDER_STARTS_UNDO):
        return ctx.store.transaction()
    return ctx.fenced()


def _step_record(
    tx: StoreTransaction, declaration: UndoDeclaration
) -> tuple[str, SharedRecord | None]:
    kinds = [declaration.kind] if declaration.kind else [INTENT_RECORD, EFFECT_RECORD]
    for kind in kinds:
        record = tx.read_shared(kind, declaration.step_key)
        if record is not None:
            return kind, record
    return kinds[0], None


def mark_compensated(tx: StoreTransaction, execution_id: str, declaration: UndoDeclaration) -> None:
    """Every undo this execution declared after the step is done: the step is compensated,
    and a later replay of it raises ``OutboundCallCompensatedError``."""
    for kind in [declaration.kind] if declaration.kind else [INTENT_RECORD, EFFECT_RECORD]:
        tx.mark_compensated(kind, declaration.step_key, execution_id)


def _log_decision(
    ctx: ExecutionContext, declaration: UndoDeclaration, decision: UndoDecision
) -> None:
    fields = {
        "execution_id": ctx.execution_id,
        "other": decision.other,
        **loggable_step(ctx.settings, declaration.step_key),
    }
    if decision.outcome is UndoOutcome.KEEP:
        log_event(UNDO_KEPT, logging.INFO, "another execution completed on this step", **fields)
    elif decision.outcome is UndoOutcome.COVERED:
        log_event(UNDO_COVERED, logging.INFO, "another execution's undo claimed it", **fields)
    elif decision.outcome is UndoOutcome.WAIT:
        log_event(UNDO_WAITS, logging.INFO, "another execution still uses this step", **fields)


def step_notes(settings: EngineSettings, decisions: Mapping[str, UndoDecision]) -> list[str]:
    """How the steps an execution did not undo are named in its reason ("kept for …")."""
    notes = []
    for key, decision in decisions.items():
        if decision.outcome in (UndoOutcome.KEEP, UndoOutcome.COVERED):
            what = "kept for" if decision.outcome is UndoOutcome.KEEP else "claimed for undo by"
            name = next(iter(loggable_step(settings, key).values()))
            notes.append(f"step {name} {what} {decision.other}")
    return notes


def loggable_step(settings: EngineSettings, key: str) -> dict[str, Any]:
    """A step key as a log may show it (design: R17): a business-keyed one (``<tenant>:b:…``)
    holds the business key in clear, so only its HMAC handle is logged."""
    if key.split(":", 2)[1:2] == ["b"]:
        return {"step_key_handle": business_key_handle(settings.pseudonym_key, key)}
    return {"step_key": key}


__all__ = ["MAX_DECISION_ROUNDS", "decide_step", "loggable_step", "mark_compensated", "step_notes"]
