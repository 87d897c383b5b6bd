"""The runner's answers to a wrong command: a service that does not answer, an unknown id."""

from __future__ import annotations

import socket
import subprocess
import sys

from tests.example.support import REPO_ROOT


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "example_project.scenarios", *arguments],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_unreachable_broker_is_named_with_its_setting() -> None:
    done = _run("ps2", "--broker-url", f"redis://127.0.0.1:{_free_port()}/0")
    assert done.returncode != 0
    assert "--broker-url" in done.stderr and "BROKER_URL" in done.stderr, done.stderr


def test_an_unreachable_database_is_named_with_its_setting() -> None:
    url = f"postgresql+psycopg://postgres@127.0.0.1:{_free_port()}/shop"
    done = _run("ps2", "--database-url", url)
    assert done.returncode != 0
    assert "--database-url" in done.stderr and "DATABASE_URL" in done.stderr, done.stderr


def test_an_unknown_scenario_is_refused_by_name() -> None:
    done = _run("ps2", "ps24")
    assert done.returncode == 2
    assert "ps24" in done.stderr
