"""The real sweep, running next to real workers: ``run_sweep_loop`` in a thread of the test
process, on the test's own app (the same store and broker as the workers)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from celery_agboss.sweep import SweepReport, run_sweep_loop
from tests.integration.apps.shop import CONFIG_ENV
from tests.integration.harness import Shop

REPO_ROOT = Path(__file__).resolve().parents[3]


@contextmanager
def sweeping(
    shop: Shop, *, interval: float = 1.0, grace: float = 300.0
) -> Iterator[list[SweepReport]]:
    """Sweep every ``interval`` seconds while the block runs (a beat, or ``--loop``).

    The shop app does not configure the sweep; its settings are set here for this test
    process only (the workers never read them).
    """
    agboss = shop.agboss
    agboss._settings = replace(  # the test's own sweeper only
        agboss.settings, requested_grace_seconds=grace, sweep_interval_seconds=interval
    )
    stop = threading.Event()
    reports: list[SweepReport] = []
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            run_sweep_loop(agboss, interval_seconds=interval, stop=stop, on_report=reports.append)
        except BaseException as exc:  # reported when the block ends
            errors.append(exc)

    thread = threading.Thread(target=loop, name="ops-sweeper", daemon=True)
    thread.start()
    try:
        yield reports
    finally:
        stop.set()
        thread.join(30)
    if errors:
        raise errors[0]
    assert not any(r.errors for r in reports), [r for r in reports if r.errors]


def agboss_cli(shop: Shop, *args: str) -> subprocess.CompletedProcess[str]:
    """``celery -A tests.integration.apps.shop:app agboss ARGS`` in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.integration.apps.shop:app", "agboss", *args],
        env={
            CONFIG_ENV: json.dumps(shop.config),
            "PYTHONPATH": str(REPO_ROOT),
            "PATH": "/usr/bin:/bin",
            "AGBOSS_ALLOW_SABOTAGE": "0",
        },
        cwd=str(REPO_ROOT),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def cli_json(shop: Shop, *args: str) -> Any:
    completed = agboss_cli(shop, *args, "--json")
    return completed.returncode, json.loads(completed.stdout)
