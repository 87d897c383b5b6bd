"""``celery -A proj agboss …``: the operator's commands, plugged into Celery's own CLI.

``group`` holds the ``agboss`` group and what its commands share (exit codes,
``--json``, opening the app's store); the commands live by what they do: reading
(``listing_commands``), deciding (``decision_commands``, ``pause_command``), running the
store (``maintenance_commands``), and ``metrics`` and ``checklist`` in modules of their
own; ``views`` says how records are shown. The ``celery.commands`` entry point names
``agboss`` here.
"""

from __future__ import annotations

from celery_agboss.cli import (
    checklist_command,  # noqa: F401 - registers `agboss checklist`
    decision_commands,  # noqa: F401 - registers `agboss resolve`, `cancel`, ...
    listing_commands,  # noqa: F401 - registers `agboss pending`, `show`, ...
    maintenance_commands,  # noqa: F401 - registers `agboss migrate`, `sweep`, `rotate-keys`
    metrics_command,  # noqa: F401 - registers `agboss metrics`
    pause_command,  # noqa: F401 - registers `agboss answer-pause`
)
from celery_agboss.cli.group import (
    EXIT_CONFIGURATION,
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_USAGE,
    agboss,
)

__all__ = ["EXIT_CONFIGURATION", "EXIT_NOT_FOUND", "EXIT_REFUSED", "EXIT_USAGE", "agboss"]
