"""The subprocess helper the worker and kill tests rely on (no service needed)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.processes import ManagedProcess, WaitTimeout, process_state, wait_until

# A parent that starts a child which outlives it unless its group is killed.
PARENT_AND_CHILD = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print("child", child.pid, flush=True)
time.sleep(120)
"""


def pid_alive(pid: int) -> bool:
    """Running; a zombie is not alive for our purpose."""
    return process_state(pid) not in (None, "Z")


def child_pid(process: ManagedProcess) -> int:
    # The line whole: the parent is unbuffered, so "child" may be read before its pid.
    found = process.wait_until(
        lambda: re.search(r"^child (\d+)\n", process.output(), re.MULTILINE),
        timeout=10,
        message="the child's pid",
    )
    return int(found.group(1))


def test_wait_until_returns_the_first_truthy_value() -> None:
    values = iter([0, None, "", 7])
    assert wait_until(lambda: next(values), timeout=5, interval=0.001) == 7


def test_wait_until_gives_up_at_its_deadline_with_the_message() -> None:
    started = time.monotonic()
    with pytest.raises(WaitTimeout, match="the moon"):
        wait_until(lambda: False, timeout=0.2, message="the moon")
    assert time.monotonic() - started < 2


def test_output_goes_to_the_log_file(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"]
    with ManagedProcess(argv, log_dir=tmp_path, name="echo") as process:
        assert process.wait(timeout=10) == 0
    assert process.output().split() == ["out", "err"]
    assert process.log_path.parent == tmp_path


def test_closing_kills_the_whole_process_group(tmp_path: Path) -> None:
    process = ManagedProcess([sys.executable, "-c", PARENT_AND_CHILD], log_dir=tmp_path)
    with process:
        child = child_pid(process)
        assert set(process.group_pids()) == {process.pid, child}
    assert process.returncode == -signal.SIGKILL
    wait_until(lambda: not pid_alive(child), timeout=10, message="the child to die")


def test_a_stopped_group_is_killed_too(tmp_path: Path) -> None:
    with ManagedProcess([sys.executable, "-c", PARENT_AND_CHILD], log_dir=tmp_path) as process:
        child = child_pid(process)
        process.send_signal(signal.SIGSTOP)
    wait_until(lambda: not pid_alive(child), timeout=10, message="the child to die")


def test_waiting_on_a_process_that_exits_fails_at_once_with_its_output(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "print('boom'); raise SystemExit(3)"]
    process = ManagedProcess(argv, log_dir=tmp_path, name="dies")
    with process, pytest.raises(WaitTimeout, match=r"(?s)dies exited.*exit code 3.*boom"):
        process.wait_for_output("never printed", timeout=30)


def test_the_fixture_starts_processes_that_can_import_the_tests(
    managed_process: Callable[..., ManagedProcess], tmp_path: Path
) -> None:
    script = "import time, tests.support; print('ready', flush=True); time.sleep(120)"
    process = managed_process([sys.executable, "-c", script], cwd=tmp_path)
    process.wait_for_output("ready", timeout=10)
    assert process.running
    assert process.log_path.is_relative_to(tmp_path)


def test_process_state_follows_a_process_from_stopped_to_zombie_to_gone() -> None:
    """The kill tests wait on these states; a reaped process is None whichever error
    /proc gives (ENOENT at the open, or ESRCH at the read when the reap lands between)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        wait_until(lambda: process_state(child.pid) == "T", timeout=10, message="stopped")
        os.kill(child.pid, signal.SIGKILL)
        wait_until(lambda: process_state(child.pid) == "Z", timeout=10, message="a zombie")
    finally:
        child.kill()
        child.wait(timeout=10)
    assert process_state(child.pid) is None
