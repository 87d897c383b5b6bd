"""``make demo`` tells its story truthfully, and says so when the story does not happen."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from celery_agboss import demo
from celery_agboss.core.protections import UNKNOWN_ERRORS_ARE_DEFINITE
from celery_agboss.testing.switches import sabotage

KEY_LINES = (
    "holder A acquires the lease of demo:order-42: token 1",
    "holder B takes over: token 2",
    "zombie A tries to write 'mark-paid' -> refused: ExecutionFencedError",
    "nothing of A's write is stored",
    "stored row: key='demo:order-42:mark-paid' result={'by': 'B'} token=2",
    "outcome RECONCILED",
    "retries its charge -> refused: ExecutionFencedError, nothing sent",
    "the gateway saw 1 charge request and made 1 payment",
    "As told:",
)


def test_the_demo_runs_as_a_module_and_tells_the_whole_story() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGBOSS_")}
    done = subprocess.run(
        [sys.executable, "-m", "celery_agboss.demo"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for line in KEY_LINES:
        assert line in done.stdout, f"missing {line!r} in:\n{done.stdout}"
    assert "DEMO FAILED" not in done.stdout + done.stderr


def test_the_demo_fails_loudly_when_a_protection_is_missing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With unknown outcomes treated as definite failures, B resends instead of
    reconciling: the demo must notice and exit non-zero."""
    with sabotage(UNKNOWN_ERRORS_ARE_DEFINITE):
        code = demo.main([])
    out, err = capsys.readouterr()
    assert code == 1, out
    assert "DEMO FAILED" in err
    assert "As told:" not in out
