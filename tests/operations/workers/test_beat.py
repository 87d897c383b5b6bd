"""Trap 10 for real: two ``celery beat`` processes send the sweep every second; a worker on
the sweep queue runs it. At most one sweep runs per tick (the others are skipped), and
the sweep re-publishes a message lost before any worker started it.

Deployment speed-ups it relies on: a worker started with ``-Q agboss.sweep`` only (so
it runs nothing but the sweeps), a 1 s sweep interval and a 1 s requested grace.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from celery_agboss.store.migrate import migrate
from tests.conftest import ProcessFactory
from tests.operations.apps.ops_app import CONFIG_ENV, make_app
from tests.operations.cli import QUIET_WORKER, ops_app_command
from tests.support.processes import wait_until

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[3]
_TICK = re.compile(r"sweep\.finished .*?tick=(\d+)")


def test_two_beats_run_one_sweep_per_tick_on_the_sweep_queue(
    redis_url: str, managed_process: ProcessFactory, tmp_path: Path
) -> None:
    url = f"sqlite:///{(tmp_path / 'agboss.db').resolve()}"
    migrate(url)
    config = {
        "database_url": url,
        "broker_url": redis_url,
        "conf": {"agboss_sweep_interval": 1, "agboss_requested_grace": 1},
    }
    env = {CONFIG_ENV: json.dumps(config), "PYTHONPATH": str(REPO_ROOT)}
    app = make_app(config)
    try:
        lost = str(
            app.signature("ops.charge_order", args=("o-1",))
            .apply_async(queue="nobody-consumes-this")
            .id
        )
        worker = managed_process(
            ops_app_command(
                "worker",
                "-Q",
                "agboss.sweep",
                "-c",
                "1",
                *QUIET_WORKER,
                "-n",
                "sweeper@%h",
            ),
            name="sweep-worker",
            env=env,
            cwd=str(REPO_ROOT),
        )
        worker.wait_for_output(" ready.", 30)
        for n in range(2):
            managed_process(
                ops_app_command(
                    "beat",
                    "-l",
                    "info",
                    "-s",
                    str(tmp_path / f"beat-{n}-schedule"),
                    "--pidfile",
                    str(tmp_path / f"beat-{n}.pid"),
                ),
                name=f"beat-{n}",
                env=env,
                cwd=str(REPO_ROOT),
            )

        def ticks() -> list[str]:
            return _TICK.findall(worker.output())

        # Each condition is waited for (a loaded machine can put the two beats' first
        # sends in different ticks); what may never happen is checked on every tick seen.
        wait_until(
            lambda: len(ticks()) >= 4 and "sweep.skipped" in worker.output(),
            60,
            message=lambda: f"four sweeps and a skipped one\n{worker.tail(30)}",
        )
        wait_until(
            lambda: make_app_store_record(app, lost).recovery_count >= 1,
            30,
            message="the lost message to be re-published by the sweep",
        )
        done = ticks()
        assert len(done) == len(set(done)), f"a tick was swept twice: {done}"
    finally:
        from celery_agboss import AGBoss
        from celery_agboss.signals import disconnect

        disconnect(AGBoss.of(app))
        AGBoss.of(app).close()
        app.close()


def make_app_store_record(app: object, execution_id: str) -> Any:
    from celery_agboss import AGBoss

    record = AGBoss.of(app).executions.read_execution(execution_id)
    assert record is not None
    return record
