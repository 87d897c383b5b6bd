"""User code written against the public API type-checks under ``mypy --strict`` (and the
misuses in it stay rejected): tests/typing/user_code.py."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
USER_CODE = ROOT / "tests" / "typing" / "user_code.py"


@pytest.mark.slow
def test_user_code_written_against_the_public_api_passes_mypy_strict() -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[dev]')")
    completed = subprocess.run(
        # Errors inside the package are ``make types``' business; this checks the user's side.
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--follow-imports=silent",
            str(USER_CODE),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
