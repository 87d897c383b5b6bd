"""docs/systemd/: the unit files agree with the package and with Celery, without systemd.

Under systemd's default ``KillMode=control-group`` a stop sends SIGTERM to every process
of the worker at once: the pool children die mid-body and the sweep recovers their
payments. The worker's unit must send it to Celery's main process alone
(``KillMode=mixed``, a warm shutdown) and wait longer than an attempt before its
SIGKILL. Each ``ExecStart`` is walked through Celery's own command line (every
subcommand and option known), and ``systemd-analyze verify`` reads each unit when the
machine has it. What happens under each kill mode, on real workers, is
tests/faults/test_systemd_stop.py.
"""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from celery_agboss.runtime.known_settings import DEFAULT_ATTEMPT_TIMEOUT_SECONDS

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "docs" / "systemd"
WORKER_UNIT = UNITS / "shop-worker.service"
BEAT_UNIT = UNITS / "shop-beat.service"
OPERATORS = ROOT / "docs" / "operators.md"
_SPAN = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|sec|min|m|h)?")
_SECONDS = {None: 1.0, "ms": 0.001, "s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}


def unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(
        strict=False, interpolation=None, comment_prefixes=("#", ";"), delimiters=("=",)
    )
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text(encoding="utf-8"), source=str(path))
    return parser


def seconds(span: str) -> float:
    """A systemd time span (``180``, ``3min``, ``2min 30s``) in seconds."""
    total, rest = 0.0, span.strip()
    for part in rest.split():
        match = _SPAN.fullmatch(part)
        assert match, f"not a time span systemd reads: {span!r}"
        total += float(match.group(1)) * _SECONDS[match.group(2)]
    return total


def exec_start(path: Path) -> list[str]:
    argv = shlex.split(unit(path)["Service"]["ExecStart"])
    assert Path(argv[0]).name == "celery", f"{path.name} runs {argv[0]}"
    return argv


def _celery_walk(argv: list[str]) -> list[str]:
    """Walk ``celery …`` as click would: every subcommand and option known to Celery."""
    import click
    from celery.bin.celery import celery as command

    problems: list[str] = []
    current: Any = command
    tokens = argv[1:]
    while tokens:
        token = tokens.pop(0)
        if token.startswith("-"):
            name, equals, _ = token.partition("=")
            params = {
                opt: param
                for param in current.params
                if isinstance(param, click.Option)
                for opt in (*param.opts, *param.secondary_opts)
            }
            param = params.get(name)
            if param is None:
                problems.append(f"`{current.name}` has no option {name}")
            elif not (param.is_flag or param.count) and not equals:
                tokens.pop(0)
            continue
        sub = getattr(current, "commands", {}).get(token)
        if sub is None:
            problems.append(f"`{current.name}` has no subcommand {token!r}")
            break
        current = sub
    return problems


def test_the_worker_unit_stops_celery_warmly_and_waits_longer_than_an_attempt() -> None:
    service = unit(WORKER_UNIT)["Service"]
    assert service.get("KillMode") == "mixed", "SIGTERM to Celery's main process alone"
    assert service.get("KillSignal", "SIGTERM") == "SIGTERM", "SIGTERM: a warm shutdown"
    assert service.get("Type", "simple") == "simple", "celery worker stays in the foreground"
    stop = seconds(service["TimeoutStopSec"])
    assert stop > DEFAULT_ATTEMPT_TIMEOUT_SECONDS, (
        f"TimeoutStopSec={stop:g} s does not outlast agboss_attempt_timeout "
        f"({DEFAULT_ATTEMPT_TIMEOUT_SECONDS:g} s): a charge on the wire is SIGKILLed"
    )
    argv = exec_start(WORKER_UNIT)
    assert argv[argv.index("-A") + 1] == "shop" and "worker" in argv
    assert "--detach" not in argv and "-D" not in argv, "systemd supervises the process"


@pytest.mark.parametrize("path", [WORKER_UNIT, BEAT_UNIT], ids=lambda p: p.name)
def test_each_unit_runs_a_celery_command_celery_knows(path: Path) -> None:
    assert _celery_walk(exec_start(path)) == []


def test_the_beat_unit_runs_beat_with_a_writable_schedule() -> None:
    service = unit(BEAT_UNIT)["Service"]
    argv = exec_start(BEAT_UNIT)
    assert "beat" in argv
    schedule = next(token for token in argv if token.startswith("--schedule="))
    assert schedule.split("=", 1)[1].startswith(f"/var/lib/{service['StateDirectory']}/")


def test_operators_md_says_why_the_worker_unit_kills_mixed() -> None:
    text = " ".join(OPERATORS.read_text(encoding="utf-8").split())
    assert "systemd/shop-worker.service" in text
    assert "KillMode=mixed" in text and "KillMode=control-group" in text


@pytest.mark.parametrize("path", [WORKER_UNIT, BEAT_UNIT], ids=lambda p: p.name)
def test_systemd_analyze_verifies_each_unit(path: Path, tmp_path: Path) -> None:
    """Its ExecStart pointed at this venv's celery (the unit's path is the user's)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed; the checks above still ran")
    celery = Path(sys.executable).with_name("celery")
    text = path.read_text(encoding="utf-8").replace("/srv/shop/venv/bin/celery", str(celery))
    copy = tmp_path / path.name
    copy.write_text(text, encoding="utf-8")
    done = subprocess.run(
        [analyze, "verify", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    complaints = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if path.name in line or "Unknown" in line
    ]
    assert done.returncode == 0 and not complaints, done.stdout + done.stderr
