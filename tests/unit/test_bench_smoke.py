"""The benchmark script still runs (``make bench``; docs/benchmarks.md).

Only that it finishes and prints its ratios is checked: speed and memory are the
benchmark's business, never timed assertions in the test suite.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.sqlite


def test_the_quick_engine_benchmark_on_sqlite_exits_cleanly_and_prints_a_ratio() -> None:
    completed = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "bench" / "run.py"),
            "--quick",
            "--engine-only",
            "--backends",
            "sqlite",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    assert re.search(r"^ratio: engine sqlite\s.*throughput \d+\.\d+x", completed.stdout, re.M), (
        output
    )
    assert "FAILED" not in completed.stdout, output
