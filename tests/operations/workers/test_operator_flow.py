"""An operator at work, with real workers: an unknown outcome on a gateway without lookup is
quarantined (WAITING_OPERATOR), listed by ``celery … agboss pending``, settled by
``celery … agboss resolve`` (with an audit row) and then completed by a worker — one
payment. A resolve while the intent's owner is alive is refused.

Deployment speed-ups it relies on: the harness's (``-Q``, a 5 s lease, no beat:
tests/integration/harness.py).
"""

from __future__ import annotations

import json

import pytest

from celery_agboss.cli import EXIT_REFUSED
from celery_agboss.testing.gateway_types import FakeGatewayFault
from tests.integration.gateway_http import wait_for
from tests.integration.harness import ShopFactory
from tests.operations.workers.sweeping import agboss_cli, cli_json

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]


def test_an_unknown_outcome_without_lookup_is_resolved_by_an_operator_then_completed(
    shop_factory: ShopFactory, database_url: str
) -> None:
    shop = shop_factory(database_url=database_url)
    gateway = shop.gateway.gateway
    gateway.lookup_by_key = False  # G2 missing: reconcile can only say Unknown
    gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP, operation="charge")
    shop.start_worker()
    task_id = str(shop.app.signature("it.charge_order", args=("o-1",)).apply_async().id)
    shop.wait_state(task_id, "WAITING_OPERATOR", timeout=30)
    assert len(gateway.payments) == 1  # charged, but nobody here knows it

    code, listed = cli_json(shop, "pending")
    assert code == 0
    (entry,) = listed["pending"]
    assert entry["execution_id"] == task_id and entry["needs_operator"]
    key = entry["idempotency_key"]

    receipt = gateway.payments[0]  # what the operator reads in the gateway's dashboard
    resolved = agboss_cli(
        shop,
        "resolve",
        key,
        "--completed",
        json.dumps(receipt),
        "--reason",
        "found in the dashboard",
        "--actor",
        "ops-test",
    )
    assert resolved.returncode == 0, resolved.stderr + resolved.stdout
    shop.wait_state(task_id, "COMPLETED", timeout=30)
    shop.wait_backend(task_id, "SUCCESS")
    assert shop.app.AsyncResult(task_id).result["payment"] == receipt["id"]
    assert len(gateway.payments) == 1
    assert len(gateway.requests) == 1, "the replay returned the resolved result; nothing sent"
    (audit,) = shop.agboss.executions.list_audit(key)
    assert audit.actor == "ops-test" and audit.reason == "found in the dashboard"
    assert json.loads(audit.before or "")["needs_operator"] is True


def test_resolve_is_refused_while_the_owner_is_charging(shop_factory: ShopFactory) -> None:
    shop = shop_factory()
    gateway = shop.gateway.gateway
    hold = gateway.hold(operation="charge", before_processing=True)
    shop.start_worker()
    task_id = str(shop.app.signature("it.charge_order", args=("o-1",)).apply_async().id)
    try:
        hold.wait_reached(timeout=20)
        (intent,) = wait_for(lambda: _intents(shop, task_id), 10, "the intent")
        refused = agboss_cli(
            shop, "resolve", intent.idempotency_key, "--not-sent", "--reason", "impatient"
        )
        assert refused.returncode == EXIT_REFUSED, refused.stdout + refused.stderr
        assert "live" in refused.stderr
    finally:
        hold.release()
    shop.wait_state(task_id, "COMPLETED", timeout=30)
    assert len(gateway.payments) == 1
    assert shop.agboss.executions.list_audit(intent.idempotency_key) == []


def _intents(shop: object, task_id: str) -> list[object]:
    return list(shop.agboss.executions.list_intents_of(task_id))  # type: ignore[attr-defined]
