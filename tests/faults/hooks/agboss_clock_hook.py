"""Skew one process's clocks from a JSON control file (design: PS13), for fault tests only.

Imported by this directory's ``sitecustomize`` in every process of a deployment whose
``PYTHONPATH`` starts with it. Inert unless ``AGBOSS_TEST_CLOCK`` names a control file;
then ``time.time``, ``time.time_ns``, ``time.monotonic`` and ``time.monotonic_ns`` read
the file (re-read when it changes, so a test can step a clock mid-lease)::

    {"version": 2,            # echoed back in the acknowledgement below
     "argv": ["worker"],      # optional: only processes whose sys.argv holds all of these
     "pids": [1234],          # optional: only these pids, or their pool children
     "wall_offset": 3600.0,   # seconds added to the wall clock (a step when changed)
     "mono_offset": 0.0,      # seconds added to the monotonic clock
     "rate": 1.0,             # how fast both clocks run from "since" (drift)
     "since": 1700000000.0}   # real epoch seconds the drift starts from (default: now)

The product's holder clocks (``core.holder_clocks``), its lease renewer and the
caller-clock sabotage of ``store.leases`` all read these. The database's clock is
kept shared: on PostgreSQL it is the server's, and on SQLite the store's SQL clock
function (``store.databases._sqlite_now_ms``) is pointed back at the real clock, since
one host has one clock — a skewed *process* must not carry the database's clock with
it, or SQLite would be testing a stepped database clock (outside A3), not a skewed pod.
``datetime.now()`` (C code) is not skewed.

Each process that (re)reads the file writes ``<file>.seen/<pid>.json`` (when that
directory exists) with the version it applied and whether it applies to it, so a
test can check that a skew is in force in the process it means to skew.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

ENV = "AGBOSS_TEST_CLOCK"
RECHECK_SECONDS = 0.02  # how often (real monotonic) the control file's mtime is looked at
SQLITE_CLOCK_MODULE = "celery_agboss.store.databases"

_real_time = time.time
_real_time_ns = time.time_ns
_real_monotonic = time.monotonic
_real_monotonic_ns = time.monotonic_ns


class _Skew:
    """The offsets in force in this process (replaced whole, never mutated)."""

    def __init__(self, wall: float = 0.0, mono: float = 0.0, rate: float = 1.0) -> None:
        self.wall = wall
        self.mono = mono
        self.rate = rate
        self.since_wall = _real_time()
        self.since_mono = _real_monotonic()

    def drift(self, real_mono: float) -> float:
        return (self.rate - 1.0) * (real_mono - self.since_mono)


_NONE = _Skew()


class _Control:
    def __init__(self, path: str) -> None:
        self.path = path
        self.skew = _NONE
        self.stamp: tuple[int, int, int] | None = None
        self.pid = -1
        self.checked = -1e18

    def current(self) -> _Skew:
        now = _real_monotonic()
        pid = os.getpid()
        if pid == self.pid and now - self.checked < RECHECK_SECONDS:
            return self.skew
        self.checked = now
        try:
            st = os.stat(self.path)
            stamp: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        if stamp != self.stamp or pid != self.pid:
            self.stamp, self.pid = stamp, pid
            self.skew = self._load()
        return self.skew

    def _load(self) -> _Skew:
        try:
            with open(self.path, encoding="utf-8") as handle:
                data: dict[str, Any] = json.load(handle)
        except (OSError, ValueError):
            return self.skew if self.stamp is not None else _NONE  # half-written: keep
        applies = _applies(data.get("argv"), data.get("pids"))
        skew = _NONE
        if applies:
            skew = _Skew(
                float(data.get("wall_offset", 0.0)),
                float(data.get("mono_offset", 0.0)),
                float(data.get("rate", 1.0)),
            )
            if "since" in data:
                back = _real_time() - float(data["since"])
                skew.since_wall -= back
                skew.since_mono -= back
        self._acknowledge(data.get("version"), applies)
        return skew

    def _acknowledge(self, version: object, applies: bool) -> None:
        seen = self.path + ".seen"
        if not os.path.isdir(seen):
            return
        target = os.path.join(seen, f"{os.getpid()}.json")
        body = json.dumps({"version": version, "applies": applies, "argv": sys.argv})
        try:
            with open(target + ".tmp", "w", encoding="utf-8") as handle:
                handle.write(body)
            os.replace(target + ".tmp", target)
        except OSError:
            pass


def _applies(argv: Sequence[str] | None, pids: Sequence[int] | None) -> bool:
    if argv and not all(token in sys.argv for token in argv):
        return False
    return not pids or os.getpid() in pids or os.getppid() in pids


def _install(control: _Control) -> None:
    def skewed_time() -> float:
        skew = control.current()
        return _real_time() + skew.wall + skew.drift(_real_monotonic())

    def skewed_time_ns() -> int:
        skew = control.current()
        extra = skew.wall + skew.drift(_real_monotonic())
        return _real_time_ns() + int(extra * 1e9)

    def skewed_monotonic() -> float:
        skew = control.current()
        real = _real_monotonic()
        return real + skew.mono + skew.drift(real)

    def skewed_monotonic_ns() -> int:
        skew = control.current()
        real = _real_monotonic()
        return _real_monotonic_ns() + int((skew.mono + skew.drift(real)) * 1e9)

    time.time = skewed_time
    time.time_ns = skewed_time_ns
    time.monotonic = skewed_monotonic
    time.monotonic_ns = skewed_monotonic_ns
    sys.meta_path.insert(0, _SharedDatabaseClock())


def _real_now_ms() -> int:
    return _real_time_ns() // 1_000_000


class _SharedDatabaseClock(importlib.abc.MetaPathFinder):
    """Once ``store.databases`` is imported, its SQLite clock reads the real clock."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != SQLITE_CLOCK_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            module._sqlite_now_ms = _real_now_ms  # type: ignore[attr-defined]

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_path = os.environ.get(ENV)
if _path:
    _install(_Control(_path))
