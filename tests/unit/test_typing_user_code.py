"""User code written against the public API type-checks under ``mypy --strict`` (and the
misuses in it stay rejected): tests/typing/user_code.py."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

from tests.support.processes import run_python

ROOT = Path(__file__).resolve().parents[2]
USER_CODE = ROOT / "tests" / "typing" / "user_code.py"
API = ROOT / "docs" / "api.md"


def test_user_code_imports_only_modules_the_public_api_names() -> None:
    """User code sees the public surface only: a module docs/api.md does not name (the
    core's, the store's) may change without notice, so checking it here would check
    nothing a user may rely on."""
    public = set(re.findall(r"`(celery_agboss(?:\.[a-z_]+)*)`", API.read_text(encoding="utf-8")))
    imported = {
        node.module
        for node in ast.walk(ast.parse(USER_CODE.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("celery_agboss")
    }
    assert imported and imported <= public, sorted(imported - public)


@pytest.mark.slow
def test_user_code_written_against_the_public_api_passes_mypy_strict() -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[dev]')")
    # Errors inside the package are ``make types``' business; this checks the user's side.
    strict = ("--strict", "--no-incremental", "--follow-imports=silent")
    run_python("-m", "mypy", *strict, str(USER_CODE), timeout=240)
