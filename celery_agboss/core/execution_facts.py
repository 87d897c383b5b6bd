"""The facts of an execution the sweep's rules decide by (design: sealed at rest)."""

from __future__ import annotations

from typing import Protocol

from celery_agboss.core.executions import ExecutionState


class ExecutionFacts(Protocol):
    """What the sweep's rules read of an execution: columns never sealed at rest, so a
    row no key opens is still listed, claimed, parked or expired like any other, and
    fails alone, by name, only where its message is read (design: sealed at rest).
    ``ExecutionRecord`` has them all."""

    @property
    def id(self) -> str: ...
    @property
    def task_name(self) -> str: ...
    @property
    def state(self) -> ExecutionState: ...
    @property
    def expires_ms(self) -> int | None: ...
    @property
    def started_at_ms(self) -> int | None: ...
    @property
    def not_before_ms(self) -> int | None: ...
    @property
    def recovery_count(self) -> int: ...
    @property
    def cancel_requested(self) -> bool: ...
    @property
    def redrive_planned(self) -> bool: ...
    @property
    def updated_at_ms(self) -> int: ...
    @property
    def read_at_ms(self) -> int: ...


__all__ = ["ExecutionFacts"]
