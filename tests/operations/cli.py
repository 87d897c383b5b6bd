"""The operator's commands as the operations tests run them: in this process (``run``,
``run_json``) or as ``celery -A <ops app> …`` subprocesses (``ops_app_command``) that
open the world's store on its database clock (``ops_app_env``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner, Result

from celery_agboss.cli import agboss
from tests.operations.apps.ops_app import CONFIG_ENV

REPO_ROOT = Path(__file__).resolve().parents[2]
OPS_APP = "tests.operations.apps.ops_app:app"


def run(app: Celery, *args: str) -> Result:
    """``celery agboss ARGS`` on ``app``, in this process."""
    return CliRunner().invoke(
        agboss,
        list(args),
        obj=CLIContext(app=app, no_color=True, workdir=None),
        catch_exceptions=False,
    )


def run_json(app: Celery, *args: str) -> Any:
    """``run`` with ``--json``, its output parsed."""
    return json.loads(run(app, *args, "--json").output)


QUIET_WORKER = ("-l", "info", "--without-gossip", "--without-mingle", "--without-heartbeat")
"""A test worker's flags: info logs (its output is read), none of the cluster chatter."""


def celery_command(app: str, *args: str) -> list[str]:
    """The argv of ``celery -A APP ARGS`` in this interpreter."""
    return [sys.executable, "-m", "celery", "-A", app, *args]


def ops_app_command(*args: str) -> list[str]:
    """The argv of ``celery -A <ops app> ARGS`` (``agboss …``, ``worker``, ``beat``)."""
    return celery_command(OPS_APP, *args)


def ops_app_env(config: dict[str, Any], **extra: str) -> dict[str, str]:
    """The environment of an ops-app subprocess: its ``config`` (the store's URL, the
    test's database clock) and this tree on its path."""
    return {CONFIG_ENV: json.dumps(config), "PYTHONPATH": str(REPO_ROOT), **extra}
