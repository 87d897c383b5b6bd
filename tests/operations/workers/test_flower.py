"""Flower against the test broker: celery_agboss's events become states an operator can read.

A real ``celery flower`` subprocess (``FLOWER_UNAUTHENTICATED_API=true``, a free port on
127.0.0.1, ``flowerconfig.py`` importing ``celery_agboss.flower.format_task``) watches a
real worker. A deferred, a replayed and a reconciled delivery all end ``SUCCESS`` in
Celery's terms; Flower's HTTP API tells them apart: ``DEFERRED`` while the holder runs,
and ``format_task``'s ``agboss`` outcome in the tasks table. A headless Chromium keeps a
screenshot of the tasks page under ``artifacts/``.

Deployment speed-ups it relies on: the harness's (``-Q``, a 5 s lease, no beat:
tests/integration/harness.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import requests

from celery_agboss.testing.gateway_types import FakeGatewayFault
from tests.conftest import ProcessFactory
from tests.integration.apps.shop import CONFIG_ENV
from tests.integration.gateway_http import wait_for
from tests.integration.harness import Shop, ShopFactory
from tests.operations.cli import celery_command
from tests.support.browser import ARTIFACTS, chromium, screenshot
from tests.support.processes import ManagedProcess, wait_until
from tests.support.services import in_ci
from tests.support.throwaway import free_ports

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[3]
FLOWER_CONFIG = """\
# What docs/operators.md recommends.
from celery_agboss.flower import format_task  # noqa: F401
tasks_columns = "name,uuid,state,args,result,received,runtime,worker"
"""


class Flower:
    def __init__(self, process: ManagedProcess, port: int) -> None:
        self.process = process
        self.url = f"http://127.0.0.1:{port}"

    def get(self, path: str, **params: Any) -> Any:
        response = requests.get(self.url + path, params=params or None, timeout=10)
        response.raise_for_status()
        return response.json()

    def task(self, task_id: str) -> dict[str, Any] | None:
        response = requests.get(f"{self.url}/api/task/info/{task_id}", timeout=10)
        return None if response.status_code == 404 else dict(response.json())

    def state(self, task_id: str) -> str | None:
        task = self.task(task_id)
        return None if task is None else str(task.get("state"))

    def table(self) -> dict[str, dict[str, Any]]:
        """The tasks page's own data (``format_task`` applied), by task id."""
        query = {
            "draw": 1,
            "start": 0,
            "length": 100,
            "search[value]": "",
            "order[0][column]": 0,
            "order[0][dir]": "asc",
            "columns[0][data]": "received",
        }
        data = requests.get(f"{self.url}/tasks/datatable?{urlencode(query)}", timeout=10)
        data.raise_for_status()
        return {row["uuid"]: row for row in data.json()["data"]}


