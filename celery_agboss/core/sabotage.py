"""Protections that tests switch off to prove their test can fail.

A guarantee test without a twin that fails when the protection is removed proves
nothing. The switches' names live in ``celery_agboss.core.protections``, and whether one
is off is read here (so the store and the engine can consult them without importing the
testing package); they can only be turned off through ``celery_agboss.testing.switches``,
which refuses unless pytest runs a test in this process, in a session the package's own
pytest plugin (``agboss``) saw start, with ``AGBOSS_ALLOW_SABOTAGE=1`` (or the process
descends from the pytest process named by ``AGBOSS_SABOTAGE_SUBPROCESS``: a worker a test
started). No environment variable alone opens them. They are never settings.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from celery_agboss.core.protections import ALL as _KNOWN
from celery_agboss.errors import SabotageRefusedError

_active: set[str] = set()
_lock = threading.Lock()
_test_sessions = 0
"""pytest sessions running in this process, counted by the ``agboss`` pytest plugin."""
ENV_SWITCH = "AGBOSS_ALLOW_SABOTAGE"


def known() -> frozenset[str]:
    """Every protection that can be switched off (``celery_agboss.core.protections``)."""
    return _KNOWN


def active(name: str) -> bool:
    """True only while a test has switched the named protection off. Free when none is."""
    return bool(_active) and name in _active


def any_active() -> bool:
    """True while a test has any protection switched off (cached SQL is then rebuilt)."""
    return bool(_active)


def none_but(*names: str) -> bool:
    """True unless a protection other than ``names`` is switched off: a path that only
    those switches break runs, and the twin of any other protection runs the path it was
    written for."""
    return not _active or _active <= set(names)


SUBPROCESS_SWITCH = "AGBOSS_SABOTAGE_SUBPROCESS"
"""Set by a test to the pid of its pytest process, for the workers it starts."""
_MAX_ANCESTORS = 64


def _allowed() -> bool:
    if os.environ.get(ENV_SWITCH) != "1":
        return False
    return _running_a_test() or _started_by_a_test_run(os.environ.get(SUBPROCESS_SWITCH, ""))


def test_session_started() -> None:
    """For the ``agboss`` pytest plugin's ``pytest_configure`` only: a pytest session
    runs in this process (counted: a session may run another inside it)."""
    global _test_sessions
    with _lock:
        _test_sessions += 1


def test_session_ended() -> None:
    """For the ``agboss`` pytest plugin's ``pytest_unconfigure`` only."""
    global _test_sessions
    with _lock:
        _test_sessions = max(0, _test_sessions - 1)


def _running_a_test() -> bool:
    """pytest runs a test in this process: a session the ``agboss`` plugin saw start, and
    its current test named. Neither pytest imported nor ``PYTEST_CURRENT_TEST`` set
    proves it: an application may import pytest (``celery.contrib.pytest`` does) and
    its environment may carry any variable (copied from a CI job), and a worker of that
    application must keep every protection whatever its environment says."""
    return (
        _test_sessions > 0
        and "pytest" in sys.modules
        and bool(os.environ.get("PYTEST_CURRENT_TEST"))
    )


def _started_by_a_test_run(value: str) -> bool:
    """Whether this process descends from the pytest process ``value`` names (or from a
    pytest-xdist worker of it).

    A worker (or a pool child, or the chaos explorer's worker) that a test started has
    that process among its ancestors; a deployment where someone set the variables by
    hand has not, so the switches stay off there whatever the environment says.
    """
    if not value.isdigit():
        return False
    wanted = int(value)
    pid: int | None = os.getpid()
    for _ in range(_MAX_ANCESTORS):
        pid = _parent_of(pid) if pid is not None else None
        if pid is None or pid <= 1:
            return False
        if pid == wanted:
            return _is_pytest(pid) or _is_xdist_worker_of_pytest(pid)
    return False


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None  # no /proc (not Linux) or the process is gone: not proven
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def _is_pytest(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return b"pytest" in cmdline.read()
    except OSError:
        return False


def _is_xdist_worker_of_pytest(pid: int) -> bool:
    """A pytest-xdist worker: pytest started it, with a command line that does not say
    pytest (and it sets ``PYTEST_XDIST_WORKER`` only after it started, where /proc does
    not show it), so its parent is what proves it."""
    parent = _parent_of(pid)
    return parent is not None and parent > 1 and _is_pytest(parent)


@contextmanager
def switched_off(*names: str) -> Iterator[None]:
    """Remove the named protections for the duration of the block (tests only)."""
    if not _allowed():
        raise SabotageRefusedError()
    unknown = [name for name in names if name not in _KNOWN]
    if unknown:
        raise ValueError(f"unknown protections {unknown}; known: {sorted(_KNOWN)}")
    with _lock:
        _active.update(names)
    try:
        yield
    finally:
        with _lock:
            _active.difference_update(names)


def activate_from_environment() -> None:
    """Let a worker subprocess started by a test inherit switched-off protections.

    Reads ``AGBOSS_SABOTAGE`` (comma separated) only when sabotage is allowed.
    """
    names = [n for n in os.environ.get("AGBOSS_SABOTAGE", "").split(",") if n]
    if not names:
        return
    if not _allowed():
        raise SabotageRefusedError()
    with _lock:
        _active.update(names)
