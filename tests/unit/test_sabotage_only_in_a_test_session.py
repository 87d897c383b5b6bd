"""The sabotage switches open only inside a pytest session that the package's own
``agboss`` plugin saw start: no environment variable (``AGBOSS_ALLOW_SABOTAGE``,
``PYTEST_CURRENT_TEST``, copied from a CI job) opens them in a process that merely
imports pytest, as an application's worker may (``celery.contrib.pytest`` does)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from celery_agboss.core import sabotage as core_sabotage

SECONDS = 120
_TRY = textwrap.dedent(
    """
    from celery_agboss.testing import SabotageRefusedError, sabotage
    try:
        with sabotage(sabotage.names()[0]):
            print("sabotaged")
    except SabotageRefusedError:
        print("refused")
    """
)


def _clean_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PYTEST") and not k.startswith("AGBOSS_")
    }


def test_a_process_that_imports_pytest_with_the_variables_set_is_refused() -> None:
    env = {**_clean_env(), core_sabotage.ENV_SWITCH: "1", "PYTEST_CURRENT_TEST": "x"}
    done = subprocess.run(
        [sys.executable, "-c", "import pytest\n" + _TRY],
        env=env,
        capture_output=True,
        text=True,
        timeout=SECONDS,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "refused"


@pytest.mark.parametrize(
    ("plugin", "expected"), [("", "sabotaged"), ("no:agboss", "refused")], ids=["agboss", "none"]
)
def test_a_users_pytest_run_opens_them_only_with_the_agboss_plugin(
    tmp_path: Path, plugin: str, expected: str
) -> None:
    """pytest itself sets ``PYTEST_CURRENT_TEST``; the plugin's session is what counts."""
    body = textwrap.indent(_TRY.replace("print(", "said.append("), "    ")
    (tmp_path / "test_try.py").write_text(
        f"def test_try():\n    said = []\n{body}\n    print('SAID', said[0])\n"
    )
    options = ["-p", plugin] if plugin else []
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *options, "."],
        cwd=tmp_path,
        env={**_clean_env(), core_sabotage.ENV_SWITCH: "1"},
        capture_output=True,
        text=True,
        timeout=SECONDS,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SAID {expected}" in done.stdout, done.stdout


def test_the_session_count_survives_a_nested_session_ending() -> None:
    """A session run inside this one (pytester) ends before it: the switches stay open."""
    core_sabotage.test_session_started()
    core_sabotage.test_session_ended()
    assert core_sabotage._running_a_test()
