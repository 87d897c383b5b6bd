"""The mark an undo's task writes once it completed: its undo finished, so its parent's
step may read undone (design: compensated step).

An undo declared as a Celery signature is finished only once its task completed, not
once it was published. The task names its declaration by two headers (``UNDO_OF_HEADER``,
``UNDO_POSITION_HEADER``), and the transaction that makes it ``COMPLETED`` writes the mark,
whoever writes that end: the delivery whose body returned (``delivery.compensating``), or
an operator who accepted its divergence (``operator.acting.accept``: the refund an earlier
delivery made is the outcome accepted). One function for both, so they never disagree.
"""

from __future__ import annotations

from celery_agboss.core import sabotage
from celery_agboss.core.compensation import declaration_key, declaration_of, undos_of
from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.executions import ExecutionRecord, ExecutionState
from celery_agboss.core.protections import UNDO_TASK_ACCEPT_WRITES_NO_MARK
from celery_agboss.core.shared_steps import compensated_if_taken_back
from celery_agboss.core.store_protocol import EffectRecord, StoreTransaction
from celery_agboss.core.undo_steps import (
    UNDO_TASK_DONE_RECORD,
    undo_of_options,
    undo_position_options,
    undo_task_done_key,
)

NO_LEASE_TOKEN = 0
"""The token of a mark an operator's decision wrote: under no lease (a lease's first is 1)."""


def undo_task_completed(
    tx: StoreTransaction,
    settings: EngineSettings,
    execution_id: str,
    undo_of: str,
    position: int,
    task: str,
    *,
    token: int,
) -> None:
    """The undo's task ``execution_id`` (named ``task``) completes the declaration at
    ``position`` of execution ``undo_of``: its mark says the refund was made, and the step
    reads compensated once every undo of it finished. A position naming no such task of
    that execution marks nothing: the step stays claimed, never read undone (fail closed).
    ``token``: the lease the mark is written under (``NO_LEASE_TOKEN`` for an operator)."""
    record = tx.read_effect(declaration_key(settings, undo_of, position))
    if record is None or not isinstance(record.result, dict):
        return
    declaration = declaration_of(position, record.result)
    if declaration.task is None or declaration.undo != task:
        return
    tx.insert_effect(
        EffectRecord(
            key=undo_task_done_key(declaration.key),
            execution_id=execution_id,
            name=UNDO_TASK_DONE_RECORD,
            result={"undo": declaration.undo, "undo_of": undo_of},
            token=token,
            created_at_ms=tx.now_ms,
        )
    )
    undos = undos_of(settings)
    of_step = undos(tx, undo_of, declaration.step_key)
    compensated_if_taken_back(tx, undo_of, declaration, of_step, undos)


def undo_task_accepted(
    tx: StoreTransaction, settings: EngineSettings, record: ExecutionRecord
) -> None:
    """An operator accepted the divergence of ``record``, now ``COMPLETED`` in ``tx``: when
    it is an undo's task (its stored headers name the declaration), its undo finished, as
    when its body returns. Accepting is saying the outcome recorded stands, and for a
    refund task that outcome is the refund made: left unmarked, the charge would read
    claimed for ever and every later click on the order fail, nobody told."""
    if sabotage.active(UNDO_TASK_ACCEPT_WRITES_NO_MARK):
        return
    undo_of = undo_of_options(record.options)
    position = undo_position_options(record.options)
    if record.state is not ExecutionState.COMPLETED or undo_of is None or position is None:
        return
    undo_task_completed(
        tx, settings, record.id, undo_of, position, record.task_name, token=NO_LEASE_TOKEN
    )


__all__ = ["NO_LEASE_TOKEN", "undo_task_accepted", "undo_task_completed"]
