"""A declined card, as a user deploys the README: the order fails once, nothing is paid.

README.md's ``shop.py`` from the installed wheel, its worker command, and the gateway
declining the charge (a 402: nothing was processed). The README's ``OutboundCall``
declares the decline definite (``is_definite_failure``), so the task fails with it at
once: one charge request at the gateway, no payment, no ``shop_paid_orders`` row. Before,
every error of its client was an unknown outcome, the decline was reconciled and resent
delivery after delivery, and the order never failed; and its reconcile would have taken
a decline the gateway kept under the key for the payment. Speed-ups, as the README's
``AGBOSS_<NAME>`` variables: the deployment suite's (``tests/deployment/deployment.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from celery_agboss.testing.gateway_types import FakeGatewayFault, GatewayRequestOutcome
from tests.deployment.conftest import DeployFactory
from tests.support.processes import wait_until

pytestmark = [pytest.mark.worker, pytest.mark.slow]

ORDER = 9


def test_a_declined_charge_fails_the_order_once_and_pays_nothing(
    database_url: str, redis_url_factory: Callable[[], str], deploy: DeployFactory
) -> None:
    deployment = deploy(redis_url_factory(), database_url)
    deployment.prepare()
    fake = deployment.gateway.gateway
    fake.inject_fault(FakeGatewayFault.DECLINE, operation="charge")
    worker = deployment.start_worker()
    deployment.wait_ready(worker)
    ids = deployment.publish([ORDER])
    wait_until(
        lambda: deployment.states(ids.values())[ids[ORDER]] == "FAILED",
        60,
        message=lambda: f"order {ORDER} to fail: {deployment.progress(ids)}",
    )
    requests = fake.requests_for(deployment.key_of(ORDER))
    assert [r.outcome for r in requests] == [GatewayRequestOutcome.DECLINED], requests
    assert fake.payments == []
    assert deployment.paid_rows() == {}
