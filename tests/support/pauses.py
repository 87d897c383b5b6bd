"""How long the test processes were held up, printed after every run.

A thread in each test process sets a 50 ms timer again and again and notes every wake-up
later than ``PAUSE_S``: the process, or the interpreter lock its threads share, was held
up that long, and so was everything timed in it (SQLite's write-lock bound, an HTTP
client's timeout, a lease's renewal). Each test report carries the longest pause that
ended during it, so a failure beside a long pause names the machine as the first
suspect, and a run with none rules it out."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import pytest

TICK_S = 0.05
PAUSE_S = 0.5
PROPERTY = "agboss_pause_s"
GC_PROPERTY = "agboss_gc_pause_s"
SHOWN = 5


class PauseWatch:
    """The timer's thread, and the pauses it saw: (wall time the pause ended, seconds)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[float, float]] = []
        self.collections: list[tuple[float, float]] = []  # the same, for the collector's
        self._collecting_since = 0.0
        gc.callbacks.append(self._timed_collection)
        threading.Thread(target=self._watch, name="agboss-pause-watch", daemon=True).start()

    def _timed_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._collecting_since = time.monotonic()
            return
        took = time.monotonic() - self._collecting_since
        if took > PAUSE_S:
            self.collections.append((time.time(), took))

    def _watch(self) -> None:
        while True:
            before = time.monotonic()
            time.sleep(TICK_S)
            late = time.monotonic() - before - TICK_S
            if late > PAUSE_S:
                self.pauses.append((time.time(), late))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[Any]
    ) -> Generator[None, Any, None]:
        outcome = yield
        during = [late for ended, late in self.pauses if call.start <= ended <= call.stop]
        if during:
            outcome.get_result().user_properties.append((PROPERTY, round(max(during), 2)))
        collected = [took for ended, took in self.collections if call.start <= ended <= call.stop]
        if collected:
            outcome.get_result().user_properties.append((GC_PROPERTY, round(max(collected), 2)))


@dataclass(frozen=True)
class Pause:
    seconds: float
    nodeid: str
    when: str
    process: str


class PauseReport:
    """Where the reports arrive (the controller, or the one process): the pauses they
    carry, printed after the run."""

    def __init__(self) -> None:
        self.pauses: list[Pause] = []
        self.collected: dict[tuple[str, str], float] = {}  # (nodeid, when): the collector's

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, seconds in report.user_properties:
            if name == PROPERTY:
                gateway = getattr(getattr(report, "node", None), "gateway", None)
                process = str(getattr(gateway, "id", "main"))
                self.pauses.append(Pause(float(seconds), report.nodeid, report.when, process))
            elif name == GC_PROPERTY:
                self.collected[(report.nodeid, report.when)] = float(seconds)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.pauses:
            terminalreporter.write_line(f"test processes held up over {PAUSE_S} s: never")
            return
        longest = sorted(self.pauses, key=lambda pause: -pause.seconds)
        phases = f"{len(self.pauses)} test phase{'' if len(self.pauses) == 1 else 's'}"
        terminalreporter.write_line(
            f"test processes held up over {PAUSE_S} s: in {phases}, the longest "
            f"{longest[0].seconds:.2f} s; the {SHOWN} longest:"
        )
        for pause in longest[:SHOWN]:
            collector = self.collected.get((pause.nodeid, pause.when))
            by_gc = "" if collector is None else f", a garbage collection of {collector:.2f} s"
            terminalreporter.write_line(
                f"{pause.seconds:8.2f}  {pause.nodeid} ({pause.when}, {pause.process}{by_gc})"
            )
        if self.collected:
            terminalreporter.write_line(
                f"garbage collections over {PAUSE_S} s: in {len(self.collected)} test phases, "
                f"the longest {max(self.collected.values()):.2f} s"
            )


def pytest_configure(config: pytest.Config) -> None:
    distributed = getattr(config.option, "dist", "no") != "no"
    in_a_worker = hasattr(config, "workerinput")
    if in_a_worker or not distributed:  # where tests run
        config.pluginmanager.register(PauseWatch(), "agboss-pause-watch")
    if not in_a_worker:  # where every report arrives
        config.pluginmanager.register(PauseReport(), "agboss-pause-report")
