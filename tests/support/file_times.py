"""Where the suite's time goes, by file and by test process, printed after every run.

``--durations`` names the slowest tests; with ``--dist loadfile`` a file is the unit
one test process runs, so the run ends when the busiest process does. These two
tables show which files to split or speed up, and whether the processes were even."""

from __future__ import annotations

from collections import defaultdict

import pytest

SHOWN = 15


class FileTimes:
    def __init__(self) -> None:
        self.by_file: dict[str, float] = defaultdict(float)
        self.by_process: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.by_file[report.nodeid.split("::", 1)[0]] += report.duration
        gateway = getattr(getattr(report, "node", None), "gateway", None)
        self.by_process[str(getattr(gateway, "id", "main"))] += report.duration

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.by_file:
            return
        terminalreporter.section(f"slowest {SHOWN} files (seconds, setup to teardown)")
        ranked = sorted(self.by_file.items(), key=lambda item: -item[1])[:SHOWN]
        for path, seconds in ranked:
            terminalreporter.write_line(f"{seconds:8.1f}  {path}")
        busy = ", ".join(
            f"{name} {seconds / 60:.1f} min" for name, seconds in sorted(self.by_process.items())
        )
        terminalreporter.write_line(f"busy time per test process: {busy}")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller sees every process's reports
        config.pluginmanager.register(FileTimes(), "agboss-file-times")
