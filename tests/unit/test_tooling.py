"""The formatter and the linter are the same for a commit hook and for ``make lint``."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _precommit_ruff_rev() -> str:
    text = (ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8")
    found = re.search(r"astral-sh/ruff-pre-commit\s*\n\s*rev:\s*v?(\S+)", text)
    assert found, "the ruff-pre-commit repository and its rev are in .pre-commit-config.yaml"
    return found.group(1)


def test_the_commit_hooks_check_and_format_with_ruff() -> None:
    text = (ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8")
    assert "id: ruff-check" in text and "id: ruff-format" in text


def test_the_commit_hooks_use_the_ruff_the_dev_extra_installs() -> None:
    try:
        installed = metadata.version("ruff")
    except metadata.PackageNotFoundError:
        pytest.skip("ruff is not installed here (pip install -e '.[dev]')")
    assert _precommit_ruff_rev() == installed


def test_make_lint_fails_on_unformatted_code() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    lint = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    assert "ruff format --check" in lint
