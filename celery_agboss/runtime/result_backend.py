"""What Celery's result backend tells of a terminal execution's end (design: terminal replays).

Celery sends a task's callbacks and its chain's next step, then stores ``SUCCESS``
(``mark_as_done``), then counts its chord part; a failure's ``FAILURE`` is stored, then
its chord part counted. So a stored outcome proves the end Celery gave the execution
went that far: a ``COMPLETED`` one's links went out, its chord part is counted. A
backend that stores nothing (``ignore_result``, a result expired) proves nothing.
"""

from __future__ import annotations

from typing import Any

from celery import states

from celery_agboss.core.executions import ExecutionState

_STORED_AS = {ExecutionState.COMPLETED: states.SUCCESS, ExecutionState.FAILED: states.FAILURE}


def outcome_stored(backend: Any, execution_id: str, state: ExecutionState) -> bool:
    """Whether ``backend`` holds the outcome Celery stores for an execution ended
    ``state``. Raises whatever the backend raises (it is Celery's, and none configured
    raises too): the caller decides what "cannot tell" means."""
    wanted = _STORED_AS.get(state)
    return wanted is not None and bool(backend.get_state(execution_id) == wanted)


__all__ = ["outcome_stored"]
