"""What the parts of a delivery that live beside ``lifecycle`` use of its ``Delivery``.

The replay of a terminal execution, the retries and long waits, the cancel and the
undos are functions of their own modules over this protocol; ``Delivery`` keeps the
start, the body and the ends every one of them shares (a verdict, a release, a fence,
a store failure, an unknown outcome), so each way a delivery ends is written once.
Its methods are public names: they are what ``replaying``, ``waits``, ``cancelling``
and ``compensating`` call, and the only part of ``Delivery`` they may; the rest of
``Delivery`` (underscored) is ``lifecycle``'s own.
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn, Protocol

from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.executions import ExecutionRecord
from celery_agboss.delivery.verdicts import Fail, Finish, Verdict
from celery_agboss.errors import AGBossSignal, ExecutionFencedError, StoreError
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.runtime.settings import AGBossSettings


class DeliveryLike(Protocol):
    """One delivery of a ``PaymentTask`` (``lifecycle.Delivery``), as its sibling modules see it."""

    task: Any
    request: Any
    runtime: Runtime
    settings: AGBossSettings
    execution_id: str
    cancel_reason: str

    def use_context(self, ctx: ExecutionContext) -> None: ...
    def context(self) -> ExecutionContext: ...
    def verdict(self, verdict: Verdict) -> ExecutionRecord | None: ...
    def conclude(self, verdict: Finish | Fail) -> ExecutionRecord | None: ...
    def release(self, *, will_republish: bool = False) -> None: ...
    def settle_sends(self) -> bool: ...
    def abandon(self) -> None: ...
    def cancel(self) -> NoReturn: ...
    def fenced(self, exc: ExecutionFencedError) -> NoReturn: ...
    def store_failed(self, exc: StoreError) -> NoReturn: ...
    def for_operator(self, exc: AGBossSignal) -> NoReturn: ...
    def later(self, exc: AGBossSignal) -> NoReturn: ...
    def uses_pickle(self) -> bool: ...
    def log_decision(self, event: str, level: int = logging.INFO, **fields: Any) -> None: ...
    def send_event(self, type_: str, **fields: Any) -> None: ...


__all__ = ["DeliveryLike"]
