"""Exactly-once payment side effects for Celery apps.

The package in layers, bottom up (docs/architecture.md; a test holds every import
to this order): ``errors`` and ``core/`` (no Celery, no SQLAlchemy); ``adapters/``;
``store/``; ``runtime/`` and ``task_events``; ``delivery/`` (one delivery, driven only
by ``task``); ``outbox/``; ``task``; what ``AGBoss`` installs (``signals/``,
``body_publishes``, ``sweep/``, ``worker/``, ``metrics/``, ``webhooks/``) and the
operator's verbs (``operator/``); ``app`` (``AGBoss``); the tools (``cli/``,
``flower``, ``testing/``, ``chaos/``).

The Celery-facing names are imported lazily so that ``celery_agboss.core`` can be
imported (and tested) without Celery or SQLAlchemy installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from celery_agboss.core.keys import validate_business_key
from celery_agboss.core.outbound import (
    CallContext,
    Completed,
    Lookup,
    NotSent,
    OutboundCall,
    Outcome,
    Unknown,
)
from celery_agboss.errors import (
    AGBossError,
    AGBossSignal,
    ConfigurationError,
    ExecutionFencedError,
    IdempotencyKeyConflictError,
    InvalidBusinessKeyError,
    MaskingPolicyError,
    NotPausedError,
    OutboundCallCompensatedError,
    OutboundCallInFlightError,
    OutboundCallOutcomeUnknownError,
    OutboundCallResultNotStoredError,
    OutboundCallUnreconciledError,
)

if TYPE_CHECKING:
    from celery_agboss.app import AGBoss
    from celery_agboss.core.compensation import UndoStep
    from celery_agboss.core.masking import MaskingPolicy
    from celery_agboss.operator import answer_pause, cancel
    from celery_agboss.store.migrate import migrate
    from celery_agboss.task import PaymentTask, undo_function

__version__ = "0.1.0.dev0"  # the one copy: setup.cfg reads it (attr:)

_LAZY = {
    "AGBoss": "celery_agboss.app",
    "MaskingPolicy": "celery_agboss.core.masking",
    "UndoStep": "celery_agboss.core.compensation",
    "PaymentTask": "celery_agboss.task",
    "undo_function": "celery_agboss.task",
    "migrate": "celery_agboss.store.migrate",
    "cancel": "celery_agboss.operator",
    "answer_pause": "celery_agboss.operator",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'celery_agboss' has no attribute {name!r}")
    return getattr(importlib.import_module(module_name), name)


__all__ = [
    "AGBoss",
    "AGBossError",
    "AGBossSignal",
    "CallContext",
    "Completed",
    "ConfigurationError",
    "ExecutionFencedError",
    "IdempotencyKeyConflictError",
    "InvalidBusinessKeyError",
    "Lookup",
    "MaskingPolicy",
    "MaskingPolicyError",
    "NotPausedError",
    "NotSent",
    "OutboundCall",
    "OutboundCallCompensatedError",
    "OutboundCallInFlightError",
    "OutboundCallOutcomeUnknownError",
    "OutboundCallResultNotStoredError",
    "OutboundCallUnreconciledError",
    "Outcome",
    "PaymentTask",
    "UndoStep",
    "Unknown",
    "answer_pause",
    "cancel",
    "migrate",
    "undo_function",
    "validate_business_key",
]
