"""``celery -A example_project.scenarios.worker_app worker``: the shop, its twin, crash points.

The demo's workers run the shop's own app (``example_project.shop.app``) with two
additions a deployment does not have: the plain-Celery twin of every task
(``example_project.unprotected``, the "unprotected" column) and the crash points a
scenario arms (``crash_points``).
"""

from __future__ import annotations

import importlib
import os
import time

from example_project.scenarios import crash_points
from example_project.scenarios.world import WORKER_LOST_WAIT_SECONDS
from example_project.shop import app

TASK_MODULES = (
    "example_project.unprotected",
    "example_project.assistant",
    "example_project.checkout_flows",
)

CLOCK_AHEAD_ENV = "EXAMPLE_CLOCK_AHEAD"


def _skew_the_wall_clock(seconds: float) -> None:
    """PS13: this worker's wall clock ``seconds`` ahead, as a host whose clock is wrong.
    SQLite's clock is the store's SQL function, computed in the calling process: it stays
    the host's real one (one host has one clock; a skewed *process* is the scenario)."""
    from celery_agboss.store import databases

    real_time, real_time_ns = time.time, time.time_ns
    databases._sqlite_now_ms = lambda: real_time_ns() // 1_000_000  # type: ignore[attr-defined]
    time.time = lambda: real_time() + seconds
    time.time_ns = lambda: real_time_ns() + int(seconds * 1e9)


if os.environ.get(CLOCK_AHEAD_ENV):
    _skew_the_wall_clock(float(os.environ[CLOCK_AHEAD_ENV]))

# A pool process SIGKILLed is reported (and its message handed back) after this many
# seconds instead of Celery's 10: the demo kills many. Printed with the other speed-ups.
app.conf.worker_lost_wait = WORKER_LOST_WAIT_SECONDS

for module in TASK_MODULES:
    importlib.import_module(module)
crash_points.install()

__all__ = ["app"]
