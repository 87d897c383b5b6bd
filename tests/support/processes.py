"""Subprocesses that tests start, watch and always end.

A :class:`ManagedProcess` runs in its own process group (so a Celery worker's
pool children go with it), writes stdout and stderr to one log file, and is
killed, group and all, when the test ends, whatever happened. Every wait has a
deadline.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from celery_agboss.chaos.supervisor import group_members

T = TypeVar("T")

_counter = itertools.count(1)


REPOSITORY_ROOT = Path(__file__).resolve().parents[2]


def run_python(
    *args: str,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: Path = REPOSITORY_ROOT,
) -> subprocess.CompletedProcess[str]:
    """``python *args`` run to its end in a process of its own (a fresh interpreter, so
    nothing this test process imported is seen); it must exit 0, its output the message."""
    done = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def last_json_line(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """What a child script reports: the JSON object on its last line of output."""
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


class WaitTimeout(AssertionError):
    """A condition did not come true before its deadline."""


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    interval: float = 0.05,
    message: str | Callable[[], str] = "the condition",
) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns something truthy.

    Returns that value; raises :class:`WaitTimeout` (an ``AssertionError``) after
    ``timeout`` seconds, with ``message`` (or what it returns) in the text.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            text = message() if callable(message) else message
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for {text}")
        time.sleep(min(interval, remaining))


@contextlib.contextmanager
def every(period: float, fn: Callable[[], object], name: str) -> Iterator[None]:
    """Call ``fn`` every ``period`` seconds in a daemon thread while the block runs (a
    beat). Its first error stops the loop and is raised when the block ends."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        while not stop.wait(period):
            try:
                fn()
            except Exception as exc:  # reported when the block ends
                errors.append(exc)
                return

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)
    if errors:
        raise errors[0]


def in_a_thread(fn: Callable[[], object]) -> tuple[threading.Thread, dict[str, object]]:
    """Run ``fn`` in a daemon thread; its box gets ``"result"`` or ``"error"`` when it
    ends (empty while it runs, so a test sees a thread held at a point)."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def process_state(pid: int) -> str | None:
    """``pid``'s state letter from /proc (``R``, ``S``, ``T`` stopped, ``Z`` zombie), or
    None once it is gone. Gone can show as either error: a process reaped between the
    open and the read makes the read fail with ESRCH, not ENOENT."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _ancestors_and_self() -> set[int]:
    """This process and every process above it, up to init (Linux's /proc)."""
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return found


def signal_process(pid: int | None, sig: int) -> None:
    """Send ``sig`` to ``pid``: a process a test started, found through a request it sent.

    Refuses the test's own process and its ancestors: a pid read from a gateway's request
    is the test runner's when the request came from the test itself, and a SIGKILL or
    SIGSTOP there takes down (or freezes) the whole pytest worker, not the test.
    """
    if pid is None or pid <= 1 or pid in _ancestors_and_self():
        raise AssertionError(
            f"refusing to send signal {sig} to pid {pid}: it is this test process "
            "(or one above it), not a worker the test started; the request it was read "
            "from did not come from a worker"
        )
    os.kill(pid, sig)


def assert_stays(predicate: Callable[[], object], seconds: float, interval: float = 0.1) -> None:
    """``predicate`` holds now and for ``seconds`` (a negative claim needs a window: keep
    it as short as the claim allows)."""
    deadline = time.monotonic() + seconds
    while True:
        assert predicate(), "the condition stopped holding"
        if time.monotonic() >= deadline:
            return
        time.sleep(interval)


class ManagedProcess:
    """One subprocess in its own process group, its output in ``log_path``."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_dir: Path,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        self.argv = [str(arg) for arg in argv]
        self.name = name or Path(self.argv[0]).name
        self.log_path = Path(log_dir) / f"{self.name}-{next(_counter)}.log"
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.cwd = cwd
        self._popen: subprocess.Popen[bytes] | None = None

    # -- life cycle ---------------------------------------------------------

    def start(self) -> ManagedProcess:
        if self._popen is not None:
            raise RuntimeError(f"{self.name} was already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self._popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    @property
    def popen(self) -> subprocess.Popen[bytes]:
        if self._popen is None:
            raise RuntimeError(f"{self.name} has not been started")
        return self._popen

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit code (negative: killed by that signal), or None while it runs."""
        return self.popen.poll()

    @property
    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def wait(self, timeout: float) -> int:
        """Wait for the process itself to exit; raises :class:`WaitTimeout`."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise WaitTimeout(
                f"{self.name} (pid {self.pid}) still runs after {timeout:g}s"
            ) from None

    # -- signals ------------------------------------------------------------

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the whole process group (quietly, if it is gone)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def signal_leader(self, sig: int) -> None:
        """Send ``sig`` to the started process only, not to its children."""
        if self.running:
            self.popen.send_signal(sig)

    def group_pids(self) -> list[int]:
        """Every live process in the group, the started one included."""
        return group_members(self.pid)

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL the group and reap the started process."""
        if self._popen is None:
            return
        self.send_signal(signal.SIGKILL)
        self.wait(timeout)

    def terminate(self, timeout: float = 10.0) -> int:
        """SIGTERM the group; SIGKILL it if the process is not gone in ``timeout`` seconds."""
        self.send_signal(signal.SIGTERM)
        try:
            return self.wait(timeout)
        except WaitTimeout:
            self.kill()
            return self.wait(timeout)

    def close(self) -> None:
        """End the group, whatever state it is in (idempotent; for teardown)."""
        if self._popen is None:
            return
        self.send_signal(signal.SIGCONT)  # a stopped group must be able to die
        self.kill()

    def __enter__(self) -> ManagedProcess:
        return self if self._popen is not None else self.start()

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        self.close()
        if exc_type is not None:
            print(self.describe(), file=sys.stderr)

    # -- output -------------------------------------------------------------

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def describe(self, lines: int = 60) -> str:
        """A header (name, pid, exit code, log path) and the last ``lines`` of output."""
        state = "not started"
        if self._popen is not None:
            code = self._popen.poll()
            state = "running" if code is None else f"exit code {code}"
        return (
            f"--- {self.name} (pid {self._popen.pid if self._popen else '-'}, {state}),"
            f" last {lines} lines of {self.log_path} ---\n{self.tail(lines)}"
        )

    # -- waiting ------------------------------------------------------------

    def wait_until(
        self,
        predicate: Callable[[], T],
        timeout: float,
        interval: float = 0.05,
        message: str = "the condition",
    ) -> T:
        """Like :func:`wait_until`, but gives up early when the process exits."""

        def check() -> T | None:
            value = predicate()
            if value:
                return value
            if not self.running:
                raise WaitTimeout(
                    f"{self.name} exited while waiting for {message}\n{self.describe()}"
                )
            return None

        def explain() -> str:
            return f"{message}\n{self.describe()}"

        result: T = wait_until(check, timeout, interval, explain)  # type: ignore[assignment]
        return result

    def wait_for_output(self, text: str, timeout: float) -> None:
        """Wait until ``text`` appears in the process's output."""
        self.wait_until(lambda: text in self.output(), timeout, message=f"{text!r} in the output")
