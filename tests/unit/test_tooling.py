"""The formatter and the linter are the same for a commit hook, ``make lint`` and tox."""

from __future__ import annotations

import configparser
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


def _dev_extra_ruff_pin() -> str:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    lines = config["options.extras_require"]["dev"].splitlines()
    pins = [line.strip() for line in lines if line.strip().startswith("ruff")]
    assert len(pins) == 1, f"one ruff in the dev extra, not {pins}"
    found = re.fullmatch(r"ruff==(\S+)", pins[0])
    assert found, f"the dev extra pins one ruff version exactly (ruff==X.Y.Z), not {pins[0]!r}"
    return found.group(1)


def _tox_lint() -> configparser.SectionProxy:
    config = configparser.ConfigParser(interpolation=None)
    config.read(ROOT / "tox.ini", encoding="utf-8")
    return config["testenv:lint"]


def _make_lint_commands() -> list[str]:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    lint = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    lines = [line.strip() for line in lint.splitlines()[1:]]
    return [line.removeprefix("$(BIN)/") for line in lines if line]


def test_one_ruff_version_for_the_dev_extra_the_commit_hooks_and_tox() -> None:
    pin = _dev_extra_ruff_pin()
    assert _precommit_ruff_rev() == pin
    assert _tox_lint()["deps"].strip() == f"ruff=={pin}"


def test_tox_lints_as_make_lint_does() -> None:
    tox = [line.strip() for line in _tox_lint()["commands"].splitlines() if line.strip()]
    make = _make_lint_commands()
    assert any(command.startswith("ruff format --check ") for command in make)
    assert tox == make
