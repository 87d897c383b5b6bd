"""``python manage.py agboss …``: the operator's commands of ``celery -A proj agboss …``.

The same click group, its arguments, output, ``--json`` and exit codes, run for the
project's Celery app: the current app once Django loaded the project (Celery's Django
guide imports it in the project package's ``__init__``), which must carry ``AGBoss``.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from celery_agboss.contrib.django.project import project_app


def _project_app() -> Any:
    try:
        return project_app()
    except ImproperlyConfigured as exc:
        raise CommandError(str(exc)) from None


class Command(BaseCommand):  # type: ignore[misc]  # Django ships no types
    help = "celery_agboss's operator commands, as `celery -A proj agboss …` runs them."

    def run_from_argv(self, argv: list[str]) -> None:
        """Everything after ``agboss`` goes to the click group, which parses it and exits
        with its own code."""
        from celery_agboss.cli import agboss

        program = os.path.basename(argv[0])
        if program == "__main__.py":  # as Django names it
            program = "python -m django"
        prog = f"{program} {argv[1]}"
        agboss.main(args=argv[2:], prog_name=prog, obj=SimpleNamespace(app=_project_app()))

    def handle(self, *args: Any, **options: Any) -> None:
        raise CommandError("run it from the command line: python manage.py agboss --help")
