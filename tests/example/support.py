"""Running ``python -m example_project.scenarios`` as a user does, and reading its table.

The runner writes its table as JSON too (``--results``); the tests read that, and the
bar is the runner's own (each scenario computes it from the fake gateway's counts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_SECONDS = 900.0


@dataclass(frozen=True)
class ScenarioRun:
    returncode: int
    output: str
    table: dict[str, dict[str, Any]]

    def missed(self) -> list[str]:
        """Every cell that did not run, and every protected cell that missed its bar
        (``"ps5 protected: ..."``). An unprotected cell whose harm did not show this time
        is the plain twin's luck, not a guarantee: it is in ``harm_not_shown``."""
        found = []
        for name, columns in self.table.items():
            for column, cell in columns.items():
                ran = cell is not None and cell["ran"]
                if not ran or (column == "protected" and not cell["as_expected"]):
                    found.append(f"{name} {column}: {cell and cell['text']}")
        return found

    def harm_not_shown(self) -> list[str]:
        return [
            f"{name}: {cell['text']}"
            for name, columns in self.table.items()
            if (cell := columns.get("unprotected")) and cell["ran"] and not cell["as_expected"]
        ]


def run_script(module: str, *arguments: str, timeout: float = 180) -> dict[str, Any]:
    """Run ``python -m module arguments`` from the repository (a runner that overrides the
    fake gateway in its own process) and read the JSON its last line prints."""
    done = subprocess.run(
        [sys.executable, "-m", module, *arguments],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return seen


def sqlite_shop_url(folder: Path) -> str:
    """The shop database a test keeps in its own folder, when SQLite is its store."""
    return f"sqlite:///{folder / 'shop.db'}"


def run_on_sqlite(module: str, folder: Path, *arguments: str) -> dict[str, Any]:
    """``run_script`` on a SQLite shop in ``folder``: a twin that switches a protection off
    shows the harm on one store, so it needs no PostgreSQL."""
    return run_script(module, str(folder), sqlite_shop_url(folder), *arguments)


def run_scenarios(
    python: str | Path,
    arguments: list[str],
    *,
    cwd: Path,
    results: Path,
    env: dict[str, str] | None = None,
) -> ScenarioRun:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(python), "-m", "example_project.scenarios", *arguments, "--results", str(results)],
        cwd=cwd,
        env={**base, **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=RUN_TIMEOUT_SECONDS,
        check=False,
    )
    output = done.stdout.decode(errors="replace")
    table = json.loads(results.read_text()) if results.exists() else {}
    return ScenarioRun(done.returncode, output, table)


ALL_SCENARIOS = [f"ps{n}" for n in range(1, 24)]
