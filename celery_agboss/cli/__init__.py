"""``celery -A proj agboss …``: the operator's commands (``commands``; ``metrics``,
``checklist`` and ``answer-pause`` in modules of their own) and how they show records
(``views``). The ``celery.commands`` entry point names ``agboss`` here."""

from __future__ import annotations

from celery_agboss.cli import (
    checklist_command,  # noqa: F401 - registers `agboss checklist`
    metrics_command,  # noqa: F401 - registers `agboss metrics`
    pause_command,  # noqa: F401 - registers `agboss answer-pause`
)
from celery_agboss.cli.commands import (
    EXIT_CONFIGURATION,
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_USAGE,
    agboss,
)

__all__ = ["EXIT_CONFIGURATION", "EXIT_NOT_FOUND", "EXIT_REFUSED", "EXIT_USAGE", "agboss"]
