"""What an operator may do, in Python (``celery -A proj agboss …`` calls the same functions).

``reading`` (pending intents, executions, waits, pauses), ``resolving`` (``resolve``)
and ``acting`` (re-drive, accept, cancel, unpark, answer a pause) hold the verbs;
``common`` what they share. Every public name (docs/api.md) is exported here.

Every action is refused (``OperatorRefusedError``, nothing changed) while it could race
with a delivery that may still send money: an intent whose owner's lease is live, an
execution running under a live lease, a cancel while a payment's outcome is unknown;
and every verb on an execution in a state a newer version of the package wrote.
Every change is a compare-and-set and leaves an audit row (who, when, why, before and
after); ``resolve`` writes its audit row in the same transaction as the change.
"""

from __future__ import annotations

from celery_agboss.core.pauses import PauseRecord
from celery_agboss.operator.acting import (
    PauseAnswerOutcome,
    UnparkResult,
    accept,
    answer_pause,
    answer_pause_outcome,
    cancel,
    payments_handled,
    redrive,
    unpark,
)
from celery_agboss.operator.common import default_actor
from celery_agboss.operator.reading import (
    Description,
    OperatorWait,
    PaymentLeftBehind,
    SharedWait,
    count_unsettled,
    describe,
    list_executions,
    list_failed_after_payment,
    list_pauses,
    list_pending,
    list_shared_waits,
    list_waits,
    read_pause,
)
from celery_agboss.operator.resolving import ResolveResult, resolve

__all__ = [
    "Description",
    "OperatorWait",
    "PauseAnswerOutcome",
    "PauseRecord",
    "PaymentLeftBehind",
    "ResolveResult",
    "SharedWait",
    "UnparkResult",
    "accept",
    "answer_pause",
    "answer_pause_outcome",
    "cancel",
    "count_unsettled",
    "default_actor",
    "describe",
    "list_executions",
    "list_failed_after_payment",
    "list_pauses",
    "list_pending",
    "list_shared_waits",
    "list_waits",
    "payments_handled",
    "read_pause",
    "redrive",
    "resolve",
    "unpark",
]
