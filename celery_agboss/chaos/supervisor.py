"""The processes the explorer starts, and the only ones it ever signals.

Each worker and the beat run in a session of their own (``start_new_session``), so a
process group id is the pid the explorer started, and a pool child is recognised by
its group. Before any signal the target's group is checked to be one of ours: the
explorer never signals a process it did not start. Everything is ended by pid at the
end, on Ctrl-C and on any exception.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from celery_agboss.chaos.shop import APP_MODULE

READY_LINE = " ready."
BEAT_LINE = "beat: Starting..."
STOP_SECONDS = 15.0

# What the user's environment must not change in the chaos shop's processes: the app
# reads its settings from its own config; the sabotage switches pass only when set here.
_PASSED_THROUGH = ("AGBOSS_ALLOW_SABOTAGE", "AGBOSS_SABOTAGE", "AGBOSS_SABOTAGE_SUBPROCESS")


def _death_signal() -> Callable[[], None] | None:
    """What a forked child calls (Linux) so that it is SIGKILLed when the explorer dies,
    however it dies: a SIGKILLed explorer leaves no worker behind. Resolved here, in the
    parent: the child, forked while the gateway's threads run, must not import."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def set_death_signal() -> None:
        prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG

    return set_death_signal


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The explorer's environment without its ``AGBOSS_*``/``CELERY_*`` variables, except
    the sabotage switches when they are set (tests only: the product refuses them elsewhere)."""
    env = {k: v for k, v in environ.items() if not k.startswith(("AGBOSS_", "CELERY_"))}
    env.update({k: environ[k] for k in _PASSED_THROUGH if environ.get(k)})
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def group_members(group: int) -> list[int]:
    """Every live pid in process group ``group`` (read from /proc, or ``ps`` elsewhere)."""
    pids: list[int] = []
    proc = Path("/proc")
    if proc.is_dir():
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[-1].split()
            if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == group:
                pids.append(int(entry.name))
        return sorted(pids)
    out = subprocess.run(
        ["ps", "-A", "-o", "pid=,pgid=,stat="], capture_output=True, text=True, check=False
    )
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == str(group) and not parts[2].startswith("Z"):
            pids.append(int(parts[0]))
    return sorted(pids)


@dataclass
class Managed:
    """One started process (a worker or the beat), its log and its life."""

    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes]
    started_at: float = field(default_factory=time.monotonic)
    frozen: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def running(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def children(self) -> list[int]:
        """The pool children: this process's group, without itself."""
        return [p for p in group_members(self.pid) if p != self.pid]


class Supervisor:
    """Starts, restarts, signals and ends the chaos shop's processes."""

    def __init__(self, run_dir: Path, environ: Mapping[str, str]) -> None:
        self.run_dir = run_dir
        self.env = child_environment(environ)
        self.python = sys.executable
        self.started: list[Managed] = []  # every process ever started, ended at stop_all
        self.workers: dict[int, Managed] = {}  # worker number -> its current process
        self.beat: Managed | None = None
        self._starts = 0
        self._preexec = _death_signal()

    # --- starting ----------------------------------------------------------------------

    def command(self, *args: str) -> list[str]:
        """``<python> -m celery -A chaos_shop <args>``: the README's commands, this interpreter."""
        return [self.python, "-m", "celery", "-A", APP_MODULE, *args]

    def _start(self, name: str, argv: Sequence[str]) -> Managed:
        self._starts += 1
        log_path = self.run_dir / "logs" / f"{name}-{self._starts}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.run_dir,
                start_new_session=True,
                preexec_fn=self._preexec,
            )
        process = Managed(name, list(argv), log_path, popen)
        self.started.append(process)
        return process

    def start_worker(self, number: int) -> Managed:
        name = f"chaos{number + 1}"
        worker = self._start(name, self.command("worker", "-l", "INFO", "-n", f"{name}@%h"))
        self.workers[number] = worker
        return worker

    def start_beat(self) -> Managed:
        self.beat = self._start("beat", self.command("beat", "-l", "INFO"))
        return self.beat

    def ready(self, process: Managed) -> bool:
        line = BEAT_LINE if process is self.beat else READY_LINE
        return process.running and line in process.log()

    def ours(self, pid: int) -> Managed | None:
        """The started process whose group ``pid`` is in (None: never signal it)."""
        group = _group_of(pid)
        for process in self.started:
            if process.running and group == process.pid:
                return process
        return None

    # --- signals -------------------------------------------------------------------------

    def signal_pid(self, pid: int, signum: signal.Signals) -> bool:
        """Send ``signum`` to ``pid`` if it belongs to one of our groups; whether it was sent."""
        if self.ours(pid) is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
            return True
        return False

    def signal_group(self, process: Managed, signum: signal.Signals) -> None:
        if process.running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signum)

    # --- ending ----------------------------------------------------------------------------

    def stop_all(self, grace: float = STOP_SECONDS) -> None:
        """SIGCONT (a frozen one cannot stop), SIGTERM, then SIGKILL what is left; every
        group we started, by its pid, and every process reaped."""
        alive = [p for p in self.started if p.running]
        for process in alive:
            self.signal_group(process, signal.SIGCONT)
            self.signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in alive:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        for process in self.started:
            # The group too: a pool child can outlive its main process for a moment.
            if group_members(process.pid) or process.running:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.popen.wait(timeout=5)


__all__ = ["Managed", "Supervisor", "group_members"]
