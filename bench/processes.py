"""Worker subprocesses of the benchmark: started in a process group of their own,
measured (resident memory of the whole group, peak resident memory of each
process), and always ended, group and all.

Every wait has a deadline; ``close()`` is safe to call twice and after a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STOP_GRACE_SECONDS = 10.0
REPO_ROOT = Path(__file__).resolve().parents[1]


class WorkerTimeout(RuntimeError):
    """A worker did not get where it should have before its deadline."""


def stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` from its third field on (state, ppid, pgrp, …), or None when
    the process is gone: the command name before it is in parentheses and may hold
    spaces, so the fields are counted after the last ")"."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def live_pids() -> list[int]:
    """Every process ``/proc`` lists now."""
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def group_pids(pgid: int) -> list[int]:
    """Every live process whose process group is ``pgid``."""
    found: list[int] = []
    for pid in live_pids():
        fields = stat_fields(pid)
        if fields is not None and len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(pid)
    return sorted(found)


def _kib_field(path: str, name: str) -> int:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(name):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return 0
    return 0


def peak_kib(pid: int) -> int:
    """``VmHWM`` of one process in KiB: the most it was ever resident (0 if it is gone)."""
    return _kib_field(f"/proc/{pid}/status", "VmHWM:")


@dataclass(frozen=True)
class PeakMemory:
    """``VmHWM`` of a worker's main process and of its largest pool child (prefork)."""

    main_kib: int
    max_child_kib: int
    children: int

    @property
    def max_kib(self) -> int:
        return max(self.main_kib, self.max_child_kib)


class WorkerProcess:
    """``celery worker`` (or any command) in its own session; output in ``log_path``."""

    def __init__(
        self, argv: Sequence[str], *, log_path: Path, env: Mapping[str, str], cwd: Path
    ) -> None:
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self._popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                cwd=str(cwd),
                start_new_session=True,  # its own process group: pool children go with it
            )
        self.pid = self._popen.pid
        self.pgid = self.pid

    @classmethod
    def celery_worker(
        cls,
        app: str,
        config_env: str,
        config: Mapping[str, Any],
        *,
        pool: str,
        concurrency: int,
        log_path: Path,
    ) -> WorkerProcess:
        """``celery worker -A app`` from the repository root on the queue ``config`` names,
        which it reads (JSON) from ``config_env``: how every bench starts its worker."""
        queue = str(config["queue"])
        argv = [
            sys.executable, "-m", "celery", "-A", app, "worker",
            "-P", pool, "-c", str(concurrency),
            "--without-heartbeat", "--without-gossip", "--without-mingle",
            "-Q", queue, "-n", f"{queue}@%h", "-l", "info",
        ]  # fmt: skip
        env = {config_env: json.dumps(config), "PYTHONPATH": str(REPO_ROOT)}
        return cls(argv, log_path=log_path, env=env, cwd=REPO_ROOT)

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for_output(self, needle: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.output():
            if self._popen.poll() is not None:
                raise WorkerTimeout(
                    f"the worker exited ({self._popen.returncode}) before printing {needle!r}:\n"
                    + self.output()[-3000:]
                )
            if time.monotonic() >= deadline:
                raise WorkerTimeout(
                    f"the worker did not print {needle!r} within {timeout:g} s:\n"
                    + self.output()[-3000:]
                )
            time.sleep(0.05)

    def peak_memory(self) -> PeakMemory:
        """The peak resident memory of the main process and of each pool child."""
        children = [pid for pid in group_pids(self.pgid) if pid != self.pid]
        return PeakMemory(
            main_kib=peak_kib(self.pid),
            max_child_kib=max((peak_kib(pid) for pid in children), default=0),
            children=len(children),
        )

    def close(self) -> None:
        """Warm shutdown (SIGTERM to the group), then SIGKILL whatever is left, bounded."""
        if self._popen.poll() is None:
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(STOP_GRACE_SECONDS)
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(STOP_GRACE_SECONDS)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        while group_pids(self.pgid) and time.monotonic() < deadline:
            self._signal_group(signal.SIGKILL)
            time.sleep(0.05)

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)


__all__ = [
    "PeakMemory",
    "WorkerProcess",
    "WorkerTimeout",
    "group_pids",
    "live_pids",
    "peak_kib",
    "stat_fields",
]
