"""Clock skew and lease expiry (design: PS13), the tests named s13, on the
README's deployment: the worker's clocks are wrong, and a second delivery of an
execution arrives while its charge is on the wire.

What decides a lease is the database's clock (PostgreSQL's ``clock_timestamp()``; on
SQLite, the host's), and the holder counts its own deadline from when it sent each
extension, on its own monotonic and wall clocks — so a constant offset of a worker's
clocks cancels out for the holder. The skew that threatens money is the one of the
process that *takes* a lease: judged on its own clock, a worker ahead would find a
live lease expired, take it over, look the charge up (nothing yet: it is still on the
wire), send it again, and the first send lands too. So each scenario holds the first
charge at the gateway *before* it is processed, re-delivers the same execution (same
task id, as a broker that restores an unacked message does) to the skewed worker's
other pool child, and checks that the duplicate was deferred (``wake_requested``)
with no take-over, then lets the charge through: one payment, one request.

- s13 ahead: the worker's clocks an hour ahead from its start;
- s13 behind: an hour behind from its start;
- s13 stepped: correct at start, its wall clock stepped an hour forward mid-lease,
  while the charge is on the wire (monotonic untouched, as NTP steps only the wall
  clock); the worker's own sweep, running every tick on that clock, must not see the
  live lease as expired either (the sweep decides on the database's clock);
- s13 drifting: both its clocks run 1.5 times too fast from its start (far beyond
  A4's 1 s per 30 s; a fast clock only makes the holder stop trusting its lease early).

Each runs on SQLite+Redis and PostgreSQL+Redis, one order, the README's worker and beat. The
sabotage run (PostgreSQL+Redis, the worker an hour ahead) decides expiry on the acquiring
worker's own clock (``EXPIRY_BY_CALLER_CLOCK``): the duplicate takes the live lease and the
order is paid twice. (A clock that runs *slow* beyond A4 is outside the assumptions
(design: A4), not tested here: its renewals come too late, and a send already on the wire
then rests on the gateway's key, G1, which this gateway does not honour.)

Speed-ups: tests/faults/scenario.py's README ``AGBOSS_<NAME>`` variables
(TTL 5 s, sweep every 2 s, grace 3 s, retry after 1 s). Harness hook, not a setting:
``PYTHONPATH`` starts with tests/faults/hooks, whose ``agboss_clock_hook`` skews the
clocks of the ``celery … worker`` processes only, from a control file the test writes
(``AGBOSS_TEST_CLOCK``); the database's clock stays the shared, real one.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from celery_agboss.core.protections import EXPIRY_BY_CALLER_CLOCK
from celery_agboss.testing.gateway_types import GatewayHold
from tests.deployment.conftest import DeployFactory
from tests.deployment.deployment import Deployment
from tests.deployment.test_recovery import HELD_SECONDS, recovery_deadline
from tests.faults.scenario import (
    POSTGRES_REDIS,
    SQLITE_REDIS,
    Stack,
    charges_of,
    deployed,
    sabotaged,
    wait_for_a_second_payment,
    worker_and_beat,
)
from tests.support.processes import wait_until

pytestmark = [pytest.mark.worker, pytest.mark.slow]


HOOKS = Path(__file__).resolve().parent / "hooks"
CLOCK_ENV = "AGBOSS_TEST_CLOCK"
HOUR = 3600.0
ORDER = 13
SEEN_SECONDS = 10.0  # a busy process re-reads the control file within 20 ms
DEFERRED_SECONDS = 45.0  # the duplicate's publisher starts, the worker's free child runs it

REPUBLISH_CODE = (
    "import sys\n"
    "from shop import charge_order\n"
    "charge_order.apply_async((int(sys.argv[1]),), task_id=sys.argv[2])\n"
)


class ClockControl:
    """The control file the worker processes' clock hook reads, and what they saw."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "clock.json"
        self.seen_dir = Path(f"{self.path}.seen")
        self.seen_dir.mkdir(parents=True, exist_ok=True)
        self.version = 0

    def env(self) -> dict[str, str]:
        return {"PYTHONPATH": str(HOOKS), CLOCK_ENV: str(self.path)}

    def set(self, **skew: float) -> int:
        """Skew every ``celery … worker`` process this way from now on (atomic write)."""
        self.version += 1
        body = {"version": self.version, "argv": ["worker"], "since": time.time(), **skew}
        scratch = self.path.with_suffix(".tmp")
        scratch.write_text(json.dumps(body), encoding="utf-8")
        os.replace(scratch, self.path)
        return self.version

    def seen(self) -> dict[int, dict[str, Any]]:
        out = {}
        for entry in self.seen_dir.glob("*.json"):
            try:
                out[int(entry.stem)] = json.loads(entry.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # being replaced
        return out

    def in_force(self, pid: int, version: int | None = None) -> bool:
        """Whether process ``pid`` applies this file's skew (``version``: at least that one)."""
        entry = self.seen().get(pid)
        if entry is None or not entry.get("applies"):
            return False
        return version is None or int(entry.get("version") or 0) >= version


SKEWS: Mapping[str, tuple[dict[str, float], dict[str, float] | None]] = {
    # name: (the skew from the worker's start, the step taken mid-lease)
    "ahead": ({"wall_offset": HOUR, "mono_offset": HOUR}, None),
    "behind": ({"wall_offset": -HOUR}, None),
    "stepped": ({}, {"wall_offset": HOUR}),
    "drifting": ({"rate": 1.5}, None),
}


def _skewed_deployment(
    deploy: DeployFactory,
    stack: Stack,
    tmp_path: Path,
    start: Mapping[str, float],
    extra: Mapping[str, str] | None = None,
) -> tuple[Deployment, ClockControl]:
    clock = ClockControl(tmp_path / "clock")
    clock.set(**start)
    deployment = deployed(deploy, stack, {**clock.env(), **(extra or {})})
    worker_and_beat(deployment)
    return deployment, clock


def _deliver_again(deployment: Deployment, order: int, task_id: str) -> None:
    """The same execution's message once more, as a broker restoring it would."""
    deployment.run(
        [str(deployment.venv.python), "-c", REPUBLISH_CODE, str(order), task_id], "republish"
    )


def _a_duplicate_while_the_charge_is_on_the_wire(
    deployment: Deployment, clock: ClockControl, mid_lease: Mapping[str, float] | None
) -> tuple[str, GatewayHold, int]:
    """Publish the order with its charge held at the gateway before processing (no money
    moved yet); take the mid-lease step, if any, once the holder applies it; deliver the
    execution again. Returns the task id, the hold and the holder's pid."""
    fake = deployment.gateway.gateway
    hold = fake.hold(operation="charge", before_processing=True)
    task_id = deployment.publish([ORDER])[ORDER]
    hold.wait_reached(timeout=HELD_SECONDS)
    holder = deployment.gateway.pid_of_charge(deployment.key_of(ORDER))
    assert clock.in_force(holder), f"the holder {holder} runs unskewed: {clock.seen()}"
    if mid_lease is not None:
        version = clock.set(**mid_lease)
        wait_until(
            lambda: clock.in_force(holder, version),
            SEEN_SECONDS,
            message=lambda: f"the holder {holder} to take the step: {clock.seen()}",
        )
    _deliver_again(deployment, ORDER, task_id)
    return task_id, hold, holder


def _deferred(deployment: Deployment, task_id: str) -> bool:
    record = deployment.execution(task_id)
    return record is not None and record.wake_requested


@pytest.mark.parametrize("skew", list(SKEWS))
@pytest.mark.parametrize("stack", [SQLITE_REDIS, POSTGRES_REDIS], indirect=True)
def test_s13_a_skewed_worker_defers_a_duplicate_under_a_live_lease_and_pays_once(
    stack: Stack, deploy: DeployFactory, tmp_path: Path, skew: str
) -> None:
    """The duplicate finds the lease live on the database's clock whatever the worker's
    clocks say: it is deferred, nobody takes the lease over, the held charge lands, and
    the order is paid once and COMPLETED."""
    start, mid_lease = SKEWS[skew]
    deployment, clock = _skewed_deployment(deploy, stack, tmp_path, start)
    task_id, hold, _ = _a_duplicate_while_the_charge_is_on_the_wire(deployment, clock, mid_lease)
    ids = {ORDER: task_id}
    wait_until(
        lambda: _deferred(deployment, task_id),
        DEFERRED_SECONDS,
        message=lambda: f"the duplicate to be deferred\n{deployment.progress(ids)}",
    )
    assert charges_of(deployment, ORDER) == (0, 1), "only the held charge went out"
    hold.release()
    deployment.wait_settled(ids, recovery_deadline())
    deployment.assert_each_paid_once(ids)
    record = deployment.execution(task_id)
    assert record is not None and record.recovery_count == 0, "the live lease was taken over"


def test_s13_sabotaged_expiry_on_the_workers_clock_lets_a_worker_ahead_pay_twice(
    sabotage_stack: Stack, deploy: DeployFactory, tmp_path: Path
) -> None:
    """Expiry judged on the acquiring worker's clock, an hour ahead: the duplicate takes
    the live lease, finds nothing at the gateway yet, sends the charge again, and the
    held first send lands too."""
    start, _ = SKEWS["ahead"]
    deployment, clock = _skewed_deployment(
        deploy, sabotage_stack, tmp_path, start, sabotaged(EXPIRY_BY_CALLER_CLOCK)
    )
    task_id, hold, _ = _a_duplicate_while_the_charge_is_on_the_wire(deployment, clock, None)
    ids = {ORDER: task_id}
    wait_until(
        lambda: charges_of(deployment, ORDER)[1] >= 2,
        DEFERRED_SECONDS,
        message=lambda: f"the duplicate to send the charge again\n{deployment.progress(ids)}",
    )
    hold.release()
    wait_for_a_second_payment(deployment, ORDER, ids)
