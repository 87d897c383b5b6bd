"""What every operator verb shares: the runtime it acts on, who acts, and the refusals."""

from __future__ import annotations

import getpass
import os
from typing import Any

from celery_agboss.core.executions import (
    ExecutionRecord,
)
from celery_agboss.core.store_protocol import (
    IntentRecord,
)
from celery_agboss.errors import OperatorRefusedError
from celery_agboss.runtime.app_runtime import Runtime

_NO_RESULT = object()


def default_actor() -> str:
    """Who is acting: the OS user (what the audit row records unless told otherwise)."""
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (containers): the uid still identifies someone
        return os.environ.get("USER") or f"uid:{os.getuid()}"


def _refuse(code: str, message: str, **fields: Any) -> OperatorRefusedError:
    return OperatorRefusedError(message, code=code, **fields)


def _execution(runtime: Runtime, execution_id: str, listing: str) -> ExecutionRecord:
    """The execution an operator named, or a not-found refusal saying how to list them."""
    record = runtime.executions.read_execution(execution_id)
    if record is None:
        raise _refuse("not-found", f"no execution has the id {execution_id!r}; list {listing}")
    return record


def _require_reason(reason: str) -> str:
    text = (reason or "").strip()
    if not text:
        raise _refuse("bad-input", "a reason is required: say why, it goes into the audit trail")
    return text


def _intent_summary(intent: IntentRecord) -> dict[str, Any]:
    return {
        "status": intent.status.value,
        "attempt": intent.attempt,
        "needs_operator": intent.needs_operator,
        # The decision's name ("unknown", "resolved by …"), not the text after it: the
        # audit stays in clear, and a reconcile's text is sealed with the intent.
        "operator_reason": None
        if intent.operator_reason is None
        else intent.operator_reason.split(":", 1)[0],
        "not_sent_confirmed": intent.not_sent_confirmed,
        "result_stored": intent.result_stored,
        "gateway_transaction_id": intent.gateway_transaction_id,
        "execution_id": intent.execution_id,
    }
