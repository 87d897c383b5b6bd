"""One request per execution id (design: one task per id): a fresh publish under a
recorded id must carry the recorded arguments, as a gateway refuses an idempotency key
reused with other parameters."""

from __future__ import annotations

import json
from typing import Any

from celery_agboss.core import sabotage
from celery_agboss.core.executions import ExecutionMessage, ExecutionRecord
from celery_agboss.core.protections import REUSED_ID_OTHER_ARGS_ACCEPTED
from celery_agboss.core.step_identity import DERIVED_ID_HEADER
from celery_agboss.errors import ExecutionIdConflictError


def refuse_another_request(record: ExecutionRecord, message: ExecutionMessage) -> None:
    """An execution id is one request (design: one task per id): a fresh publish under a
    recorded id must carry its arguments. A Celery retry (more ``retries``: ``self.retry(
    args=…)`` may change them), a publish by the execution itself (``parent_id``: its
    retry or replace) and a body's publish under the id celery_agboss derived for it
    (``DERIVED_ID_HEADER``, from its recorded parent: a re-run sending it again) stay the
    execution; not any publish of the parent: a task that publishes twice under one id
    of its own choosing gives both the same ``parent_id``."""
    if _same_request(record, message) or sabotage.active(REUSED_ID_OTHER_ARGS_ACCEPTED):
        return
    options, recorded = _json_object(message.options), _json_object(record.options)
    parent = options.get("parent_id")
    headers = options.get("headers")
    derived = isinstance(headers, dict) and headers.get(DERIVED_ID_HEADER) is True
    resent = parent == record.id or (derived and parent == recorded.get("parent_id"))
    if resent or _count(options, "retries") > _count(recorded, "retries"):
        return
    # Never the arguments themselves: they may hold card data (design: stored arguments).
    raise ExecutionIdConflictError(
        f"the execution id {record.id!r} was recorded for a request of {record.task_name!r} "
        "with other arguments: the stored request and this publish differ, so this publish "
        "was refused and nothing of it ran (its caller would be handed the recorded "
        "request's outcome). Give each request an id of its own; to retry the recorded "
        "request, publish the same arguments again",
        execution_id=record.id,
        task=message.task_name,
    )


def _same_request(record: ExecutionRecord, message: ExecutionMessage) -> bool:
    """The same arguments, as JSON values (keyword order aside; ``1`` is not ``1.0``)."""
    return all(
        _canonical(stored) == _canonical(sent)
        for stored, sent in ((record.args, message.args), (record.kwargs, message.kwargs))
    )


def _canonical(text: str) -> str:
    try:
        return json.dumps(json.loads(text), sort_keys=True)
    except ValueError:
        return text  # not JSON (a row written by hand): compared as it is


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _count(options: dict[str, Any], name: str) -> int:
    value = options.get(name, 0)
    return value if type(value) is int else 0


__all__ = ["refuse_another_request"]
