"""Headless Chromium, as the Flower and Django admin checks drive it (Debian's
``chromium`` package; a check without it skips, saying what to install, and fails in CI).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.services import in_ci

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def require_chromium(what: str) -> None:
    """Skip (fail under CI) when no Chromium can check ``what``."""
    if chromium() is None:
        message = f"chromium is not installed, so {what} is not checked: apt-get install chromium"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def headless_chromium(url: str, *output: str) -> str:
    """A headless Chromium on ``url`` (the page's scripts get 5 s to load) writing
    ``output`` (``--dump-dom``, ``--screenshot=…``); what it printed."""
    found = chromium()
    assert found is not None
    completed = subprocess.run(
        [
            found,
            *("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"),
            "--virtual-time-budget=5000",
            *output,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    return completed.stdout


def screenshot(url: str, target: Path) -> None:
    """A headless Chromium's picture of ``url``, kept at ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        target.unlink()
    headless_chromium(url, f"--screenshot={target}", "--window-size=1400,900")
    assert target.exists() and target.stat().st_size > 10_000, f"no screenshot at {target}"
