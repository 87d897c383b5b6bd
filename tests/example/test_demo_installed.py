"""``make demo``'s table, with the package installed from its wheel, not from this tree.

The wheel built from this tree (the session's, as the deployment suite's) goes into a
fresh virtualenv with the ``stripe`` extra (what the example's README tells a user to
install); the example runs from a copy of ``example_project/`` (so the tree's
``celery_agboss`` cannot shadow the wheel's), on the embedded default — SQLite and
kombu's filesystem transport, real worker processes. A package-data file or a
dependency the wheel lacks fails here. The whole table runs: every scenario in both
columns, each protected row at its bar; an unprotected row whose harm did not show in
this run (the plain twin's luck under load) is printed, not failed. The run's time is
printed (the issue's "under three minutes"), not asserted.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.deployment.conftest import session_wheel, venv_with_extras
from tests.example.support import ALL_SCENARIOS, REPO_ROOT, run_scenarios

pytestmark = pytest.mark.timeout(1500)


def test_the_whole_table_runs_on_the_installed_wheel(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    python = venv_with_extras(tmp_path_factory, session_wheel(tmp_path_factory), "stripe")
    source = tmp_path / "source"
    shutil.copytree(
        REPO_ROOT / "example_project",
        source / "example_project",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    started = time.monotonic()
    run = run_scenarios(python / "bin" / "python", [], cwd=source, results=tmp_path / "table.json")
    elapsed = time.monotonic() - started
    print(f"the whole table ran in {elapsed:.0f} s")
    assert "celery_agboss" not in {p.name for p in source.iterdir()}
    assert run.returncode == 0, run.output[-6000:]
    assert sorted(run.table) == sorted(ALL_SCENARIOS), run.output[-3000:]
    assert run.missed() == [], run.output[-6000:]
    print(f"unprotected rows whose harm did not show this run: {run.harm_not_shown()}")
    assert "short timings for the demo" in run.output
