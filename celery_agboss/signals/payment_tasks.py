r"""Which publishes an app of this process records: its own ``PaymentTask``\ s, the names
its ``agboss_payment_tasks`` patterns match, and, with two ``AGBoss`` apps in one process,
whose publish is whose."""

from __future__ import annotations

import fnmatch
from typing import Any

from celery_agboss.core import sabotage
from celery_agboss.core.protections import OTHER_APPS_OWN_PUBLISH_TAKEN
from celery_agboss.errors import ConfigurationError
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.task import PaymentTask

PAYMENT_TASK = "PaymentTask"


def payment_task_reason(runtime: Runtime, name: Any) -> str | None:
    """Why ``name`` is a ``PaymentTask`` here, or None: this app's task is one (looked up
    without finalizing the app), or, for a process that publishes by name without
    importing the task's module, the ``agboss_payment_tasks`` pattern it matches."""
    if not isinstance(name, str):
        return None
    tasks = getattr(runtime.app, "_tasks", None)
    task = tasks.get(name) if tasks is not None else None
    if task is not None:
        return PAYMENT_TASK if isinstance(task, PaymentTask) else None
    return matched_pattern(runtime, name)


def matched_pattern(runtime: Runtime, name: str) -> str | None:
    """The ``agboss_payment_tasks`` pattern ``name`` matches, or None."""
    try:
        patterns = runtime.settings.payment_tasks
    except ConfigurationError:
        return None
    return next((p for p in patterns if fnmatch.fnmatchcase(name, p)), None)


def is_payment_task(runtime: Runtime, name: Any) -> bool:
    """Whether a message of task ``name`` is recorded at publish in this process."""
    return payment_task_reason(runtime, name) is not None


def records_its_own(app: Any, name: Any) -> bool:
    """Whether ``app``, another ``AGBoss`` app of this process whose ``send_task`` runs,
    takes ``name`` for a payment task itself: then its handler records the publish, and
    this app's patterns, which may match the name too, have no say in it."""
    if sabotage.active(OTHER_APPS_OWN_PUBLISH_TAKEN):
        return False
    try:
        other = Runtime.of(app)
    except ConfigurationError:
        return False
    return payment_task_reason(other, name) is not None
