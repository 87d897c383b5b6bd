"""What every operator verb shares: the runtime it acts on, who acts, and the refusals."""

from __future__ import annotations

import functools
import getpass
import inspect
import os
from collections.abc import Callable
from typing import Any, NoReturn, ParamSpec, TypeVar

from sqlalchemy import select

from celery_agboss.core.executions import (
    ExecutionRecord,
)
from celery_agboss.core.store_protocol import (
    IntentRecord,
)
from celery_agboss.errors import OperatorRefusedError
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.store.schema_executions import executions
from celery_agboss.store.transactions import SQLTransaction
from celery_agboss.store.unopened import shown_state, state_known

_NO_RESULT = object()

P = ParamSpec("P")
R = TypeVar("R")


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


def newer_state_of(tx: SQLTransaction, execution_id: str) -> str | None:
    """The state of ``execution_id`` when a newer version of the package wrote it (a
    rolling upgrade), as its stored text; None for a state this version knows
    (``store.unopened.state_known`` decides) or no row. Read in the caller's
    transaction. The one rule an operator's verb and the sweep both follow: this
    version decides nothing about such an execution."""
    stored = tx.execute(select(executions.c.state).where(executions.c.id == execution_id))
    state = stored.scalar()
    if state is None or state_known(shown_state(str(state))):
        return None
    return str(state)


def newer_state_refusal(tx: SQLTransaction, execution_id: str) -> OperatorRefusedError | None:
    """The ``wrong-state`` refusal of any verb on ``execution_id`` while its state is one
    a newer version of the package wrote (``newer_state_of``): this version does not know
    its rules, so it may neither change the execution nor settle a payment that sends it
    on. None for a state this version knows."""
    state = newer_state_of(tx, execution_id)
    if state is None:
        return None
    return _refuse(
        "wrong-state",
        f"execution {execution_id} is {state}, a state written by a newer version of "
        "celery_agboss that this version does not know, so it changes nothing about it: "
        "run this command from a process on that version",
    )


def refuse_a_newer_state(tx: SQLTransaction, execution_id: str) -> None:
    """Raise ``newer_state_refusal``'s refusal, if any."""
    refusal = newer_state_refusal(tx, execution_id)
    if refusal is not None:
        raise refusal


def refused_if_newer(app: Any, execution_id: str, error: ValueError) -> NoReturn:
    """A store read of ``execution_id`` raised ``error``: ``newer_state_refusal``'s
    refusal when a newer version wrote its state (a record this version cannot read),
    else ``error`` as it was. Asked only then, so no verb pays for it."""
    with Runtime.of(app).store.read_transaction() as tx:
        refusal = newer_state_refusal(tx, execution_id)
    if refusal is None:
        raise error
    raise refusal from None


def refusing_newer_states(verb: Callable[P, R]) -> Callable[P, R]:
    """An operator's verb ``verb(app, execution_id, ...)``, refused by
    ``refused_if_newer`` when a read of its execution meets a state a newer version
    wrote. That read comes before the verb's first write, or inside a write's
    transaction, which the error rolls back: nothing is written."""
    signature = inspect.signature(verb)

    @functools.wraps(verb)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return verb(*args, **kwargs)
        except ValueError as error:
            named = signature.bind(*args, **kwargs).arguments
            refused_if_newer(named["app"], str(named["execution_id"]), error)

    return checked


def _require_reason(reason: str) -> str:
    text = (reason or "").strip()
    if not text:
        raise _refuse("bad-input", "a reason is required: say why, it goes into the audit trail")
    return text


def _acting(app: Any, reason: str, actor: str | None) -> tuple[str, str, Runtime]:
    """What every decision starts from: its reason (required), who acts, the app's runtime."""
    return _require_reason(reason), actor or default_actor(), Runtime.of(app)


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
        # The stored mark, named as the views name it (their ``not_sent_confirmed`` is
        # true only when proven).
        "not_sent_recorded": intent.not_sent_confirmed,
        "result_stored": intent.result_stored,
        "gateway_transaction_id": intent.gateway_transaction_id,
        "execution_id": intent.execution_id,
    }