def _start_flower(shop: Shop, managed_process: ProcessFactory, tmp_path: Path) -> Flower:
    config = tmp_path / "flowerconfig.py"
    config.write_text(FLOWER_CONFIG)
    (port,) = free_ports(1)
    process = managed_process(
        celery_command(
            "tests.integration.apps.shop:app",
            "flower",
            f"--port={port}",
            "--address=127.0.0.1",
            f"--conf={config}",
        ),
        name="flower",
        env={
            CONFIG_ENV: json.dumps(shop.config),
            "PYTHONPATH": str(REPO_ROOT),
            "FLOWER_UNAUTHENTICATED_API": "true",
        },
        cwd=str(REPO_ROOT),
    )
    flower = Flower(process, port)

    def answers() -> bool:
        try:
            return requests.get(flower.url + "/healthcheck", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    process.wait_until(answers, 30, message="Flower to answer")
    return flower


def _publish(shop: Shop, order: str, **options: Any) -> str:
    return str(shop.app.signature("it.charge_order", args=(order,)).apply_async(**options).id)


def test_flower_tells_a_deferred_a_replayed_and_a_reconciled_task_apart(
    shop_factory: ShopFactory, managed_process: ProcessFactory, tmp_path: Path
) -> None:
    shop = shop_factory()
    flower = _start_flower(shop, managed_process, tmp_path)
    shop.start_worker()  # with -E: events cannot be switched on without gossip

    def probe_seen() -> bool:
        probe = shop.app.signature("it.ship", args=({"payment": "p", "order": "probe"},))
        task_id = str(probe.apply_async().id)
        return bool(wait_for(lambda: flower.state(task_id) == "SUCCESS", 5, "the probe"))

    wait_for(_quietly(probe_seen), 30, "Flower to receive the worker's events")
    gateway = shop.gateway.gateway

    # Deferred: a duplicate message arrives while the first delivery is charging.
    hold = gateway.hold(operation="charge", before_processing=True)
    deferred = _publish(shop, "o-deferred")
    try:
        hold.wait_reached(timeout=20)
        shop.app.signature("it.charge_order", args=("o-deferred",)).apply_async(task_id=deferred)
        wait_for(lambda: flower.state(deferred) == "DEFERRED", 20, "DEFERRED in Flower")
    finally:
        hold.release()
    shop.wait_backend(deferred, "SUCCESS")

    # Replayed: a duplicate of a completed execution returns the stored result.
    replayed = _publish(shop, "o-replayed")
    shop.wait_backend(replayed, "SUCCESS")
    shop.app.signature("it.charge_order", args=("o-replayed",)).apply_async(task_id=replayed)

    # Reconciled: the charge's answer is lost; the retry looks it up instead of resending.
    gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP, operation="charge")
    reconciled = _publish(shop, "o-reconciled")
    shop.wait_state(reconciled, "COMPLETED", timeout=30)

    # A sweep run sends no task events: it never shows among the payments.
    sweep = str(shop.app.send_task("celery_agboss.sweep", queue=shop.config["queue"]).id)

    expected = {deferred: "DEFERRED", replayed: "REPLAYED", reconciled: "RECONCILED"}

    def outcomes() -> dict[str, Any]:
        table = flower.table()
        return {
            task_id: (table.get(task_id) or {}).get("agboss", {}).get("outcome")
            for task_id in expected
        }

    def settled() -> bool:
        # The worker's main process buffers Celery's own task events, while the pool
        # child sends ours at once: wait until Flower has seen both.
        table = flower.table()
        return outcomes() == expected and all(
            (table.get(task_id) or {}).get("state") == f"SUCCESS · {label}"
            for task_id, label in expected.items()
        )

    wait_until(
        settled,
        30,
        message=lambda: (
            f"the outcomes {expected} (are {outcomes()}; table "
            f"{json.dumps(flower.table(), default=str)[:3000]})"
        ),
    )
    table = flower.table()
    for task_id, label in expected.items():
        assert table[task_id]["state"] == f"SUCCESS · {label}"
        assert flower.state(task_id) == "SUCCESS"  # Celery's own view cannot tell them apart
    shop.wait_logged("sweep.finished")
    after = _publish(shop, "o-after-the-sweep")
    wait_for(lambda: flower.state(after) == "SUCCESS", 30, "a later task in Flower")
    assert flower.task(sweep) is None, "the sweep run is not on Flower's tasks page"
    assert len(gateway.payments) == 4
    if chromium() is not None:  # without it, the test below says what to install
        screenshot(flower.url + "/tasks", ARTIFACTS / "flower-tasks.png")


def test_flower_calls_a_crash_recovery_reconciled(
    shop_factory: ShopFactory, managed_process: ProcessFactory, tmp_path: Path
) -> None:
    """A pool child SIGKILLed while the gateway held its charge's answer; once its lease
    expired, one sweep looks the charge up (found: stored) and re-drives the execution;
    the new delivery, which took the execution over, only replays the stored charge.
    docs/operators.md promises ``SUCCESS · RECONCILED`` for it, not ``· REPLAYED`` (a
    duplicate of a finished execution, where nothing ran). Flower keeps one row per task
    id: a duplicate replayed after the recovery (the broker's redelivery of the killed
    child's message may arrive just after it) leaves the row RECONCILED."""
    shop = shop_factory()
    flower = _start_flower(shop, managed_process, tmp_path)
    shop.start_worker()  # with -E: events cannot be switched on without gossip
    task_id = shop.kill_the_child_holding_the_answer("it.charge_order", "o-crash")
    shop.wait_lease_dead(task_id)
    shop.sweep_once()  # the sweep reconciles first, then re-drives
    record = shop.wait_state(task_id, "COMPLETED", timeout=45)
    assert record.recovery_count >= 1, record

    def row() -> dict[str, Any]:
        return dict(flower.table().get(task_id) or {})

    wait_until(
        lambda: row().get("state") == "SUCCESS · RECONCILED",
        30,
        message=lambda: f"SUCCESS · RECONCILED in Flower, not {row()}",
    )
    _publish(shop, "o-crash", task_id=task_id)  # a duplicate, after the completion
    wait_until(
        lambda: row().get("agboss", {}).get("agboss_event") == "replayed",
        30,
        message=lambda: f"the duplicate's replay in Flower, not {row()}",
    )
    wait_until(
        lambda: row().get("state") == "SUCCESS · RECONCILED",
        30,
        message=lambda: f"SUCCESS · RECONCILED kept after the replay, not {row()}",
    )
    assert len(shop.gateway.gateway.payments) == 1


def test_chromium_is_installed_for_the_screenshot_of_flower() -> None:
    """The test above keeps a screenshot of the tasks page when Chromium is there."""
    if chromium() is None:
        message = (
            "chromium is not installed, so no screenshot of Flower's tasks page is "
            "kept under artifacts/: apt-get install chromium"
        )
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def _quietly(check: Any) -> Any:
    def run() -> bool:
        try:
            return bool(check())
        except AssertionError:
            return False

    return run
