"""The garbage collector's long passes kept out of the tests.

A test process keeps what each test leaves alive (about 6,000 objects a test, measured:
137,605 after collection, 579,865 after 78 delivery tests, a full collection between
them), so a full collection, which Python starts on its own, walks millions of objects
by the end of a run: 2-3 s in which every thread of the process stands still
(``tests/support/pauses.py`` caught every pause over a second beside one). Inside a
test that is a lease renewal held up, a SQLite transaction kept past its write-lock
bound, an HTTP client's timeout: failures the product did not cause. So once a test's
fixtures are gone, its process collects and freezes what survived (``gc.freeze``);
later collections walk only what newer tests made: 5.5 ms a test on average, measured
over the same 78.

Most of what the tests kept was one leak of ours, since fixed: the process's lease
renewer registry held every closed store (its engine and compiled statements). Without
it a delivery test keeps about 350 objects (140,161 to 167,103 over 76 tests, measured),
mostly modules imported once; the freeze stays, so no later leak brings the pauses back."""

from __future__ import annotations

import gc

import pytest


class FreezeAfterEachTest:
    def pytest_runtest_logfinish(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        gc.collect()
        gc.freeze()


def pytest_configure(config: pytest.Config) -> None:
    distributed = getattr(config.option, "dist", "no") != "no"
    if hasattr(config, "workerinput") or not distributed:  # where tests run
        config.pluginmanager.register(FreezeAfterEachTest(), "agboss-freeze-after-each-test")
